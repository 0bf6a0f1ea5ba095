"""``jf-jax study FILE``: run a study (configs/studies/*.yaml): prompts -> collect -> train -> evaluate -> report.

    jf-jax study configs/studies/data_scale.yaml                     # the CPU learning curve
    jf-jax study configs/studies/data_scale.yaml --dry-run           # the commands it runs, done ones marked
    jf-jax study configs/studies/data_scale_gpu.yaml --time-limit 9  # stop cleanly after 9 minutes
    jf-jax study configs/studies/tiny.yaml --set train.sizes=[4] --only collect,train

Every stage is a ``jf-jax`` command in a process of its own, its log in RUN_DIR/logs/NAME/. Running the same
command again skips every finished stage (RUN_DIR/study-state.json) and resumes a stopped one: collection after
its last complete shard, training from its last checkpoint. The study file is checked whole before any stage
runs. Exit status: 0 done, 1 a stage failed, 2 the study or the command line is wrong, 3 stopped at the time
limit, 130 interrupted.
"""

from __future__ import annotations

import argparse
import math
import sys

from jf_jax.pipeline.checks import arm_configs, check_inputs
from jf_jax.pipeline.phases import run_study, show_plan
from jf_jax.pipeline.plan import PHASES
from jf_jax.pipeline.spec import StudyError, read_study


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jf-jax study", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("study", help="a study file (configs/studies/*.yaml)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="change one key of the study (dotted, the value as YAML), e.g. train.sizes=[250,500] or "
                        "collect.workers=2; repeatable")
    p.add_argument("--only", metavar="PHASES", help=f"comma list of the phases to run, of {','.join(PHASES)}")
    p.add_argument("--time-limit", type=float, metavar="MINUTES",
                   help="stop after this long: no stage starts after it, a running one is stopped (it resumes next "
                        "time), and training stops itself a minute before it, checkpointed")
    p.add_argument("--dry-run", action="store_true", help="print the commands, the finished ones marked; run nothing")
    return p


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    phases = PHASES if args.only is None else tuple(args.only.split(","))
    unknown = [ph for ph in phases if ph not in PHASES]
    if unknown:
        p.error(f"--only: unknown phase {unknown[0]!r}; the phases are {', '.join(PHASES)}")
    if args.time_limit is not None and not (math.isfinite(args.time_limit) and args.time_limit > 0):
        p.error(f"--time-limit must be a positive number of minutes, got {args.time_limit}")
    try:
        study = read_study(args.study, tuple(args.sets))
        notes = check_inputs(study, dry_run=args.dry_run)
        configs = arm_configs(study)
    except StudyError as e:
        print(f"jf-jax study: error: {args.study}: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        return show_plan(study, configs, phases, notes)
    try:
        return run_study(study, configs, phases, args.time_limit)
    except (RuntimeError, OSError) as e:  # the run directory is locked or cannot be written
        print(f"jf-jax study: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

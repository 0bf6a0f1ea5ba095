"""``jf-jax plan`` (``python -m jf_jax.plan``): before renting accelerators, whether a Jacobi Forcing run fits and
what it costs, from the real train and decode programs compiled at the target's shapes with abstract inputs.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m jf_jax.plan --model qwen2.5-7b \\
        --mesh fsdp=8 --target h200 --json plan.json

The mesh's devices are this process's (on a CPU, simulated by the flag above); no weight is loaded or allocated.
Prints per-device memory against the target's HBM, collectives, roofline times and a round's chip-hours
(docs/plan.md says how to read them); exits 1 when a program does not fit, 2 on a bad request. The programs and
the figures are ``jf_jax.tuning.plan`` and ``jf_jax.tuning.plan_report``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from jf_jax.cli.mesh import MeshSpec, parse_mesh
from jf_jax.cli.plan_text import report_lines
from jf_jax.model.config import PUBLISHED_SHAPES, ModelConfig, from_hf_config
from jf_jax.model.params import abstract_params, count_params
from jf_jax.tuning import plan, plan_report
from jf_jax.tuning.roofline import TARGETS


def model_shape(spec: str) -> ModelConfig:
    """A built-in published shape (``PUBLISHED_SHAPES``), else the config of a model ``jf_jax.weights`` reads (a HF
    directory or its config.json, a training run directory, a .gguf file's metadata), without its weights."""
    if spec in PUBLISHED_SHAPES:
        return from_hf_config(PUBLISHED_SHAPES[spec])
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".json":
        return from_hf_config(json.loads(path.read_text()))
    from jf_jax import weights

    return weights.read_config(spec)  # a WeightsError (ValueError) names what it accepts


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jf-jax plan", description="Whether a Jacobi Forcing run fits a TPU or GPU slice "
                                "and what it costs, from its programs compiled with abstract inputs (docs/plan.md).",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="qwen2.5-7b",
                   help=f"{', '.join(PUBLISHED_SHAPES)}, or a HF directory / config.json / run directory / .gguf")
    p.add_argument("--mesh", type=parse_mesh, default=MeshSpec(),
                   help="the train step's mesh: data=D,fsdp=F,tensor=T (unnamed axes are 1)")
    p.add_argument("--decode-mesh", type=parse_mesh, help="the decode steps' mesh (None: --mesh)")
    p.add_argument("--target", choices=tuple(TARGETS), default="h200", help="the accelerator (docs/plan.md)")
    p.add_argument("--efficiency", type=float, default=0.4, help="assumed MFU of the train step's matmuls")
    t = p.add_argument_group("training (configs/recipe.yaml's loss; AdamW with float32 state, bfloat16 compute)")
    t.add_argument("--seq-len", type=int, default=2048, help="tokens per packed row")
    t.add_argument("--batch", type=int, default=8, help="rows (sequences) per step")
    t.add_argument("--prompt-len", type=int, default=256, help="prompt tokens of a row (the rest: noisy/clean blocks)")
    t.add_argument("--teacher-len", type=int, help="tokens the reference runs over per row (default: prompt + clean)")
    t.add_argument("--remat", action=argparse.BooleanOptionalAction, default=True, help="recompute each layer")
    t.add_argument("--teacher", choices=("reference", "data"), default="reference",
                   help="the AR term: KL from a frozen bf16 reference, or cross-entropy on the data")
    t.add_argument("--grad-accum", type=int, default=1)
    d = p.add_argument_group("decoding (bfloat16 weights)")
    d.add_argument("--decode-batch", type=int, default=8, help="rows decoded together")
    d.add_argument("--context", type=int, default=1024, help="committed KV slots before the step")
    d.add_argument("--block-size", type=int, default=16, help="tokens of the Jacobi forward")
    r = p.add_argument_group("a round of training data")
    r.add_argument("--round-prompts", type=int, default=450_000)
    r.add_argument("--response-tokens", type=int, help="tokens collected per prompt (default: (seq-len - prompt) / 2)")
    r.add_argument("--collect-tpf", type=float, default=1.0, help="tokens per Jacobi forward while collecting")
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--skip-decode", action="store_true")
    p.add_argument("--json", type=Path, help="write the whole plan here")
    return p


def mesh_shape(spec: MeshSpec) -> plan.MeshShape:
    return plan.MeshShape(data=spec.data, fsdp=spec.fsdp, tensor=spec.tensor)


def settings(args):
    train = None if args.skip_train else plan.TrainShape(
        seq_len=args.seq_len, batch=args.batch, prompt_len=args.prompt_len, teacher_len=args.teacher_len,
        remat=args.remat, teacher=args.teacher, grad_accum=args.grad_accum)
    decode = None if args.skip_decode else plan.DecodeShape(batch=args.decode_batch, context=args.context,
                                                            block_size=args.block_size)
    rnd = plan_report.RoundShape(prompts=args.round_prompts, response_tokens=args.response_tokens,
                                 collect_tpf=args.collect_tpf)
    return train, decode, rnd


def check(args, cfg: ModelConfig) -> str | None:
    if args.skip_train and args.skip_decode:
        return "--skip-train and --skip-decode leave nothing to plan"
    if not 0 < args.efficiency <= 1 or args.collect_tpf <= 0 or args.round_prompts < 1:
        return "--efficiency must be in (0, 1], --collect-tpf and --round-prompts positive"
    train, decode, _ = settings(args)
    decode_mesh = mesh_shape(args.decode_mesh or args.mesh)
    problem = plan.plan_problem(cfg, mesh_shape(args.mesh), train, decode_mesh, decode)
    return problem or plan.devices_problem(mesh_shape(args.mesh), decode_mesh)


def run(args, cfg: ModelConfig) -> dict:
    device = TARGETS[args.target]
    train, decode, rnd = settings(args)
    mesh, decode_mesh = mesh_shape(args.mesh), mesh_shape(args.decode_mesh or args.mesh)
    out = dict(version=1, command=" ".join(["jf-jax plan", *args.argv]), model=args.model, model_config=cfg.to_dict(),
               parameters=count_params(abstract_params(cfg)), mesh=str(mesh),
               decode_mesh=str(decode_mesh), target=dict(dataclasses.asdict(device), key=args.target),
               efficiency=args.efficiency, train=None, decode=None,
               memory_note="per-device memory is XLA:CPU's buffer assignment at the target's shapes; XLA:CPU's "
                           f"temporaries were {plan_report.CPU_TEMP_RATIO:.2f}x an H200's for the 7B train step "
                           "(results/studies/gpu_h200_7b/)")
    if train is not None:
        out["train_settings"] = dataclasses.asdict(train) | dict(teacher_tokens=train.teacher_tokens)
        program = plan.compile_train(cfg, mesh, train)
        out["train"] = plan_report.train_report(cfg, mesh, train, program, device, args.efficiency)
    if decode is not None:
        out["decode_settings"] = dataclasses.asdict(decode)
        jacobi = plan.compile_decode(cfg, decode_mesh, decode, decode.block_size)
        ar = jacobi if decode.block_size == 1 else plan.compile_decode(cfg, decode_mesh, decode, 1)
        out["decode"] = plan_report.decode_report(cfg, decode_mesh, decode, jacobi, ar, device)
    out["round"] = plan_report.round_report(train or plan.TrainShape(), mesh, decode or plan.DecodeShape(),
                                            decode_mesh, rnd, out["train"], out["decode"])
    out["fits"] = all(out[k] is None or out[k]["verdict"] != plan_report.NO_FIT for k in ("train", "decode"))
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    try:
        cfg = model_shape(args.model)
        problem = check(args, cfg)
    except (ValueError, OSError) as e:  # our errors are ValueErrors naming the problem
        problem = str(e).splitlines()[0]
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    report = run(args, cfg)
    print("\n".join(report_lines(report)))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=str))
        print(f"wrote {args.json}", file=sys.stderr)
    if not report["fits"]:
        reasons = [f"{k}: {report[k]['reason']}" for k in ("train", "decode")
                   if report[k] is not None and report[k]["verdict"] == plan_report.NO_FIT]
        print(f"does not fit: {'; '.join(reasons)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

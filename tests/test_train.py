"""Training: loss decreases, exact resume, NaN stop, config strictness, sharded == single device."""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from jf_jax.weights import run_dir as rd
from jf_jax.training import loop as train_loop
from jf_jax.training import setup as train_setup
from jf_jax.training.losses import loss_fn
from jf_jax.training.config import ConfigKeyError, config_from_dict, load_config
from jf_jax.training.loop import NonFiniteLossError, run_training

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_YAML = os.path.join(ROOT, "configs", "tiny.yaml")
# Short runs of the tiny config: 8 sequences in 2 batches per epoch, 12 steps, checkpoints every 3 (keep 2).
SHORT = ["train.steps=12", "train.ckpt_every=3", "train.keep_checkpoints=2", "data.synthetic.num_prompts=8",
         "optim.learning_rate=1e-2", "optim.warmup_steps=0"]


def test_config_files_load_and_reject_unknown_keys():
    cfg = load_config(TINY_YAML, ["optim.learning_rate=1e-4", "data.buckets=[32,64]", "loss.mask=clean_context"])
    assert cfg.optim.learning_rate == 1e-4 and cfg.data.buckets == (32, 64) and cfg.loss.mask == "clean_context"
    assert load_config(os.path.join(ROOT, "configs", "smollm2_jf.yaml")).data.block_size == 8
    with pytest.raises(ConfigKeyError, match="'data.bukets'"):
        load_config(TINY_YAML, ["data.bukets=[1]"])
    with pytest.raises(ConfigKeyError, match="'optim.lr'"):
        config_from_dict({**load_config(TINY_YAML).to_dict(), "optim": {"lr": 1.0}})
    with pytest.raises(ConfigKeyError, match="train.steps must be an integer"):
        load_config(TINY_YAML, ["train.steps=many"])
    with pytest.raises(ConfigKeyError, match="data.schedule"):
        load_config(TINY_YAML, ["data.schedule=cosine"])


def test_data_path_list_concatenates_trajectory_directories(tmp_path):
    from jf_jax.training.synthetic import SyntheticRecorder, make_prompts
    from jf_jax.training.trajectories import collect

    prompts = make_prompts(6, 8, 64, seed=3)
    recorder = SyntheticRecorder(4, 3, 64)
    dirs = [str(tmp_path / name) for name in ("all", "w0", "w1")]
    for out, part in zip(dirs, (prompts, prompts[:4], prompts[4:])):
        collect(part, recorder, out, block_size=4, progress=False)

    def stream(*overrides):
        tcfg = load_config(TINY_YAML, ["data.source=trajectories", *overrides])
        return train_setup.build_stream(tcfg, str(tmp_path / "run"), 64, False)

    whole = stream(f"data.path={dirs[0]}").sequences
    split = stream(f"data.path=[{dirs[1]},{dirs[2]}]").sequences  # two parallel collection workers
    assert len(whole) == len(split) == 6
    for a, b in zip(whole, split):
        np.testing.assert_array_equal(a.tokens, b.tokens)
    with pytest.raises(ConfigKeyError, match="holds blocks of 4"):
        stream(f"data.path=[{dirs[1]},{dirs[2]}]", "data.block_size=8", "data.window=8")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run = str(tmp_path_factory.mktemp("runs") / "full")
    return run, run_training(load_config(TINY_YAML, SHORT), run, progress=False)


def _metrics_lines(run):
    with open(os.path.join(run, rd.METRICS_FILE)) as f:
        return [json.loads(ln) for ln in f]


def test_loss_decreases_on_a_fixed_batch(uninterrupted):
    run, result = uninterrupted
    tcfg = load_config(TINY_YAML, SHORT)
    cfg = train_setup.model_config(tcfg)
    fixed = {k: jnp.asarray(v) for k, v in train_setup.build_stream(tcfg, run, cfg.vocab_size, False).batch(0).items()}
    loss = jax.jit(loss_fn, static_argnums=(1, 3))
    before, _ = loss(train_setup.initial_params(tcfg, cfg), cfg, fixed, tcfg.loss)
    after, metrics = loss(rd.load_run(run)[1], cfg, fixed, tcfg.loss)
    assert float(after) < 0.6 * float(before), (before, after)
    assert float(metrics["loss/consistency"]) > 0
    assert result.metrics[12]["loss/ar"] < 0.6 * result.metrics[1]["loss/ar"]
    assert os.path.exists(os.path.join(run, rd.LOSS_CURVE_FILE))
    assert os.path.getsize(os.path.join(run, rd.TENSORBOARD_DIR, "events.out.tfevents.0.jf_jax")) > 12 * 16


def test_killed_run_resumes_exactly(uninterrupted, tmp_path):
    full_dir, full = uninterrupted
    run = str(tmp_path / "killed")
    tcfg = load_config(TINY_YAML, SHORT)

    def kill_at_8(step, metrics):
        if step == 8:
            raise KeyboardInterrupt  # dies after step 8; the newest checkpoint is step 6

    with pytest.raises(KeyboardInterrupt):
        run_training(tcfg, run, progress=False, on_step=kill_at_8)
    resumed = run_training(tcfg, run, progress=False)
    assert sorted(resumed.metrics) == list(range(7, 13))  # restarted from the step-6 checkpoint
    for step, m in resumed.metrics.items():
        assert m == full.metrics[step], step  # bit-identical losses, grad norms, lr
    assert _metrics_lines(run) == _metrics_lines(full_dir)  # lines 7-8 of the killed run were replaced
    assert sorted(os.listdir(os.path.join(run, rd.CHECKPOINT_DIR)), key=int) == ["9", "12"]  # keep-2
    cfg_a, params_a = rd.load_run(full_dir)
    cfg_b, params_b = rd.load_run(run)
    assert cfg_a == cfg_b
    jax.tree.map(np.testing.assert_array_equal, params_a, params_b)
    with pytest.raises(ConfigKeyError, match="different config"):
        run_training(load_config(TINY_YAML, SHORT + ["optim.learning_rate=1.0"]), run, progress=False)
    # A snapshot written before a config field existed resumes as if it held the field's default.
    with open(os.path.join(run, rd.CONFIG_FILE)) as f:
        snapshot = yaml.safe_load(f)
    del snapshot["loss"]["teacher_tokens"], snapshot["loss"]["ar_reference"]
    with open(os.path.join(run, rd.CONFIG_FILE), "w") as f:
        yaml.safe_dump(snapshot, f)
    assert run_training(tcfg, run, progress=False).step == 12


def test_time_budget_stops_checkpoints_and_resumes(uninterrupted, tmp_path):
    full_dir, full = uninterrupted
    tcfg = load_config(TINY_YAML, SHORT)
    run = str(tmp_path / "budget")
    # A zero budget is spent after the first step: it is checkpointed (off the every-3 grid) and exported.
    stopped = run_training(tcfg, run, progress=False, stop_after_s=0.0, export_on_stop=True)
    assert stopped.step == 1 and sorted(stopped.metrics) == [1]
    assert os.listdir(os.path.join(run, rd.CHECKPOINT_DIR)) == ["1"]
    _, params_1 = rd.load_run(run)
    assert not all(jax.tree.leaves(jax.tree.map(np.array_equal, params_1, rd.load_run(full_dir)[1])))
    resumed = run_training(tcfg, run, progress=False)  # the same run, no budget: continues from step 1
    assert sorted(resumed.metrics) == list(range(2, 13))
    for step, m in resumed.metrics.items():
        assert m == full.metrics[step], step
    jax.tree.map(np.testing.assert_array_equal, rd.load_run(run)[1], rd.load_run(full_dir)[1])
    # Without export_on_stop an early stop leaves no params/ behind (a run that never finished).
    other = str(tmp_path / "no_export")
    run_training(tcfg, other, progress=False, stop_after_s=0.0)
    with pytest.raises(FileNotFoundError, match="did the run finish"):
        rd.load_run(other)


def test_nan_stops_and_keeps_the_last_good_checkpoint(uninterrupted, tmp_path, monkeypatch):
    full_dir, full = uninterrupted
    real = train_loop.make_train_step

    def poisoned(*args, **kwargs):
        step_fn = real(*args, **kwargs)

        def step(state, batch):
            state, metrics = step_fn(state, batch)
            if int(state.step) == 8:  # step 8 blows up: NaN params and loss, as after a real divergence
                state = dataclasses.replace(state, params=jax.tree.map(lambda x: x * jnp.nan, state.params))
                metrics = {**metrics, "loss/total": jnp.float32(jnp.nan)}
            return state, metrics

        return step

    monkeypatch.setattr(train_loop, "make_train_step", poisoned)
    run = str(tmp_path / "nan")
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss at step 8 .*Last good checkpoint: step 6"):
        run_training(load_config(TINY_YAML, SHORT), run, progress=False)
    assert sorted(os.listdir(os.path.join(run, rd.CHECKPOINT_DIR)), key=int) == ["3", "6"]
    assert [m["step"] for m in _metrics_lines(run)] == list(range(1, 8))
    monkeypatch.setattr(train_loop, "make_train_step", real)
    resumed = run_training(load_config(TINY_YAML, SHORT), run, progress=False, stop_at_step=8)
    assert resumed.metrics[7] == full.metrics[7]  # the step-6 checkpoint is the good state
    assert resumed.metrics[8] == full.metrics[8]


@pytest.mark.slow  # a subprocess that compiles the step on 8 simulated devices
def test_sharded_steps_on_8_devices_equal_single_device():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "tests.support.sharded_step_check"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["devices"] == 8 and set(report["meshes"]) == {"2x4x1", "2x2x2", "1x4x2", "4x1x2"}
    for name, r in report["meshes"].items():
        assert "fsdp" in r["specs"]["wq"] or r["mesh"]["fsdp"] == 1, (name, r["specs"])  # FSDP shards parameters
        if r["mesh"]["tensor"] > 1:  # heads, KV heads, MLP units and the vocabulary split over tensor
            assert all("tensor" in spec for spec in r["specs"].values()) and "tensor" in r["lm_head_spec"], r
        # Losses and gradient norms agree to float rounding. Parameters after two AdamW steps (lr 1e-2) agree to
        # 1e-4: Adam turns rounding noise in near-zero gradients into sign-like updates; a real sharding bug
        # (lost rows, missing reduction) moves parameters by ~lr and changes the losses.
        assert r["max_param_diff"] < 1e-4, (name, r)
        for key, value in r["metrics_diff"].items():
            assert value < 1e-5, (name, key, value)


def test_step_log_reports_the_first_step_then_rates(monkeypatch, capsys):
    """``python -m jf_jax.train --no-progress``: the first step's time (compilation), then a line every log period."""
    from jf_jax.cli import train as train_cli

    clock = iter([0.0, 30.0, 40.0, 95.0, 100.0])  # construction, then steps 1-4 ending at these times
    monkeypatch.setattr(train_cli.time, "monotonic", lambda: next(clock))
    log = train_cli._StepLog(total=4, every_s=60.0)
    for step in (1, 2, 3, 4):
        log(step, {"loss/total": 1.0 / step})
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3, lines  # step 2 (10 s after the first line) is not logged
    assert "step 1/4" in lines[0] and "first step in 30.0s" in lines[0]
    assert "step 3/4" in lines[1] and "0.03 steps/s" in lines[1]  # 2 steps in 65 s after the first
    assert "step 4/4" in lines[2] and "loss/total 0.2500" in lines[2]  # the last step is always logged


def _mixed_length_data(tmp_path) -> list[str]:
    """Overrides training on 32 synthetic responses: 30 of 3 blocks (32 tokens packed), 2 of 4 blocks (40 tokens),
    with one length bucket of 32 tokens: the two long ones (6.25%) do not fit."""
    from jf_jax.training.synthetic import SyntheticRecorder, make_prompts
    from jf_jax.training.trajectories import collect

    dirs = []
    for name, count, blocks, seed in (("short", 30, 3, 0), ("long", 2, 4, 1)):
        dirs.append(str(tmp_path / name))
        collect(make_prompts(count, 8, 64, seed=seed), SyntheticRecorder(4, blocks, 64), dirs[-1], block_size=4,
                progress=False)
    return ["data.source=trajectories", f"data.path=[{dirs[0]},{dirs[1]}]", "data.buckets=[32]", "train.steps=2",
            "train.ckpt_every=2"]


def test_too_long_sequences_are_reported_and_refused_above_their_share(tmp_path, monkeypatch, capsys):
    from jf_jax.cli import train as train_cli

    data = _mixed_length_data(tmp_path)
    real = train_loop.make_train_step

    def no_step(*args, **kwargs):
        raise AssertionError("refused data must stop the run before the train step is built")

    monkeypatch.setattr(train_loop, "make_train_step", no_step)
    run = str(tmp_path / "run")
    with pytest.raises(train_setup.DroppedSequencesError) as refused:
        run_training(load_config(TINY_YAML, data), run, progress=False)  # default data.max_dropped_share: 1%
    message = str(refused.value)
    assert f"2 of 32 training sequences ({2 / 32:.1%})" in message
    assert "largest length bucket, 32 tokens" in message and "the longest sequence has 40 tokens" in message
    assert "data.buckets=[32, 40]" in message and "raise data.max_dropped_share" in message
    assert not os.path.exists(os.path.join(run, rd.CHECKPOINT_DIR))
    assert not os.path.exists(os.path.join(run, rd.CONFIG_FILE))  # so the run can start again with other data keys
    assert train_cli.main([TINY_YAML, "--run-dir", run, "--no-progress", *data]) == 2  # one line, no traceback
    err = capsys.readouterr().err
    assert err.startswith("error: 2 of 32 training sequences") and len(err.splitlines()) == 1, err

    monkeypatch.setattr(train_loop, "make_train_step", real)
    allowed = load_config(TINY_YAML, data + ["data.max_dropped_share=0.1"])
    result = run_training(allowed, run, progress=False)
    assert (result.step, result.num_sequences, result.num_dropped) == (2, 30, 2)
    assert (f"30 training sequences; 2 ({2 / 32:.1%}) longer than the largest length bucket (32 tokens) left out"
            in capsys.readouterr().out)
    # The share changes nothing a run computes: resuming with another one is allowed (and recorded), other keys not.
    assert run_training(load_config(TINY_YAML, data + ["data.max_dropped_share=0.5"]), run, progress=False).step == 2
    assert load_config(os.path.join(run, rd.CONFIG_FILE)).data.max_dropped_share == 0.5
    with pytest.raises(ConfigKeyError, match="different config"):
        run_training(load_config(TINY_YAML, data + ["data.buckets=[32,40]"]), run, progress=False)


def test_train_cli_refuses_an_unwritable_run_dir_before_any_work(tmp_path, monkeypatch, capsys):
    from jf_jax.cli import train as train_cli

    def no_training(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(train_cli, "run_training", no_training)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory\n")
    run = str(blocker / "runs" / "tiny")
    assert train_cli.main([TINY_YAML, "--run-dir", run]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: cannot write the run directory {run}: {blocker} is not a directory"]
    assert train_cli.main([TINY_YAML, "--run-dir", str(blocker)]) == 2  # the run dir itself is a file
    assert f"{blocker} is not a directory" in capsys.readouterr().err

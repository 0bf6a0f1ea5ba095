"""The hardware-aware tuner: analytic roofline knees, the measured curve, the argmax choice, and the whole
measure -> fit -> choose -> write pipeline on a tiny random model (small grids, so it stays fast)."""

import dataclasses
import json
import math
import pathlib
import types

import jax
import numpy as np
import pytest

from jf_jax import api
from jf_jax.cli import tune as tune_cli
from jf_jax.tuning import measure, roofline, tuner
from jf_jax.model.config import QWEN2P5_7B_HF_CONFIG, ModelConfig, from_hf_config
from jf_jax.model.params import abstract_params

QWEN = roofline.ModelCost.from_config(from_hf_config(QWEN2P5_7B_HF_CONFIG), "qwen2.5-7b")


@pytest.mark.parametrize("name", list(roofline.GPUS))
def test_analytic_knee_is_the_ridge_point(name):
    dev = roofline.GPUS[name]
    weights_only = dataclasses.replace(QWEN, kv_width=0, attn_width=0)  # 2 FLOPs per streamed bf16 weight
    assert roofline.knee(weights_only, dev) == pytest.approx(dev.peak_flops / dev.bandwidth, rel=1e-6)
    knee = roofline.knee(QWEN, dev, context=0)  # KV writes and attention among the t tokens: ~the same
    assert knee == pytest.approx(dev.ridge, rel=0.01)
    flat = roofline.latency(QWEN, dev, [1, knee / 2])
    assert flat[1] / flat[0] < 1.01  # memory-bound: half the knee costs what one token costs
    steep = roofline.latency(QWEN, dev, [knee, 4 * knee])
    assert steep[1] / steep[0] > 3.5  # compute-bound: linear in tokens
    # A KV context adds bytes (and attention FLOPs): the knee moves, but stays near the ridge.
    assert roofline.knee(QWEN, dev, context=1024) == pytest.approx(dev.ridge, rel=0.1)


def test_ridge_points_and_bounds_match_targets():
    # Qwen2.5-7B, bf16: ~14.1 GB streamed per token; ridges ~150 / 295 / 206 / 281; AR bounds ~144 / 237 / 339 / 566.
    assert QWEN.weight_bytes("bfloat16") == pytest.approx(14.1e9, rel=0.01)
    for name, ridge, bound in (("A100", 150, 144), ("H100", 295, 237), ("H200", 206, 339), ("B200", 281, 566)):
        dev = roofline.GPUS[name]
        assert dev.ridge == pytest.approx(ridge, rel=0.03)
        assert QWEN.weight_bytes("bfloat16") / dev.bandwidth == pytest.approx(1 / bound, rel=0.02)


def test_measured_curve_interpolates_and_extends_linearly():
    curve = roofline.MeasuredCurve((1, 4, 16), (0.010, 0.012, 0.040))
    assert curve([1, 4, 16]) == pytest.approx([0.010, 0.012, 0.040])
    assert float(curve([0.5])[0]) == pytest.approx(0.010)
    slope = (0.040 - 0.012) / 12
    assert float(curve([32])[0]) == pytest.approx(0.040 + 16 * slope)
    assert 4 < float(curve([8])[0]) * 1000 < 40
    assert roofline.measured_knee(curve) == 16
    with pytest.raises(ValueError):
        roofline.MeasuredCurve((4, 1), (0.1, 0.2))


def _cell(n, p, tpf, rounds=0):
    forwards = 100
    return measure.TPFCell(block_size=n, pool_size=p, num_blocks=1, tokens=int(round(tpf * forwards)),
                         forwards=forwards, recycling_rounds=rounds, lossless=True)


def test_a_measured_gpu_keeps_its_measured_choice():
    # On an H100 the analytic H100 entry used to overwrite the measured one under the same key (seen on the first
    # lent H100: tuned.json said "analytic" for the machine it had just measured).
    curve = roofline.MeasuredCurve((1, 16, 64), (0.003, 0.003, 0.006))  # flat to 16 tokens, as measured there
    cells = [_cell(8, 1, 1.5), _cell(16, 1, 2.0)]
    report = tuner.analyse("tiny", TINY, curve, cells, block_sizes=(8, 16), pool_sizes=(1,), context=128,
                           measured_device="H100", dtype="bfloat16")
    devices = report["devices"]
    assert devices["H100"]["latency_model"] == "measured"
    assert devices["H100 (analytic)"]["latency_model"] == "analytic"
    assert devices["H100"]["predicted_ar_tokens_per_second"] == pytest.approx(1 / 0.003)
    assert {"A100", "H200", "B200"} <= devices.keys() and "cpu" not in devices


def test_choice_is_the_argmax_of_the_predicted_surface():
    ns, ps = (4, 8, 16, 32), (1, 2, 4)
    rng = np.random.default_rng(0)
    cells = [_cell(n, p, 1 + rng.random() * n / 8, rounds=rng.integers(0, 100)) for n in ns for p in ps]
    latency = lambda t: np.maximum(1.0, np.asarray(t, float) / 16)  # noqa: E731  knee at 16 tokens
    surface = tuner.predict_surface(latency, cells, ns, ps)
    brute = {}
    for c in cells:
        f = c.recycle_fraction if c.pool_size > 1 else 0.0
        cost = (1 - f) * max(1, c.block_size / 16) + f * max(1, c.block_size * c.pool_size / 16)
        brute[(c.block_size, c.pool_size)] = c.tpf / cost
    assert surface[ns.index(8), ps.index(2)] == pytest.approx(brute[(8, 2)])
    assert tuner.choose(surface, ns, ps) == max(brute, key=brute.get)
    choice = tuner.device_choice(latency, cells, ns, ps, "test")
    assert (choice["block_size"], choice["pool_size"]) == max(brute, key=brute.get)
    assert choice["predicted_tokens_per_second"] == pytest.approx(max(brute.values()))
    # Past the knee a bigger block must pay for itself: equal TPF everywhere -> the cheapest forward wins.
    flat = [_cell(n, p, 1.0, rounds=100) for n in ns for p in ps]
    assert tuner.choose(tuner.predict_surface(latency, flat, ns, ps), ns, ps) == (4, 1)


TINY = ModelConfig(architecture="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                   num_heads=2, num_kv_heads=1, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-6,
                   max_position_embeddings=512, attention_bias=False, tie_word_embeddings=True)


def _tiny_model():
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: (rng.standard_normal(s.shape) * (3.0 if len(s.shape) == 2 else 0.2)).astype(
        np.float32), abstract_params(TINY))
    tokenizer = types.SimpleNamespace(encode=lambda text: [ord(c) % 64 for c in text], eos_ids=(),
                                      apply_chat_template=lambda text, add_generation_prompt=True: text)
    return types.SimpleNamespace(name="tiny", cfg=TINY, params=params, tokenizer=tokenizer)


@pytest.mark.slow  # the whole measure -> choose -> plot pipeline
def test_pipeline_on_a_tiny_model_writes_json_and_plots(tmp_path):
    model = _tiny_model()
    # Each grid cell compiles its own decoder (the cost of this test): keep the grids tiny.
    prompts = api.encode_prompts(model, ["abcabcabc", "hello there"], chat=False)
    report = tuner.tune(model, prompts, out_dir=tmp_path, chat=False, latency_sizes=(1, 4),
                        repeats=2, context=16, block_sizes=(2,), pool_sizes=(1, 2), max_new_tokens=8)
    saved = json.loads((tmp_path / tuner.JSON_NAME).read_text())
    assert saved["devices"].keys() == report["devices"].keys() == {"cpu", "A100", "H100", "H200", "B200"}
    assert saved["latency"]["measured"]["tokens"] == [1, 4]
    assert all(s > 0 for s in saved["latency"]["measured"]["seconds"])
    assert len(saved["tpf"]) == 2 and all(c["lossless"] for c in saved["tpf"])
    # 2 prompts x 8 tokens; at least one token per forward after the prefill, at most n per forward.
    assert all(c["tokens"] == 16 and 16 / 18 <= c["tpf"] <= 2 for c in saved["tpf"])
    assert [c.to_json() for c in measure.cells_from_report(saved)] == saved["tpf"]  # what --tpf-from reuses
    for model_devices in [saved["devices"]] + [r["devices"] for r in saved["reference_models"].values()]:
        for choice in model_devices.values():
            surface = np.array(choice["surface"], float)
            i, j = np.unravel_index(np.argmax(surface), surface.shape)
            assert (choice["block_size"], choice["pool_size"]) == ((2,)[i], (1, 2)[j])
            assert choice["predicted_tokens_per_second"] == pytest.approx(surface.max())
    for knee, dev in zip([saved["reference_models"]["qwen2.5-7b"]["devices"][d]["knee_tokens"] for d in roofline.GPUS],
                         roofline.GPUS.values()):
        assert knee == pytest.approx(dev.ridge, rel=0.1)
    for png in ("latency.png", "tokens_per_second.png"):
        data = (tmp_path / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000

    # The decode CLI reads the choice back for this device ("cpu" here).
    assert tuner.current_device() == "cpu"

    assert tuner.resolve_tuned("tuned", "tuned", tmp_path) == (saved["devices"]["cpu"]["block_size"],
                                                               saved["devices"]["cpu"]["pool_size"])
    assert tuner.resolve_tuned("tuned", 3, tmp_path) == (saved["devices"]["cpu"]["block_size"], 3)
    assert tuner.resolve_tuned(8, 2, tmp_path / "missing") == (8, 2)  # nothing tuned: nothing read
    with pytest.raises(ValueError, match="no tuned configuration"):
        tuner.resolve_tuned("tuned", None, tmp_path / "missing")


def test_the_tuners_default_directory_is_the_users_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("JF_JAX_CACHE", str(tmp_path))
    assert tuner.default_dir() == tmp_path / "tune"
    monkeypatch.delenv("JF_JAX_CACHE")
    assert tuner.default_dir() == pathlib.Path.home() / ".cache" / "jf_jax" / "tune"


def test_cli_rejects_a_bad_block_size():
    from jf_jax.cli.decode import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--block-size", "big"])
    assert build_parser().parse_args(["--block-size", "8"]).block_size == 8
    assert math.isinf(roofline.measured_knee(roofline.MeasuredCurve((1, 2), (1.0, 1.1))))


def test_tune_takes_token_ids_not_text(tmp_path):
    with pytest.raises(TypeError, match="token-id prompts"):
        tuner.tune(_tiny_model(), ["abc"], out_dir=tmp_path)
    assert not (tmp_path / tuner.JSON_NAME).exists()


def test_tune_refuses_an_over_long_prompt_before_measuring(tmp_path, monkeypatch):
    model = _tiny_model()
    measured = []
    monkeypatch.setattr(tuner, "measure_latency", lambda *a, **k: measured.append(1))
    too_long = [[1] * (model.cfg.max_position_embeddings - 4)]
    with pytest.raises(ValueError, match="exceeds the model context"):
        tuner.tune(model, too_long, out_dir=tmp_path, max_new_tokens=8)
    assert not measured and not (tmp_path / tuner.JSON_NAME).exists()


@pytest.mark.parametrize("entry", ["tune", "decode"])
def test_tune_cli_reports_bad_input_in_one_line(entry, tmp_path, capsys):
    from jf_jax.cli import decode

    missing = str(tmp_path / "missing.jsonl")
    argv = ["--prompts", missing, "--tune-out", str(tmp_path)]
    code = tune_cli.main(argv) if entry == "tune" else decode.main(["--tune"] + argv)
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == f"error: prompts file {missing} does not exist"


def test_tune_cli_checks_tpf_from_and_grid_lists(tmp_path, capsys):
    not_a_report = tmp_path / "other.json"
    not_a_report.write_text("{}")
    assert tune_cli.main(["--tpf-from", str(not_a_report), "--tune-out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {not_a_report} is not a tuner report (no TPF grid)"
    with pytest.raises(SystemExit):
        tune_cli.build_parser().parse_args(["--block-sizes", "4,eight"])
    assert tune_cli.build_parser().parse_args(["--block-sizes", "4, 8,"]).block_sizes == (4, 8)

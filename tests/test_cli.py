"""The ``python -m jf_jax.decode`` contract on a tiny GGUF model: JSON schema, prompt files, clear errors."""

import json
import os
import subprocess
import sys

import pytest

from jf_jax.cli import decode
from jf_jax.decoding.common import MAX_BATCH_SIZE, MAX_SEED
from jf_jax.decoding.multiblock import MAX_NUM_BLOCKS, MAX_POOL_SIZE
from jf_jax.decoding.runner import MAX_BLOCK_SIZE
from jf_jax.model import machine
from jf_jax.weights import store

RUN_KEYS = {"method", "prompt_index", "prompt", "token_ids", "text", "new_tokens", "forwards", "batch_size", "seconds",
            "prefill_seconds"}
SUMMARY_KEYS = {"tpf", "mean_tpf", "tokens_per_second", "tokens_per_second_excl_prefill", "speedup_vs_ar"}


@pytest.fixture(autouse=True)
def _isolated_cache(weight_cache):
    return weight_cache


def test_json_report_follows_the_contract(tiny_gguf, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p, "id": i}) for i, p in enumerate(["abc", "hello there"])))
    out = tmp_path / "report.json"
    code = decode.main(["--model", tiny_gguf, "--prompts", str(prompts), "--prompt", "xyz", "--methods", "ar",
                        "--max-new-tokens", "6", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert set(report) == {"model", "settings", "environment", "runs", "summary"}
    assert report["environment"]["dtype"] == report["settings"]["dtype"] and report["environment"]["engine"]
    assert report["model"] == "tiny" and report["settings"]["max_new_tokens"] == 6
    assert [r["prompt"] for r in report["runs"]] == ["xyz", "abc", "hello there"]
    for run in report["runs"]:
        assert RUN_KEYS <= set(run)
        assert 1 <= run["new_tokens"] == len(run["token_ids"]) <= 6
        assert run["forwards"] == run["new_tokens"] and run["seconds"] > run["prefill_seconds"] > 0
    assert SUMMARY_KEYS <= set(report["summary"]["ar"])
    assert report["summary"]["ar"]["speedup_vs_ar"] == 1.0
    assert report["summary"]["ar"]["tpf"] == 1.0
    printed = capsys.readouterr().out
    assert "tok/s" in printed and "[2] hello there" in printed


def test_txt_prompts_and_no_chat(tiny_gguf, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("abc\n\nbca\n")
    out = tmp_path / "r.json"
    assert decode.main(["--model", tiny_gguf, "--prompts", str(prompts), "--no-chat", "--max-new-tokens", "3",
                        "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    runs = report["runs"]
    # The first screen: ar and jacobi by default, in this machine's auto dtype (bfloat16 on a CPU), with the speedup
    # of each against AR.
    assert [(r["method"], r["prompt"]) for r in runs] == [("ar", "abc"), ("ar", "bca"), ("jacobi", "abc"),
                                                          ("jacobi", "bca")]
    assert report["settings"]["dtype"] == machine.choose_dtype("auto").dtype and report["settings"]["block_size"] == 8
    assert report["environment"]["dtype_requested"] == "auto"
    assert [r["token_ids"] for r in runs[2:]] == [r["token_ids"] for r in runs[:2]]
    assert "speedup_vs_ar" in report["summary"]["jacobi"]


def test_batch_size_decodes_prompts_together(tiny_gguf, tmp_path, capsys):
    out = tmp_path / "b.json"
    args = ["--model", tiny_gguf, "--prompt", "abc", "--prompt", "hello there", "--prompt", "xy", "--no-chat",
            "--methods", "ar,jacobi,mr", "--max-new-tokens", "5", "--json", str(out)]
    assert decode.main(args + ["--batch-size", "2"]) == 0
    batched = json.loads(out.read_text())
    assert decode.main(args) == 0
    alone = json.loads(out.read_text())
    assert [r["token_ids"] for r in batched["runs"]] == [r["token_ids"] for r in alone["runs"]]
    assert {r["batch_size"] for r in batched["runs"]} == {2} and {r["batch_size"] for r in alone["runs"]} == {1}
    for method, s in batched["summary"].items():  # totals over the batches' shared wall clock
        assert s["tokens"] == sum(r["new_tokens"] for r in batched["runs"] if r["method"] == method)
        assert s["seconds"] > 0 and "median_seconds" not in s
    assert "2 prompts at a time" in capsys.readouterr().out


def test_sampled_tokens_are_equal_across_methods_and_batching(tiny_gguf, tmp_path):
    out = tmp_path / "s.json"
    args = ["--model", tiny_gguf, "--prompt", "abc", "--prompt", "hello there", "--prompt", "abc", "--no-chat",
            "--methods", "ar,jacobi,mr", "--max-new-tokens", "6", "--block-size", "3", "--temperature", "0.8",
            "--top-p", "0.95", "--json", str(out)]
    runs = {}
    for seed, batch in (("3", "1"), ("3", "2"), ("4", "1")):
        assert decode.main(args + ["--seed", seed, "--batch-size", batch]) == 0
        report = json.loads(out.read_text())
        by_method = {}
        for r in report["runs"]:
            by_method.setdefault(r["method"], []).append(r["token_ids"])
        assert by_method["ar"] == by_method["jacobi"] == by_method["mr"]
        runs[seed, batch] = by_method["ar"]
        assert report["settings"]["temperature"] == 0.8 and report["settings"]["top_p"] == 0.95
    assert runs["3", "1"] == runs["3", "2"]  # keyed by the prompt's index in the request, not its batch
    assert runs["3", "1"] != runs["4", "1"]


@pytest.mark.parametrize("args, message", [
    (["--top-k", "5"], "only apply when sampling"),
    (["--temperature", "-1"], "temperature must be a finite number >= 0"),
    (["--temperature", "1", "--top-p", "0"], "top_p must be a number in (0, 1]"),
    (["--batch-size", "0"], f"--batch-size must be an integer in [1, {MAX_BATCH_SIZE}], got 0"),
    (["--batch-size", "2", "--stream"], "--stream prints one prompt at a time"),
    (["--model", "/nonexistent/model.gguf"], "no such model name, file or directory"),
    (["--methods", "ar,warp"], "unknown method(s) warp"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be positive"),
    (["--prompt", "abc " * 200], "exceeds the model context of 128 tokens"),
    (["--prompts", "/nonexistent/prompts.jsonl"], "prompts file /nonexistent/prompts.jsonl does not exist"),
])
def test_bad_input_is_one_clear_line(tiny_gguf, args, message, capsys):
    if "--model" not in args:
        args = ["--model", tiny_gguf, *args]
    assert decode.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and message in err[-1]


@pytest.fixture
def no_loading(monkeypatch):
    """Loading a model (to decode, or to --tune) fails the test: what it checks must be refused before that."""
    from jf_jax import api

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(api, "load_model", refuse)
    monkeypatch.setattr(api, "tune", refuse)


def cases(*pairs):
    """pytest params (args, message) named by their arguments."""
    return [pytest.param(args, message, id=" ".join(args)) for args, message in pairs]


# The limits are the decoders' own (each bad value would be refused by generate_jacobi / generate_mr / the seed
# and batch checks, but only after loading the model and decoding every prompt with the earlier methods).
@pytest.mark.parametrize("args, message", cases(
    (["--methods", "ar,jacobi", "--block-size", "0"],
     f"--block-size must be an integer in [1, {MAX_BLOCK_SIZE}], got 0"),
    (["--methods", "ar,mr", "--block-size", str(MAX_BLOCK_SIZE + 1)],
     f"--block-size must be an integer in [1, {MAX_BLOCK_SIZE}], got {MAX_BLOCK_SIZE + 1}"),
    (["--methods", "ar,mr", "--num-blocks", "0"], f"--num-blocks must be an integer in [1, {MAX_NUM_BLOCKS}], got 0"),
    (["--methods", "ar,mr", "--num-blocks", str(MAX_NUM_BLOCKS + 1)],
     f"--num-blocks must be an integer in [1, {MAX_NUM_BLOCKS}], got {MAX_NUM_BLOCKS + 1}"),
    (["--methods", "ar,mr", "--pool-size", "0"], f"--pool-size must be an integer in [1, {MAX_POOL_SIZE}], got 0"),
    (["--methods", "ar,mr", "--pool-size", str(MAX_POOL_SIZE + 1)],
     f"--pool-size must be an integer in [1, {MAX_POOL_SIZE}], got {MAX_POOL_SIZE + 1}"),
    (["--methods", "ar,mr", "--spawn-ratio", "0"], "--spawn-ratio must be a number in (0, 1], got 0.0"),
    (["--methods", "ar,mr", "--spawn-ratio", "1.5"], "--spawn-ratio must be a number in (0, 1], got 1.5"),
    (["--methods", "ar,mr", "--spawn-ratio", "nan"], "--spawn-ratio must be a number in (0, 1], got nan"),
    (["--seed", "-1"], f"--seed must be an integer in [0, {MAX_SEED}], got -1"),
    (["--seed", str(MAX_SEED + 1)], f"--seed must be an integer in [0, {MAX_SEED}], got {MAX_SEED + 1}"),
    (["--batch-size", str(MAX_BATCH_SIZE + 1)],
     f"--batch-size must be an integer in [1, {MAX_BATCH_SIZE}], got {MAX_BATCH_SIZE + 1}"),
    (["--batch-size", "-3"], f"--batch-size must be an integer in [1, {MAX_BATCH_SIZE}], got -3"),
    (["--max-new-tokens", "-5"], "--max-new-tokens must be positive, got -5"),
    (["--temperature", "inf"], "temperature must be a finite number >= 0"),
    (["--temperature", "1", "--top-k", "-1"], "top_k must be an integer in [0, "),
    (["--temperature", "1", "--top-p", "1.5"], "top_p must be a number in (0, 1]"),
    (["--tune", "--num-blocks", "0"], f"--num-blocks must be an integer in [1, {MAX_NUM_BLOCKS}], got 0"),
    (["--tune", "--spawn-ratio", "2"], "--spawn-ratio must be a number in (0, 1], got 2.0"),
    (["--tune", "--seed", "-1"], f"--seed must be an integer in [0, {MAX_SEED}], got -1"),
))
def test_bad_option_is_refused_before_loading(args, message, no_loading, capsys):
    assert decode.main(["--model", "/nonexistent/model.gguf", *args]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {message}")


@pytest.mark.parametrize("args, message", cases(
    (["--methods", "ar", "--num-blocks", "2"], "--methods ar does not use --num-blocks (only mr)"),
    (["--methods", "ar,jacobi", "--pool-size", "2", "--spawn-ratio", "0.5"],
     "--methods ar,jacobi does not use --pool-size (only mr), --spawn-ratio (only mr)"),
    (["--pool-size", "2"], f"--methods {decode.DEFAULTS['methods']} does not use --pool-size (only mr)"),
    (["--methods", "ar", "--block-size", "4"], "--methods ar does not use --block-size (only jacobi/mr)"),
    (["--methods", "ar", "--stream"], "--methods ar does not use --stream (only jacobi/mr)"),
    (["--tune", "--block-size", "16"], "--tune does not use --block-size"),
    (["--tune", "--methods", "mr", "--temperature", "0.5"], "--tune does not use --methods, --temperature"),
    (["--tune-out", "somewhere"], "--tune-out is only read by --tune and by --block-size/--pool-size tuned"),
))
def test_option_the_run_would_ignore_is_refused(args, message, no_loading, capsys):
    assert decode.main(["--model", "/nonexistent/model.gguf", *args]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {message}")


@pytest.mark.parametrize("args", [
    [],
    ["--methods", "ar", "--seed", "3", "--temperature", "0.5", "--top-k", "4"],
    ["--methods", "mr", "--block-size", str(MAX_BLOCK_SIZE), "--num-blocks", str(MAX_NUM_BLOCKS), "--pool-size",
     str(MAX_POOL_SIZE), "--spawn-ratio", "1", "--seed", str(MAX_SEED), "--batch-size", str(MAX_BATCH_SIZE)],
    ["--methods", "jacobi", "--block-size", "tuned", "--tune-out", "somewhere"],
    ["--tune", "--num-blocks", "1", "--spawn-ratio", "0.5", "--seed", "0", "--tune-out", "somewhere"],
], ids=lambda args: " ".join(args) or "defaults")
def test_options_within_the_limits_pass_and_defaults_are_filled_in(args):
    parsed = decode.build_parser().parse_args(args)
    decode.check_args(parsed)
    for name, default in decode.DEFAULTS.items():
        assert getattr(parsed, name) is not None
        if decode.flag(name) not in args:
            assert getattr(parsed, name) == default


def test_defaults_reach_only_the_methods_that_use_them(monkeypatch):
    """Without the mr options the default run is not bothered; the CLI block size goes to jacobi, not to ar."""
    from jf_jax import api

    calls = []

    def generate(model, prompts, *, method, **options):
        calls.append((method, {k: v for k, v in options.items() if k not in ("chat", "first_index")}))
        return [api.Completion(method=method, prompt=p, token_ids=[1], text="x", forwards=1, seconds=1.0,
                               prefill_seconds=0.5, stats=dict(tokens=1, forwards=1, seconds=1.0, prefill_seconds=0.5),
                               settings={}) for p in prompts]

    monkeypatch.setattr(api, "load_model", lambda spec, dtype: type("Model", (), {"name": spec}))
    monkeypatch.setattr(api, "generate", generate)
    assert decode.main(["--model", "fake", "--prompt", "abc"]) == 0
    tokens = decode.DEFAULTS["max_new_tokens"]
    assert calls == [("ar", dict(max_new_tokens=tokens)),
                     ("jacobi", dict(max_new_tokens=tokens, block_size=decode.CLI_BLOCK_SIZE))]


def test_tuned_sizes_are_checked_before_loading(tmp_path, no_loading, capsys):
    (tmp_path / "tuned.json").write_text(json.dumps({"devices": {"cpu": {"block_size": MAX_BLOCK_SIZE + 1,
                                                                          "pool_size": 1}}}))
    assert decode.main(["--model", "/nonexistent/model.gguf", "--methods", "mr", "--block-size", "tuned",
                        "--tune-out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == f"error: --block-size must be an integer in [1, {MAX_BLOCK_SIZE}], got {MAX_BLOCK_SIZE + 1}"
    assert not any(line.startswith("loading") for line in err)


def test_unparsable_block_size_names_the_option(capsys):
    with pytest.raises(SystemExit) as exit_:
        decode.main(["--block-size", "big"])
    assert exit_.value.code == 2
    assert "argument --block-size: expected an integer or 'tuned', got 'big'" in capsys.readouterr().err


def test_module_entry_point_refuses_an_unused_option_at_once(tmp_path):
    """Through ``python -m jf_jax.decode``: exit status 2 and a single stderr line (no "loading ..." before it)."""
    proc = subprocess.run([sys.executable, "-m", "jf_jax.decode", "--model", "/nonexistent/model.gguf", "--methods",
                           "ar,jacobi",
                           "--num-blocks", "2"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, store.CACHE_ENV: str(tmp_path / "c")})
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == ["error: --methods ar,jacobi does not use --num-blocks (only mr): drop the "
                                        "option or add its method"]


def test_malformed_jsonl_names_the_line(tiny_gguf, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt field"}\n')
    assert decode.main(["--model", tiny_gguf, "--prompts", str(bad)]) == 2
    assert f"{bad}:2 has no string 'prompt' field" in capsys.readouterr().err


def test_module_entry_point_exits_nonzero_on_corrupt_weights(tmp_path):
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + os.urandom(64))
    proc = subprocess.run([sys.executable, "-m", "jf_jax.decode", "--model", str(corrupt)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, store.CACHE_ENV: str(tmp_path / "c")})
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "corrupt.gguf" in last


def test_stream_prints_the_jacobi_text_as_it_is_accepted(tiny_gguf, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert decode.main(["--model", tiny_gguf, "--methods", "ar,jacobi", "--stream", "--block-size", "3",
                        "--max-new-tokens", "6", "--prompt", "abc", "--json", str(out)]) == 0
    runs = {r["method"]: r for r in json.loads(out.read_text())["runs"]}
    assert runs["jacobi"]["token_ids"] == runs["ar"]["token_ids"]
    streamed = capsys.readouterr().out.split("[jacobi #0] ", 1)[1].split("\n", 1)[0]
    assert streamed and streamed == runs["jacobi"]["text"]


def test_unwritable_json_path_fails_before_any_work(tiny_gguf, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    assert decode.main(["--model", tiny_gguf, "--prompt", "abc", "--json", str(blocker / "report.json")]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(f"error: cannot write the JSON report to {blocker}/report.json")
    assert "loading" not in err  # nothing was loaded or decoded first
    target = tmp_path / "new_dir" / "r.json"  # a writable path is left absent until the report is written
    assert decode.main(["--model", tiny_gguf, "--prompt", "abc", "--max-new-tokens", "2", "--json", str(target)]) == 0
    assert json.loads(target.read_text())["runs"]


def test_stream_prints_the_mr_text_too(tiny_gguf, capsys):
    assert decode.main(["--model", tiny_gguf, "--methods", "mr", "--stream", "--block-size", "3", "--num-blocks", "2",
                        "--max-new-tokens", "6", "--prompt", "abc"]) == 0
    out = capsys.readouterr().out
    assert "[mr #0] " in out and out.split("[mr #0] ", 1)[1].split("\n", 1)[0]

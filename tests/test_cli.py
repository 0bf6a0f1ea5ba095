"""The ``python -m jf_jax.decode`` contract on a tiny GGUF model: JSON schema, prompt files, clear errors."""

import json
import os
import subprocess
import sys

import pytest

from jf_jax.cli import decode
from jf_jax.weights import store

RUN_KEYS = {"method", "prompt_index", "prompt", "token_ids", "text", "new_tokens", "forwards", "batch_size", "seconds",
            "prefill_seconds"}
SUMMARY_KEYS = {"tokens_per_forward", "tokens_per_second", "tokens_per_second_excl_prefill", "speedup_vs_ar"}


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
    assert set(report) == {"model", "settings", "runs", "summary"}
    assert report["model"] == "tiny" and report["settings"]["max_new_tokens"] == 6
    assert [r["prompt"] for r in report["runs"]] == ["xyz", "abc", "hello there"]
    for run in report["runs"]:
        assert RUN_KEYS <= set(run)
        assert 1 <= run["new_tokens"] == len(run["token_ids"]) <= 6
        assert run["forwards"] == run["new_tokens"] and run["seconds"] > run["prefill_seconds"] > 0
    assert SUMMARY_KEYS <= set(report["summary"]["ar"])
    assert report["summary"]["ar"]["speedup_vs_ar"] == 1.0
    assert report["summary"]["ar"]["tokens_per_forward"] == 1.0
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
    # The first screen: ar and jacobi by default, in bfloat16, with the speedup of each against AR.
    assert [(r["method"], r["prompt"]) for r in runs] == [("ar", "abc"), ("ar", "bca"), ("jacobi", "abc"),
                                                          ("jacobi", "bca")]
    assert report["settings"]["dtype"] == "bfloat16" and report["settings"]["block_size"] == 8
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
    (["--batch-size", "0"], "--batch-size must be positive"),
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

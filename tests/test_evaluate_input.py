"""``jf-jax evaluate`` refuses bad input before any work (one line on stderr, exit 2, nothing loaded or read), and
a late failure loses nothing: the report is written after each model and the same command resumes it."""

import json
import os
import subprocess
import sys
import time

import pytest

from jf_jax.decoding.common import GenerationError
from jf_jax.decoding.multiblock import MAX_NUM_BLOCKS
from jf_jax.decoding.runner import MAX_BLOCK_SIZE
from tests.test_collect_eval import ROWS, FakeModel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _no_model(*args, **kwargs):
    raise AssertionError("a model was loaded before the options were checked")


@pytest.fixture
def no_model(monkeypatch):
    import jf_jax.api

    monkeypatch.setattr(jf_jax.api, "load_model", _no_model)


@pytest.mark.parametrize("args, reason", [
    (["--num-blocks", "99"], f"--num-blocks 99 for mr: num_blocks must be an integer in [1, {MAX_NUM_BLOCKS}]"),
    (["--block-size", "100000"], f"--block-size 100000 for jacobi: block_size must be an integer in [1, "
                                 f"{MAX_BLOCK_SIZE}]"),
    (["--block-size", f"8,{MAX_BLOCK_SIZE + 1}", "--methods", "mr"], f"--block-size {MAX_BLOCK_SIZE + 1} for mr"),
    (["--methods", "ar,nosuch"], "--methods: unknown method nosuch; known: ar, jacobi, mr"),
    (["--methods", " , "], "--methods names no method; known: ar, jacobi, mr"),
    (["--math-batch", "0"], "--math-batch must be a positive integer, got 0"),
    (["--math-batch", "-3"], "--math-batch must be a positive integer, got -3"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be a positive integer"),
    (["--math-max-new-tokens", "-1"], "--math-max-new-tokens must be a positive integer"),
    (["--humaneval-max-new-tokens", "0"], "--humaneval-max-new-tokens must be a positive integer"),
    (["--humaneval", "-1"], "--humaneval must be >= 0, got -1"),
    (["--humaneval-nll", "-1"], "--humaneval-nll must be >= 0, got -1"),
    (["--limit", "-1"], "--limit must be >= 0, got -1"),
    (["--math-limit", "-2"], "--math-limit must be >= 0, got -2"),
    (["--temperature", "-1"], "temperature must be a finite number >= 0"),
    (["--num-processes", "2", "--process-id", "1"],
     "--num-processes, --process-id without --distributed or --coordinator: the run would be one process"),
    (["--distributed", "--num-processes", "2", "--process-id", "2"],
     "--process-id 2 names no process of --num-processes 2 (ids count from 0)"),
    (["--coordinator", "localhost:1", "--process-id", "-1"], "--process-id -1 names no process"),
    (["--distributed", "--num-processes", "0"], "--num-processes must be a positive integer, got 0"),
])
def test_bad_options_are_refused_in_one_line_before_anything_is_loaded_or_read(tmp_path, no_model, capsys, args,
                                                                              reason):
    from jf_jax.cli.evaluate import main

    missing = tmp_path / "not_read.jsonl"  # an option error comes before the prompt files are opened
    out = tmp_path / "eval"
    assert main(["--model", "smollm2-135m", "--prompts", str(missing), "--math", str(missing), "--out", str(out),
                 *args]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and reason in err
    assert not os.path.exists(f"{out}.json") and not os.path.exists(f"{out}.md")


@pytest.mark.parametrize("method, option, value", [("jacobi", "block_size", MAX_BLOCK_SIZE + 1),
                                                   ("mr", "block_size", 0), ("mr", "num_blocks", MAX_NUM_BLOCKS + 1)])
def test_the_up_front_check_is_the_decoders_own(method, option, value):
    from jf_jax.api import METHODS
    from jf_jax.cli.evaluate_options import decoder_problem

    with pytest.raises(GenerationError) as decoder:  # the decoders check their settings before touching the model
        METHODS[method](None, None, [[2]], max_new_tokens=1, eos_ids=[1], **{option: value})
    assert str(decoder.value) in decoder_problem([(method, {option: value})])
    limit = {"block_size": MAX_BLOCK_SIZE, "num_blocks": MAX_NUM_BLOCKS}[option]
    assert decoder_problem([(method, {option: limit}), ("ar", {})]) is None


def test_the_checkers_command_lines_fail_fast_in_one_line(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(ROWS[0]) + "\n")
    for extra, reason in ((["--num-blocks", "99"], "--num-blocks 99"), (["--methods", "ar,nosuch"], "nosuch")):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "jf_jax.cli.evaluate", "--model", "smollm2-135m", "--prompts",
                               str(prompts), "--out", str(tmp_path / "eval"), *extra],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
        assert done.stderr.startswith("error: ") and reason in done.stderr
        assert time.perf_counter() - start < 60


@pytest.mark.parametrize("rows, flag, reason", [
    (None, "--prompts", "cannot read"),
    ([dict(id="a", text="no prompt field")], "--prompts", "line 1 has no prompt"),
    ([dict(id="a", prompt="2+2?")], "--math", "line 1 has no answer"),
    ([], "--prompts", "gives no prompt to decode"),
])
def test_unusable_prompt_files_are_refused_before_a_model_is_loaded(tmp_path, no_model, capsys, rows, flag, reason):
    from jf_jax.cli.evaluate import main

    path = tmp_path / "set.jsonl"
    if rows is not None:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["--model", "smollm2-135m", flag, str(path), "--out", str(tmp_path / "eval")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and reason in err


def _loader(monkeypatch, loaded: list):
    """load_model: a tiny random model for the specs "tiny" and "tiny2", the real loader for any other spec."""
    import jf_jax.api

    real = jf_jax.api.load_model

    def load(spec, *args, **kwargs):
        loaded.append(spec)
        return FakeModel(name=spec) if spec in ("tiny", "tiny2") else real(spec, *args, **kwargs)

    monkeypatch.setattr(jf_jax.api, "load_model", load)


def test_a_late_failure_keeps_the_models_done_and_the_same_command_resumes(tmp_path, monkeypatch, capsys):
    from jf_jax.cli.evaluate import main

    prompts = tmp_path / "held.jsonl"
    prompts.write_text(json.dumps(ROWS[0]) + "\n")
    out = tmp_path / "reports" / "eval"
    common = ["--prompts", str(prompts), "--methods", "ar", "--max-new-tokens", "4", "--out", str(out)]
    loaded = []
    _loader(monkeypatch, loaded)
    typo = str(tmp_path / "mistyped_run")
    assert main(["--model", "tiny", "--model", typo, *common]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(f"error: --model {typo} cannot be loaded: unknown model")
    assert f"1 model(s) done are in {out}.json" in err
    report = json.loads(out.with_suffix(".json").read_text())
    assert [r["model"] for r in report["results"]] == report["args"]["model"] == ["tiny"]
    assert "| tiny | held | ar |" in out.with_suffix(".md").read_text()
    assert sorted(os.listdir(out.parent)) == ["eval.json", "eval.md"]  # no temporary file left behind

    loaded.clear()  # the same command with the spec corrected: tiny is kept, not evaluated again
    assert main(["--model", "tiny", "--model", "tiny2", *common]) == 0
    assert loaded == ["tiny2"] and "tiny: skipped, already in" in capsys.readouterr().out
    resumed = json.loads(out.with_suffix(".json").read_text())
    assert resumed["results"][0] == report["results"][0] and resumed["args"]["model"] == ["tiny", "tiny2"]
    assert "| tiny2 | held | ar |" in out.with_suffix(".md").read_text()

    monkeypatch.setattr("jf_jax.api.load_model", _no_model)  # other settings: refused by name, nothing loaded
    assert main(["--model", "tiny3", *common, "--limit", "2", "--seed", "1"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--limit: 8 there, 2 here; --seed: 0 there, 1 here" in err
    assert "pass another --out" in err
    out.with_suffix(".json").write_text("{not json")
    assert main(["--model", "tiny3", *common]) == 2
    assert "is not a report of jf-jax evaluate" in capsys.readouterr().err


def test_differing_settings_ignore_the_models_and_the_spelling_of_lists():
    from jf_jax.cli.evaluate_options import differing_settings

    old = dict(model=["a"], out="x", block_size=[8, 16], limit=8, device="CPU (2 cores)")
    assert differing_settings(old, dict(old, model=["b", "c"], out="./x", block_size=(8, 16))) == []
    assert differing_settings(old, dict(old, device="NVIDIA H200")) == [
        "device: CPU (2 cores) there, NVIDIA H200 here"]
    assert differing_settings(old, dict(old, decode_shape="auto")) == [
        "--decode-shape: (not recorded) there, auto here"]


def test_reports_are_replaced_whole(tmp_path):
    from jf_jax.eval.report import write_atomically

    path = tmp_path / "r.json"
    write_atomically(str(path), "first")
    write_atomically(str(path), "second")
    assert path.read_text() == "second" and os.listdir(tmp_path) == ["r.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # as open() makes it, not mkstemp's private mode
    with pytest.raises(TypeError):
        write_atomically(str(path), None)  # a write that fails midway leaves the previous report
    assert path.read_text() == "second" and os.listdir(tmp_path) == ["r.json"]


def test_the_docstring_says_where_outputs_equal_ar():
    from jf_jax.cli import evaluate

    assert "floating-point ties" not in evaluate.__doc__ and "bit-equal" not in evaluate.__doc__
    assert "at natural shapes (--decode-shape off) on a GPU in bfloat16" in evaluate.__doc__

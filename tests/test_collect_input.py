"""jf-jax collect refuses bad input before loading a model, and never resumes a directory with another setup;
its manifest survives a kill at any point. A tiny random model stands in (offline, fast)."""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest

import jf_jax.api
from jf_jax.cli.collect import main
from jf_jax.training.trajectories import load_responses, read_manifest
from tests.support.train_models import TINY, numpy_params


class ByteTokenizer:
    """Characters -> ids in [2, 48); id 1 ends a response."""

    eos_ids = (1,)
    pad_id = 0

    def encode(self, text):
        return [2 + ord(c) % 46 for c in text]

    def apply_chat_template(self, prompt, add_generation_prompt=True):
        return f"<u>{prompt}<a>"


@dataclasses.dataclass
class TinyModel:
    cfg: object = TINY
    params: dict = dataclasses.field(default_factory=lambda: numpy_params(TINY, 0))
    tokenizer: ByteTokenizer = dataclasses.field(default_factory=ByteTokenizer)
    name: str = "tiny"
    source: str = "memory"


ROWS = [dict(id=f"p{i}", domain="code" if i % 2 else "math", prompt=f"prompt number {i} " * 2) for i in range(4)]
BASE = ["--block-size", "4", "--max-new-tokens", "8", "--no-progress"]


def _tiny_model(spec, dtype="float32"):
    return TinyModel()


def _no_model(*args, **kwargs):
    raise AssertionError("a model was loaded before the input was checked")


def _write_prompts(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """A complete collection of three prompts: (prompts file, --out)."""
    root = tmp_path_factory.mktemp("collected")
    prompts, out = _write_prompts(root / "p.jsonl", ROWS), root / "traj"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jf_jax.api, "load_model", _tiny_model)
        assert main(["--prompts", str(prompts), "--out", str(out), "--limit", "3", "--prompts-per-shard", "2",
                     *BASE]) == 0
    return prompts, out


def _refusal(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


def test_the_manifest_records_every_setting_that_shapes_a_trajectory(collected):
    prompts, out = collected
    settings = read_manifest(str(out))["metadata"]["settings"]
    assert settings == dict(model="smollm2-135m", dtype="float32", block_size=4, max_new_tokens=8, seed=0, chat=True,
                            repetition_filter=None, batch_size=1, decode_shape=None, backend=jax.default_backend(),
                            mesh=None, prompts_file=str(prompts), prompts_sha256=settings["prompts_sha256"],
                            domains=None, offset=0, limit=3)


@pytest.mark.parametrize("args, named", [
    (["--max-new-tokens", "12"], "--max-new-tokens 8 (this run: 12)"),
    (["--model", "other-model"], '--model "smollm2-135m" (this run: "other-model")'),
    (["--dtype", "bfloat16"], '--dtype "float32" (this run: "bfloat16")'),
    (["--seed", "7"], "--seed 0 (this run: 7)"),
    (["--block-size", "8"], "--block-size 4 (this run: 8)"),
    (["--repetition-filter"], '--repetition-filter null (this run: {"ngram": 4, "max_repeat_fraction": 0.5})'),
    (["--no-chat"], "chat template (--no-chat) true (this run: false)"),
    (["--batch-size", "2", "--decode-shape", "1x8"], 'decode shape (--decode-shape, resolved) null (this run: "1x8")'),
    (["--domains", "math"], '--domains null (this run: ["math"])'),
    (["--offset", "1"], "--offset 0 (this run: 1)"),
    (["--limit", "2"], "--limit 3 (this run: 2)"),
    (["--batch-size", "2", "--mesh", "data=1"], '--mesh null (this run: "data=1,fsdp=1,tensor=1")'),
])
def test_a_resume_with_another_setting_is_refused_by_name_before_loading_a_model(collected, monkeypatch, capsys,
                                                                                  args, named):
    prompts, out = collected
    before = (out / "manifest.json").read_bytes()
    monkeypatch.setattr(jf_jax.api, "load_model", _no_model)
    argv = ["--prompts", str(prompts), "--out", str(out), "--limit", "3", *BASE]
    assert main(argv + args) == 2
    err = _refusal(capsys)
    assert err.startswith(f"error: --out {out} was collected with other settings: ") and named in err
    assert (out / "manifest.json").read_bytes() == before


def test_every_differing_setting_is_named_and_an_edited_prompts_file_is_refused(collected, tmp_path, monkeypatch,
                                                                                 capsys):
    prompts, out = collected
    monkeypatch.setattr(jf_jax.api, "load_model", _no_model)
    edited = _write_prompts(tmp_path / "p.jsonl", [dict(ROWS[0], prompt="another prompt")] + ROWS[1:])
    assert main(["--prompts", str(edited), "--out", str(out), "--limit", "3", *BASE, "--seed", "3",
                 "--max-new-tokens", "16"]) == 2
    err = _refusal(capsys)
    assert "--prompts (file contents, sha256)" in err and "--seed 0 (this run: 3)" in err
    assert "--max-new-tokens 8 (this run: 16)" in err


def test_a_resume_with_the_same_settings_continues(collected, tmp_path, monkeypatch, capsys):
    """The same setup through another path to the same prompts, another shard size and --decode-shape auto (on a
    CPU: natural shapes, as the first run had) is the same setting: resumed, nothing redone."""
    prompts, out = collected
    before = read_manifest(str(out))
    monkeypatch.setattr(jf_jax.api, "load_model", _tiny_model)
    monkeypatch.chdir(prompts.parent)
    assert main(["--prompts", prompts.name, "--out", str(out), "--limit", "3", "--prompts-per-shard", "5",
                 "--decode-shape", "auto", *BASE]) == 0
    assert read_manifest(str(out)) == before


def test_a_manifest_without_recorded_settings_is_refused(collected, tmp_path, monkeypatch, capsys):
    prompts, out = collected
    older = tmp_path / "older"
    older.mkdir()
    manifest = read_manifest(str(out))
    del manifest["metadata"]["settings"]  # as collect wrote it before recording them
    manifest["shards"] = manifest["shards"][:-1]  # and not finished (a finished one has nothing to add: below)
    (older / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(jf_jax.api, "load_model", _no_model)
    assert main(["--prompts", str(prompts), "--out", str(older), "--limit", "3", *BASE]) == 2
    assert "its manifest records no collection settings" in _refusal(capsys)
    (older / "manifest.json").write_text('{"format": "jf-traj')  # truncated by some other writer
    assert main(["--prompts", str(prompts), "--out", str(older), "--limit", "3", *BASE]) == 2
    assert "cannot resume from" in _refusal(capsys)


@pytest.mark.parametrize("args, message", [
    (["--limit", "-1"], "--limit must be at least 1, got -1"),
    (["--limit", "0"], "--limit must be at least 1, got 0"),
    (["--offset", "-2"], "--offset must be at least 0, got -2"),
    (["--seed", "-1"], "--seed must be in [0, 2147483647], got -1"),
    (["--block-size", "0"], "--block-size must be at least 1, got 0"),
    (["--max-new-tokens", "-8"], "--max-new-tokens must be at least 1, got -8"),
    (["--prompts-per-shard", "0"], "--prompts-per-shard must be at least 1, got 0"),
    (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    (["--num-processes", "0"], "--num-processes must be at least 1, got 0"),
    (["--process-id", "2", "--num-processes", "2"], "--process-id must be below --num-processes (2), got 2"),
])
def test_a_bad_number_is_refused_in_one_line_before_loading_a_model(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.setattr(jf_jax.api, "load_model", _no_model)
    prompts = _write_prompts(tmp_path / "p.jsonl", ROWS)
    assert main(["--prompts", str(prompts), "--out", str(tmp_path / "t"), *args]) == 2
    assert message in _refusal(capsys)


def test_select_prompts_refuses_negative_ranges():
    from jf_jax.cli.collect import select_prompts

    with pytest.raises(ValueError, match="must not be negative"):
        select_prompts(ROWS, None, None, offset=-1)
    with pytest.raises(ValueError, match="must not be negative"):
        select_prompts(ROWS, None, -1)


@pytest.mark.parametrize("text, where, message", [
    ('{"id": "a", "prompt": "hi"}\n\n{"id": "b"}\n', 3, "has no string 'prompt' field"),
    ('{"prompt": "hi"}\n{"prompt": 5}\n', 2, "has no string 'prompt' field"),
    ('["hi"]\n', 1, "has no string 'prompt' field"),
    ('{"prompt": "hi"}\n{"prompt": "  "}\n', 2, "has an empty 'prompt'"),
    ('{"prompt": "hi"}\n{"prompt": "hi"\n', 2, "is not valid JSON"),
])
def test_a_bad_prompt_row_is_named_by_file_and_line_before_loading_a_model(tmp_path, monkeypatch, capsys, text,
                                                                           where, message):
    monkeypatch.setattr(jf_jax.api, "load_model", _no_model)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(text)
    assert main(["--prompts", str(prompts), "--out", str(tmp_path / "t")]) == 2
    assert _refusal(capsys).startswith(f"error: {prompts}:{where} {message}")


@pytest.mark.parametrize("content, message", [
    (None, "cannot read --prompts"),
    (b"\n\n", "holds no prompts"),
    (b'{"prompt": "\xff"}\n', "is not UTF-8 text"),
])
def test_an_unreadable_or_empty_prompts_file_is_refused(tmp_path, monkeypatch, capsys, content, message):
    monkeypatch.setattr(jf_jax.api, "load_model", _no_model)
    prompts = tmp_path / "p.jsonl"
    if content is not None:
        prompts.write_bytes(content)
    assert main(["--prompts", str(prompts), "--out", str(tmp_path / "t")]) == 2
    assert message in _refusal(capsys)


class Killed(BaseException):
    """A kill: nothing after it runs, no handler catches it."""


def test_a_kill_while_the_manifest_is_renamed_leaves_a_resumable_collection(collected, tmp_path, monkeypatch):
    """The manifest is written to a temporary file and renamed (training.trajectories): a kill before the rename
    leaves the previous, complete manifest and a stray temporary file, and the resume records what an unbroken
    run records."""
    prompts, reference = collected
    out = tmp_path / "traj"
    argv = ["--prompts", str(prompts), "--out", str(out), "--limit", "3", "--prompts-per-shard", "1", *BASE]
    replace, manifest_renames = os.replace, []

    def killed_at_the_second_shard(src, dst):
        if os.path.basename(dst) == "manifest.json":
            manifest_renames.append(dst)
            if len(manifest_renames) == 3:  # the new manifest, then after shard 0, then after shard 1: killed
                raise Killed
        replace(src, dst)

    monkeypatch.setattr(jf_jax.api, "load_model", _tiny_model)
    monkeypatch.setattr(os, "replace", killed_at_the_second_shard)
    with pytest.raises(Killed):
        main(argv)
    monkeypatch.setattr(os, "replace", replace)
    assert [s["file"] for s in read_manifest(str(out))["shards"]] == ["shard-00000.npz"]
    assert any(name.startswith("manifest.json.tmp-") for name in os.listdir(out))
    (out / "manifest.json.tmp-1").write_text('{"format": "jf-traj')  # a torn temporary file of an older kill
    assert main(argv) == 0
    assert [s["prompt_end"] for s in read_manifest(str(out))["shards"]] == [1, 2, 3]
    resumed, unbroken = load_responses(str(out)), load_responses(str(reference))
    assert [len(r) for r in resumed] == [len(r) for r in unbroken] and resumed
    for ra, rb in zip(resumed, unbroken):
        for a, b in zip(ra, rb):
            np.testing.assert_array_equal(a.states, b.states)
            np.testing.assert_array_equal(a.prompt_ids, b.prompt_ids)


def test_a_finished_older_collection_of_the_same_prompts_has_nothing_to_add(collected, tmp_path, monkeypatch,
                                                                              capsys):
    """A re-run over a complete collection written before settings were recorded (a study stage finding its
    parts complete) adds nothing, so it exits 0 without loading a model; an unfinished one is refused above."""
    prompts, out = collected
    older = tmp_path / "older_done"
    older.mkdir()
    manifest = read_manifest(str(out))
    del manifest["metadata"]["settings"]
    (older / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(jf_jax.api, "load_model", _no_model)
    args = ["--prompts", str(prompts), "--out", str(older), "--limit", str(manifest["num_prompts"]), *BASE]
    assert main(args) == 0
    assert "nothing to collect" in capsys.readouterr().out
    manifest["shards"] = manifest["shards"][:-1]  # unfinished: its setup would decide the rest, and is unknown
    (older / "manifest.json").write_text(json.dumps(manifest))
    assert main(args) == 2
    assert "its manifest records no collection settings" in _refusal(capsys)

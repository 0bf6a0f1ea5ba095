"""Every measured figure in README.md and docs/*.md comes from a committed file under results/ and the doc links it
(``python -m jf_jax.cli.figures``; its docstring states the rules). The checker runs over the real repository, and
over a synthetic tree where a wrong figure must be flagged and a right one must not."""

from pathlib import Path

import pytest

from jf_jax.cli import figures
from jf_jax.cli.figures import Checker, main

ROOT = Path(__file__).resolve().parent.parent



def _docs() -> list[str]:
    return [str(p.relative_to(ROOT)) for p in Checker(ROOT).docs()]


@pytest.fixture(scope="module")
def real_problems():
    return Checker(ROOT).check()


@pytest.mark.parametrize("doc", _docs())
def test_every_figure_of_the_docs_is_in_a_linked_results_file(doc, real_problems):
    problems = [p for p in real_problems if p.path == doc]
    assert not problems, "figures not matched to a committed file:\n" + "\n".join(map(str, problems))


def test_the_checker_sees_the_docs_and_their_figures():
    """Not a no-op: README and the docs are read, hundreds of figures are found, and most cite a results file."""
    report: list[str] = []
    Checker(ROOT).check(report)
    assert {"README.md", "docs/cpu-engine.md", "docs/gpu-tpu.md"} <= set(_docs())
    assert "docs/results.md" not in _docs()  # generated; jf-jax results --check guards it
    assert len(report) > 350, len(report)
    assert sum("results/" in line for line in report) > 350


# ------------------------------------------------------------------------------------------- a synthetic tree


STUDY = """# A study

| method | TPF | ms |
|---|---|---|
| jacobi | 1.394 | 12.5 |
| mr | 1.702 | 30.1 |

Jacobi and mr equalled AR on 36 of 36 prompts. The suite took 18 min 39 s.
"""


def tree(tmp_path: Path, doc: str) -> Path:
    study = tmp_path / "results" / "studies" / "demo"
    study.mkdir(parents=True)
    (study / "README.md").write_text(STUDY)
    (study / "raw.json").write_text('{"x_ar": 0.6412345, "seconds": 0.0032550860, "bytes": 183897276}\n')
    (study / "sub").mkdir()
    (study / "sub" / "notes.txt").write_text("peak 11.71 G FMAs/s\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "results.md").write_text("| run | jacobi |\n|---|---|\n| r2 | 1.324 |\n")
    (tmp_path / "docs" / "page.md").write_text(doc)
    (tmp_path / "README.md").write_text("# Demo\n")
    return tmp_path


def problems(tmp_path: Path, doc: str) -> list[str]:
    root = tree(tmp_path, doc)
    return [f"{p.line}: {p.figure}: {p.reason}" for p in Checker(root).check()]


LINK = "([demo](../results/studies/demo/README.md))"


def test_a_right_figure_passes_and_a_wrong_one_is_flagged(tmp_path):
    assert problems(tmp_path / "right", f"# Page\n\nJacobi reached TPF 1.394 at 12.5 ms a forward {LINK}.\n") == []
    wrong = problems(tmp_path / "wrong", f"# Page\n\nJacobi reached TPF 1.395 at 12.5 ms a forward {LINK}.\n")
    assert len(wrong) == 1 and wrong[0].startswith("3: 1.395: in none of the linked files")


def test_a_figure_must_link_into_results(tmp_path):
    found = problems(tmp_path, "# Page\n\nJacobi reached TPF 1.394 ([elsewhere](other.md)).\n")
    assert found == ["3: 1.394: the unit links no file under results/"]


def test_formatting_differences_only(tmp_path):
    """Commas, trailing zeros, x, a fraction as a percentage; rounding only of raw recorded values (JSON)."""
    ok = (f"# Page\n\nTPF 1.3940 and 1.70200, 12.50 ms, 36 of 36 {LINK}; 0.64x, 64%, 64.1% and 3.26 ms, "
          "183,897,276 B ([raw](../results/studies/demo/raw.json)).\n")
    assert problems(tmp_path / "ok", ok) == []
    rounded_md = problems(tmp_path / "md", f"# Page\n\nTPF 1.39 {LINK}.\n")  # 1.394 is written to be read as such
    assert rounded_md and "1.39" in rounded_md[0]
    one_digit = problems(tmp_path / "digit", "# Page\n\n1x ([raw](../results/studies/demo/raw.json)).\n")
    assert one_digit and "1x" in one_digit[0]  # 0.64 is no 1x: a one-digit figure is not rounded to


def test_a_whole_number_keeps_its_unit(tmp_path):
    """39 is in the study as 39 s; 39 min is not there. Table cells carry their unit in the header."""
    assert problems(tmp_path / "ok", f"# Page\n\nThe suite took 18 min 39 s; a forward 30.1 ms {LINK}.\n") == []
    wrong = problems(tmp_path / "bad", f"# Page\n\nThe suite took 39 min {LINK}.\n")
    assert wrong and wrong[0].startswith("3: 39 min: in none")


def test_ratios_are_checked_as_pairs(tmp_path):
    assert problems(tmp_path / "ok", f"# Page\n\nEqual on 36 of 36 {LINK}.\n") == []
    assert problems(tmp_path / "bad", f"# Page\n\nEqual on 35 of 36 {LINK}.\n")
    assert problems(tmp_path / "row", f"# Page\n\n1/36 {LINK}.\n")  # 1 and 36 never share a line there


def test_derived_figures_are_computed_from_linked_inputs(tmp_path):
    raw = "([raw](../results/studies/demo/raw.json))"
    assert problems(tmp_path / "ok", f"# Page\n\n1.22x (derived: 1.702 / 1.394) {LINK}.\n") == []
    wrong = problems(tmp_path / "wrong", f"# Page\n\n1.25x (derived: 1.702 / 1.394) {LINK}.\n")
    assert wrong and "derived: 1.702 / 1.394 = 1.22" in wrong[0]
    unlinked_input = problems(tmp_path / "input", f"# Page\n\n0.5 (derived: 1.5 / 3) {raw}.\n")
    assert any("derived input 1.5" in p for p in unlinked_input)
    units = problems(tmp_path / "units", f"# Page\n\n183.9 MB (derived: 183,897,276 / 1000 / 1000) {raw}.\n")
    assert units == []


def test_unrecorded_figures_are_reported_not_checked(tmp_path):
    root = tree(tmp_path, "# Page\n\nIt took 30 s: 22.1 GB/s (unrecorded: not committed). Later 2.5x.\n")
    report: list[str] = []
    found = Checker(root).check(report)
    assert [p.figure for p in found] == ["2.5x"]  # the marker covers its own sentence only
    assert sum("unrecorded" in line for line in report) == 2


def test_what_is_not_a_figure(tmp_path):
    doc = """# Page

Settings and names: `--limit 8`, `0.5`, r = 0.85, jax 0.10.2, Python 3.11, Qwen2.5-7B, Llama 3.1, float32,
arXiv 2512.14681, a 4x128 shape, 16 tokens, 7,005 responses, an NVIDIA H100 80GB HBM3, on 2026-11-24.

```bash
python -m jf_jax.decode --temperature 0.7   # 12.34 ms in a code block
```

| key | default | meaning |
|---|---|---|
| `optim.clip_norm` | 1.0 | a setting |

| target | bandwidth | source |
|---|---|---|
| `h200` | 4.8 TB/s | a vendor's datasheet |
"""
    assert problems(tmp_path, doc) == []


def test_lists_tables_and_sections_inherit_the_links_that_introduce_them(tmp_path):
    doc = f"""# Page

## Measured

The benchmark {LINK}:

| method | TPF |
|---|---|
| jacobi | 1.394 |

What it means {LINK}:

- mr reached 1.702;
  - at 12.5 ms a forward.

## Summary

Jacobi's TPF was 1.394 ([Measured](#measured)); mr's 1.702 ([page](page.md#measured)).

Without a link: 1.702.
"""
    assert problems(tmp_path, doc) == ["20: 1.702: the unit links no file under results/"]


def test_generated_text_is_skipped_and_the_index_is_a_source(tmp_path):
    root = tree(tmp_path, "# Page\n\nThe best round reached 1.324 ([results.md](results.md)).\n")
    (root / "README.md").write_text("# Demo\n\n<!-- results-table:start -->\n| r | 9.999 |\n"
                                    "<!-- results-table:end -->\n\nSee 1.324 ([index](docs/results.md)).\n")
    assert Checker(root).check() == []


def test_the_command_lists_each_unmatched_figure_with_file_and_line(tmp_path, capsys):
    root = tree(tmp_path, f"# Page\n\nTPF 1.394 {LINK}.\n\nTPF 1.777 {LINK}.\n")
    assert main(["--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert "docs/page.md:5: 1.777: in none of the linked files: results/studies/demo/README.md" in err
    assert "docs/page.md:3:" not in err
    (root / "docs" / "page.md").write_text(f"# Page\n\nTPF 1.394 {LINK}.\n")
    assert main(["--root", str(root), "--list"]) == 0
    assert "docs/page.md:3: 1.394: results/studies/demo/README.md" in capsys.readouterr().out
    assert main(["--root", str(tmp_path / "nowhere")]) == 2


def test_the_folder_link_reads_one_level_down(tmp_path):
    doc = "# Page\n\nTwo threads: 11.71 G FMAs/s ([demo](../results/studies/demo/)).\n"
    assert problems(tmp_path, doc) == []
    assert figures.FOLDER_SUFFIXES == {".md", ".json", ".txt"}

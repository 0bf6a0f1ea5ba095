"""``jf-jax results``: docs/results.md and README's headline table are generated from results/<run>/, and
``--check`` says when they are stale (the real repository's included)."""

import json
from pathlib import Path

import yaml

from jf_jax.cli.results import END, START, main

ROOT = Path(__file__).resolve().parent.parent


LOOPING = [7, 8, 9, 10] * 32  # 128 tokens, one 4-token phrase over and over: cut by the cap, so it loops
PLAIN = list(range(50))  # 50 tokens, no repeated 4-gram


def speed_cell(method, tpf, tokens_per_s, block_size=None, speedup=None, answers=None):
    cell = dict(method=method, prompts=2, tokens=100, forwards=round(100 / tpf), tpf=tpf, tpf_mean=tpf,
                tokens_per_s=tokens_per_s, tokens_per_s_no_prefill=tokens_per_s, match_ar=1.0)
    if block_size is not None:  # the current evaluate records these; the first evaluations did not
        cell.update(block_size=block_size, speedup=speedup)
    if answers is not None:  # the first evaluations' per-prompt fields: the answers and their TPF
        cell.update(token_ids=[ids for ids, _ in answers], per_prompt_tpf=[t for _, t in answers])
    return cell


def write_run(folder: Path, *, what, config, reports, export_diff=None):
    folder.mkdir(parents=True)
    (folder / "NOTES.md").write_text(f"# {folder.name}\n\n{what}\n\nLonger notes.\n")
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    for name, report in reports.items():
        (folder / name).write_text(json.dumps(report))
    if export_diff is not None:
        (folder / "export_check.json").write_text(json.dumps(dict(max_abs_logit_diff=export_diff)))


def fake_tree(root: Path) -> Path:
    """Two runs of one recipe (a current-format round 2, a first-format round 1) and one study."""
    base = dict(name="smollm2-135m", model="smollm2-135m", speed={})
    round2_speed = dict(args=dict(block_size=[8, 16], device="CPU (2 cores)", dtype="bfloat16", max_new_tokens=128),
                        results=[
        dict(base, speed={"code_heldout": {"ar": speed_cell("ar", 1.0, 50.0), "jacobi n=16": speed_cell(
            "jacobi", 1.111, 30.0, 16, 0.6)}}),
        dict(name="demo_r2", model="runs/demo_r2", dtype="bfloat16", speed={"code_heldout": {
            "ar": speed_cell("ar", 1.0, 50.0, None),
            "jacobi n=8": speed_cell("jacobi", 1.3, 45.0, 8, 0.9),
            "jacobi n=16": speed_cell("jacobi", 1.456, 40.0, 16, 0.8123, answers=[(LOOPING, 2.0), (PLAIN, 1.25)]),
            "mr n=16": speed_cell("mr", 1.789, 20.0, 16, 0.4)}})])
    round2_quality = dict(args={}, results=[dict(name="demo_r2", speed={}, math=dict(
        problems=20, correct=3, accuracy=0.15), humaneval=dict(problems=164, passed=7, pass_at_1=7 / 164))])
    write_run(root / "results" / "demo_r2", what="Round 2 of the demo recipe.",
              config=dict(run_name="demo_r2", model=dict(source="run", path="runs/demo"),
                          data=dict(block_size=32, batch_size=4), train=dict(steps=150)),
              reports={"speed.json": round2_speed, "quality.json": round2_quality}, export_diff=9.87e-5)
    # the first evaluations: block size only in the arguments, no speedup: x AR = tok/s over AR's
    round1_eval = dict(args=dict(block_size=8), results=[base, dict(name="demo", speed={"code_heldout": {
        "ar": speed_cell("ar", 1.0, 20.0), "jacobi": speed_cell("jacobi", 1.222, 10.0),
        "mr": speed_cell("mr", 1.333, 5.0)}}, math=dict(problems=20, correct=2, accuracy=0.1))])
    write_run(root / "results" / "demo", what="Round 1 of the demo recipe.",
              config=dict(run_name="demo", model=dict(source="pretrained", path="smollm2-135m"),
                          data=dict(block_size=8, batch_size=1), train=dict(steps=600)),
              reports={"eval.json": round1_eval})
    study = root / "results" / "studies" / "speed_probe"
    study.mkdir(parents=True)
    (study / "README.md").write_text("# A probe of the decode speed\n\ntext\n")
    (root / "README.md").write_text(f"# Project\n\nintro\n\n{START}\nold table\n{END}\n\nrest\n")
    return root


def test_the_index_holds_each_runs_numbers(tmp_path):
    root = fake_tree(tmp_path)
    assert main(["--root", str(root)]) == 0
    index = (root / "docs" / "results.md").read_text()
    r2 = next(line for line in index.splitlines() if line.startswith("| [demo_r2]"))
    # n = 16 preferred over 8; x AR as recorded; the run's own model, not the base listed first
    assert "Round 2 of the demo recipe." in r2 and "| 32 | 4 | 150 | [demo](../results/demo/) |" in r2
    assert ("| CPU (2 cores; kind not recorded), bfloat16 | 16 | 1.456 / 1.250 (1 of 2 loop; 0.81x) "
            "| 1.789 / — (0.40x) | 1.00 | 7/164 (0.043) | 3/20 "
            "| 9.9e-05 |") in r2
    r1 = next(line for line in index.splitlines() if line.startswith("| [demo]"))
    # the old format: block size from the arguments, x AR computed from tok/s, GSM8K from eval.json
    assert ("| 8 | 1 | 600 | smollm2-135m | CPU (kind not recorded) | 8 | 1.222 / — (0.50x) | 1.333 / — (0.25x) "
            "| 1.00 | — | 2/20 | — |") in r1
    assert index.index("[demo]") < index.index("[demo_r2]")  # sorted by name
    assert "- [speed_probe](../results/studies/speed_probe/): A probe of the decode speed" in index
    readme = (root / "README.md").read_text()
    # the headline: every run measured at n = 16 (round 1 was not measured there)
    assert readme.startswith("# Project\n\nintro\n\n" + START + "\n") and readme.endswith(END + "\n\nrest\n")
    assert "old table" not in readme
    assert ("| [demo_r2](results/demo_r2/) | CPU (2 cores; kind not recorded), bfloat16 "
            "| 1.456 / 1.250 (1 of 2 loop; 0.81x) | 1.789 / — (0.40x) |") in readme
    assert "[demo](results/demo/)" not in readme


def test_speed_files_under_the_stats_schema_are_read_too(tmp_path):
    """evaluate now writes ``decoding.stats``' names (speedup_vs_ar, tokens_per_second); the committed files keep
    the old ones (speedup, tokens_per_s): the index reads both."""
    root = fake_tree(tmp_path)

    def cell(method, tpf, rate, speedup=None):
        per_prompt = [dict(tokens=60, forwards=40, loops=False), dict(tokens=40, forwards=20, loops=True)]
        return dict(method=method, block_size=16, prompts=2, tokens=100, forwards=round(100 / tpf), tpf=tpf,
                    mean_tpf=tpf, mean_tpf_ci95=[tpf, tpf], loop_rate=0.5, tokens_per_second=rate,
                    tokens_per_second_excl_prefill=rate, match_ar=0.5, speedup_vs_ar=speedup, per_prompt=per_prompt)

    speed = dict(args=dict(block_size=[16]), results=[dict(name="demo_r3", dtype="float32", speed={"code_heldout": {
        "ar": cell("ar", 1.0, 40.0, 1.0), "jacobi n=16": cell("jacobi", 1.5, 30.0, 0.75),
        "mr n=16": cell("mr", 1.75, 10.0)}})])  # mr without speedup_vs_ar: its tokens/s over AR's
    write_run(root / "results" / "demo_r3", what="Round 3.", config=dict(run_name="demo_r3"),
              reports={"speed.json": speed})
    assert main(["--root", str(root)]) == 0
    r3 = next(line for line in (root / "docs" / "results.md").read_text().splitlines()
              if line.startswith("| [demo_r3]"))
    # half the answers differ from AR's: no speed is shown; the looping answer is counted and left out
    assert ("| CPU (kind not recorded), float32 | 16 | 1.500 / 1.500 (1 of 2 loop; not = AR) "
            "| 1.750 / 1.500 (1 of 2 loop; not = AR) | 0.50 |") in r3


def test_check_finds_a_stale_index_and_writes_nothing(tmp_path, capsys):
    root = fake_tree(tmp_path)
    assert main(["--root", str(root), "--check"]) == 1  # nothing generated yet
    assert not (root / "docs" / "results.md").exists()
    assert main(["--root", str(root)]) == 0
    assert main(["--root", str(root), "--check"]) == 0
    capsys.readouterr()
    assert main(["--root", str(root)]) == 0 and capsys.readouterr().out == ""  # regenerating changes nothing
    before = (root / "docs" / "results.md").read_text()
    quality = root / "results" / "demo_r2" / "quality.json"
    quality.write_text(quality.read_text().replace('"passed": 7', '"passed": 8'))
    assert main(["--root", str(root), "--check"]) == 1
    assert "docs/results.md" in capsys.readouterr().err
    assert (root / "docs" / "results.md").read_text() == before


def test_a_readme_without_markers_is_left_alone(tmp_path):
    root = fake_tree(tmp_path)
    (root / "README.md").write_text("# Project\n\nno table here\n")
    assert main(["--root", str(root)]) == 0
    assert (root / "README.md").read_text() == "# Project\n\nno table here\n"


def test_the_repository_index_is_up_to_date():
    """docs/results.md (and README's table, if it has the markers) match results/: run
    `python -m jf_jax.cli.results` after changing a run folder."""
    assert main(["--root", str(ROOT), "--check"]) == 0


def test_no_bit_claims_for_accelerators_in_the_docs():
    """On GPUs only tokens were compared and no TPU ever ran: README and docs/ must not claim bit equality there
    (a line naming an accelerator and a bit claim must also say 'not')."""
    import re

    claim = re.compile(r"bit[- ]?(equal|exact|for bit|identical)|same bits", re.IGNORECASE)
    device = re.compile(r"GPU|TPU|H100|H200|A100|B200")
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}"
             for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if claim.search(line) and device.search(line) and not re.search(r"\bnot\b", line, re.IGNORECASE)]
    assert not found, "\n".join(found)

"""Collection / evaluation launchers and training-run loading, on a tiny random model (offline, fast)."""

import dataclasses
import json
import os

import numpy as np
import pytest

from jf_jax.weights import run_dir as rd
from jf_jax import weights
from jf_jax.training.trajectories import load_responses, read_manifest
from tests.support.train_models import TINY, numpy_params

EOS = 1


class ByteTokenizer:
    """A stand-in tokenizer: characters -> ids in [2, 48)."""

    eos_ids = (EOS,)
    pad_id = 0

    def encode(self, text):
        return [2 + ord(c) % 46 for c in text]

    def decode(self, ids):
        return "".join(chr(65 + (i % 26)) if i != EOS else "" for i in ids)

    def apply_chat_template(self, prompt, add_generation_prompt=True):
        return f"<u>{prompt}<a>"


@dataclasses.dataclass
class FakeModel:
    cfg: object = TINY
    params: dict = dataclasses.field(default_factory=lambda: numpy_params(TINY, 0))
    tokenizer: ByteTokenizer = dataclasses.field(default_factory=ByteTokenizer)
    name: str = "tiny"
    source: str = "memory"


# One length bucket: one compile.
ROWS = [dict(id=f"p{i}", domain="code" if i % 2 else "math", prompt=f"prompt number {i} " * 2, answer=str(i))
        for i in range(5)]


def test_select_prompts():
    from jf_jax.cli.collect import select_prompts

    assert [r["id"] for r in select_prompts(ROWS, "math", None)] == ["p0", "p2", "p4"]
    assert [r["id"] for r in select_prompts(ROWS, None, 2)] == ["p0", "p1"]
    assert [r["id"] for r in select_prompts(ROWS, "code, math", 4)] == ["p0", "p1", "p2", "p3"]
    assert [r["id"] for r in select_prompts(ROWS, None, 2, offset=3)] == ["p3", "p4"]
    assert [r["id"] for r in select_prompts(ROWS, "math", None, offset=1)] == ["p2", "p4"]


def test_collect_cli_names_a_bad_model_without_a_traceback(tmp_path, capsys):
    from jf_jax.cli.collect import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(ROWS[0]) + "\n")
    assert main(["--model", str(tmp_path / "missing.gguf"), "--prompts", str(prompts),
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown model") and "Traceback" not in err


def _no_model(*args, **kwargs):
    raise AssertionError("a model was loaded before the output path was checked")


def test_collect_cli_refuses_an_unwritable_out_before_loading_a_model(tmp_path, monkeypatch, capsys):
    import jf_jax.api
    from jf_jax.cli.collect import main

    monkeypatch.setattr(jf_jax.api, "load_model", _no_model)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(ROWS[0]) + "\n")
    out = prompts / "traj"  # under a regular file: no one can create it, root included
    assert main(["--model", "smollm2-135m", "--prompts", str(prompts), "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: cannot write --out {out}: {prompts} is not a directory"]
    assert main(["--model", "smollm2-135m", "--prompts", str(prompts), "--out", str(prompts)]) == 2  # a file itself
    assert f"{prompts} is not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--batch-size", "4", "--decode-shape", "1x8"], "the fixed decode shape 1x8"),
    (["--decode-shape", "1x32"], "give --batch-size > 1 with it"),
    (["--decode-shape", "wide"], "ROWSxWIDTH"),
])
def test_collect_cli_refuses_a_decode_shape_it_cannot_use_before_loading_a_model(tmp_path, monkeypatch, capsys, args,
                                                                                  message):
    import jf_jax.api
    from jf_jax.cli.collect import main

    monkeypatch.setattr(jf_jax.api, "load_model", _no_model)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(ROWS[0]) + "\n")
    assert main(["--prompts", str(prompts), "--out", str(tmp_path / "t"), "--block-size", "16", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --decode-shape") and message in err and "Traceback" not in err


def test_output_dir_check_creates_the_directory_and_leaves_nothing_in_it(tmp_path):
    from jf_jax.cli.output_paths import directory_problem

    target = tmp_path / "new" / "deeper"
    assert directory_problem(str(target)) is None
    assert target.is_dir() and os.listdir(target) == []
    assert directory_problem(str(target)) is None  # an existing directory (a run or a collection to resume)


def test_collect_writes_resumable_trajectories(tmp_path):
    from jf_jax.cli.collect import run_collect

    model, out = FakeModel(), str(tmp_path / "traj")
    m = run_collect(model, ROWS[:3], out, block_size=4, max_new_tokens=8, prompts_per_shard=2, progress=False)
    assert [s["prompt_end"] for s in m["shards"]] == [2, 3]
    assert m["metadata"]["block_size"] == 4 and m["metadata"]["prompt_ids"] == ["p0", "p1", "p2"]
    responses = load_responses(out)
    assert len(responses) + sum(s["num_filtered"] for s in m["shards"]) == 3
    for recs in responses:
        assert 1 <= len(recs) <= 2
        for r in recs:
            assert r.states.shape[1] == 4 and r.states.shape[0] >= 2  # random draft + ... + fixed point
    # Resume after a "kill" that lost the last shard: only that shard is redone, identically.
    manifest = read_manifest(out)
    last = manifest["shards"].pop()
    os.remove(os.path.join(out, last["file"]))
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    m2 = run_collect(model, ROWS[:3], out, block_size=4, max_new_tokens=8, prompts_per_shard=2, progress=False)
    assert m2["shards"] == m["shards"]
    again = load_responses(out)
    assert all(np.array_equal(a.states, b.states) for ra, rb in zip(responses, again) for a, b in zip(ra, rb))


def test_batched_collection_writes_the_sequential_collections_records(tmp_path):
    from jf_jax.cli.collect import run_collect

    model = FakeModel()
    runs = {b: str(tmp_path / f"b{b}") for b in (1, 3)}
    for b, out in runs.items():
        m = run_collect(model, ROWS[:3], out, block_size=4, max_new_tokens=8, prompts_per_shard=2, progress=False,
                        batch_size=b)
        assert sum(s["num_mismatched"] for s in m["shards"]) == 0
    one, batched = (load_responses(runs[b]) for b in (1, 3))
    assert [len(r) for r in one] == [len(r) for r in batched] and one
    for ra, rb in zip(one, batched):
        for a, b in zip(ra, rb):
            assert (a.example_id, a.block_index) == (b.example_id, b.block_index)
            np.testing.assert_array_equal(a.prompt_ids, b.prompt_ids)
            np.testing.assert_array_equal(a.states, b.states)


def test_collect_repetition_filter(tmp_path, monkeypatch):
    import jf_jax.cli.collect as collect_mod

    def fake_record_shard_factory(*a, **k):  # "5 5 5 ..." degenerate
        return lambda example_ids, prompts: [[np.tile(np.array([[5, 5, 5, 5]], np.int32), (2, 1))] * 3 for _ in prompts]

    monkeypatch.setattr(collect_mod, "make_record_shard", fake_record_shard_factory)
    m = collect_mod.run_collect(FakeModel(), ROWS[:2], str(tmp_path / "t"), block_size=4, max_new_tokens=12,
                                repetition_filter=True, progress=False)
    assert sum(s["num_filtered"] for s in m["shards"]) == 2
    assert sum(s["num_records"] for s in m["shards"]) == 0


def test_evaluate_model_and_markdown(tmp_path):
    from jf_jax.eval.answer_quality import repeat_fraction
    from jf_jax.eval.evaluation import evaluate_model
    from jf_jax.eval.report import markdown

    model = FakeModel()
    res = evaluate_model("tiny", {"held": ROWS[:2], "seen": ROWS[2:3]}, ROWS[:2], methods=["ar", "mr"],
                         block_sizes=(4,), max_new_tokens=8, math_max_new_tokens=8, model=model,
                         train_sets=("seen",))  # jacobi takes mr's code path
    speed = res["speed"]["held"]
    assert set(speed) == {"ar", "mr n=4"} and res["train_sets"] == ["seen"]
    assert speed["ar"]["tpf"] == pytest.approx(1.0)
    for m in ("mr n=4",):
        assert speed[m]["tpf"] >= 1.0 and speed[m]["match_ar"] == 1.0  # greedy Jacobi/MR are lossless
        assert speed[m]["tokens"] == speed["ar"]["tokens"]
    # per prompt: the decoder's statistics and each answer's repeat fraction and loop flag, under the schema's names
    for cell in speed.values():
        assert len(cell["per_prompt"]) == cell["prompts"] == 2 and len(cell["token_ids"]) == 2
        for record, ids in zip(cell["per_prompt"], cell["token_ids"]):
            assert record["tpf"] == pytest.approx(record["tokens"] / record["forwards"])
            assert record["repeat_fraction"] == repeat_fraction(ids) and isinstance(record["loops"], bool)
        assert cell["mean_tpf"] == pytest.approx(sum(p["tpf"] for p in cell["per_prompt"]) / 2)
        assert cell["mean_tpf_ci95"][0] <= cell["mean_tpf"] <= cell["mean_tpf_ci95"][1]
        assert cell["loop_rate"] == sum(p["loops"] for p in cell["per_prompt"]) / 2
        assert cell["without_loops"] is None or cell["without_loops"]["prompts"] == 2 - sum(
            p["loops"] for p in cell["per_prompt"])
    assert res["math"]["problems"] == 2 and 0.0 <= res["math"]["accuracy"] <= 1.0
    # the math answers are decoded as one batch; they equal the one-at-a-time greedy AR answers
    assert [i["text"] for i in res["math"]["items"]] == [model.tokenizer.decode(t) for t in speed["ar"]["token_ids"]]
    md = markdown([res], dict(block_size=4, max_new_tokens=8))
    assert speed["ar"]["speedup_vs_ar"] == 1.0 and speed["mr n=4"]["speedup_vs_ar"] > 0
    assert "| tiny | held | mr n=4 |" in md and "| tiny | seen (train) | mr n=4 |" in md and "GSM held-out" in md
    assert "| loop rate |" in md and "| TPF (mean/prompt) without loops |" in md and "(train) hold prompts" in md
    scored = dict(res, humaneval=dict(problems=2, max_new_tokens=8, passed=1, pass_at_1=0.5),
                  humaneval_nll=dict(problems=3, nll_per_token=1.0))
    nll_only = dict(res, model="nll-only", humaneval_nll=dict(problems=164, nll_per_token=0.5))
    md = markdown([scored, nll_only], dict(block_size=4, max_new_tokens=8, quality_dtype="bfloat16"))
    assert "HumanEval, in bfloat16: greedy AR answers" in md and "| tiny | 2 | 8 | 1 | 0.500 | 3 | 1.000 |" in md
    assert "| nll-only | - | - | - | - | 164 | 0.500 |" in md


def test_evaluate_cli_refuses_an_unwritable_out_before_loading_a_model(tmp_path, monkeypatch, capsys):
    import jf_jax.api
    from jf_jax.cli.evaluate import main
    from jf_jax.cli.evaluate_options import out_error

    monkeypatch.setattr(jf_jax.api, "load_model", _no_model)
    prompts = tmp_path / "held.jsonl"
    prompts.write_text(json.dumps(ROWS[0]) + "\n")
    out = prompts / "results" / "eval"  # OUT.json / OUT.md under a regular file
    args = ["--model", "smollm2-135m", "--prompts", str(prompts), "--math", str(prompts), "--out"]
    assert main(args + [str(out)]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: cannot write --out {out}: {prompts} is not a directory"]
    (tmp_path / "eval.json").mkdir()  # OUT.json taken by a directory
    assert main(args + [str(tmp_path / "eval")]) == 2
    assert f"{tmp_path / 'eval.json'} is a directory" in capsys.readouterr().err
    assert out_error(str(tmp_path / "reports" / "eval")) is None and os.listdir(tmp_path / "reports") == []


def test_evaluate_cli_refuses_two_prompt_sets_of_one_name(tmp_path, monkeypatch, capsys):
    import jf_jax.api
    from jf_jax.cli.evaluate import main

    monkeypatch.setattr(jf_jax.api, "load_model", _no_model)
    for folder in ("held", "train"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "code.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    args = ["--model", "smollm2-135m", "--prompts", str(tmp_path / "held" / "code.jsonl"), "--train-prompts",
            str(tmp_path / "train" / "code.jsonl"), "--out", str(tmp_path / "eval")]
    assert main(args) == 2  # a set is named by its file's stem: the train set would overwrite the held-out one
    assert "two prompt files share a name (code, code)" in capsys.readouterr().err


def test_humaneval_answer_nll_scores_the_solution_tokens_and_ignores_padding():
    import jax

    from jf_jax.api import encode_prompts
    from jf_jax.data.humaneval import humaneval_prompt
    from jf_jax.eval.quality import humaneval_answer_nll
    from jf_jax.model.transformer import forward_logits

    model = FakeModel()
    problems = [dict(task_id=f"T/{i}", prompt=f"\ndef f{i}(x):\n    'doc'\n",
                     canonical_solution=f"    return x + {i}\n") for i in range(2)]
    padded = humaneval_answer_nll(model, problems, bucket=64)
    exact = humaneval_answer_nll(model, problems, bucket=1)
    assert padded["nll_per_token"] == pytest.approx(exact["nll_per_token"], rel=1e-5)
    # by hand for problem 0: the solution's tokens are those after the head's (this tokenizer never merges)
    prompt = encode_prompts(model, [humaneval_prompt(problems[0])])[0]
    head = model.tokenizer.encode("```python\n" + problems[0]["prompt"].lstrip("\n"))
    solution = model.tokenizer.encode("    return x + 0\n```")
    ids = np.array([prompt + head + solution], np.int32)
    logp = np.asarray(jax.nn.log_softmax(forward_logits(model.params, model.cfg, ids)[0], axis=-1))[0]
    first = len(prompt) + len(head)
    want = -sum(logp[t - 1, ids[0, t]] for t in range(first, ids.shape[1]))
    assert exact["items"][0]["tokens"] == len(solution)
    assert exact["items"][0]["nll"] == pytest.approx(want, rel=1e-5)


def test_evaluate_cli_scores_humaneval_solutions_without_decoding(tmp_path, monkeypatch):
    """--humaneval-nll K alone: the first K solutions' NLL, no answer decoded or executed."""
    import jf_jax.api
    from jf_jax.cli.evaluate import main
    from jf_jax.data import humaneval as he
    from jf_jax.eval.quality import humaneval_answer_nll

    problems = [dict(task_id=f"T/{i}", prompt=f"\ndef f{i}(x):\n    'doc'\n", canonical_solution=f"    return {i}\n")
                for i in range(3)]
    monkeypatch.setattr(jf_jax.api, "load_model", lambda *a, **k: FakeModel())
    monkeypatch.setattr(he, "fetch", lambda: "wheel")
    monkeypatch.setattr(he, "load_problems", lambda wheel: problems)

    def no_decoding(*args, **kwargs):
        raise AssertionError("--humaneval-nll alone decoded answers")

    monkeypatch.setattr(jf_jax.api, "generate", no_decoding)
    out = tmp_path / "nll"
    assert main(["--model", "tiny", "--humaneval-nll", "2", "--quality-dtype", "float32", "--out", str(out)]) == 0
    res = json.loads((tmp_path / "nll.json").read_text())["results"][0]
    assert res["humaneval"] is None and res["humaneval_nll"]["problems"] == 2
    assert res["humaneval_nll"]["nll_per_token"] == pytest.approx(
        humaneval_answer_nll(FakeModel(), problems[:2])["nll_per_token"], rel=1e-6)
    assert "| tiny | - | - | - | - | 2 |" in (tmp_path / "nll.md").read_text()


def _export_tiny_run(path, base=None):
    import jax

    os.makedirs(path, exist_ok=True)
    params = jax.tree.map(np.asarray, numpy_params(TINY, 1))
    rd.export_params(str(path), TINY, params)
    rd.save_base_model(str(path), base)
    return params


def test_weights_load_run_dir(tmp_path, monkeypatch):
    run = tmp_path / "run"
    params = _export_tiny_run(run, base="some-base-spec")
    kind, source, name = weights.resolve(str(run))
    assert (kind, source, name) == ("run", str(run), "run")
    real_load = weights.load

    def fake_load(spec, dtype="float32", cache=True):
        if spec == "some-base-spec":
            return weights.LoadedModel(cfg=TINY, params={}, tokenizer=ByteTokenizer(), name="base", source="x")
        return real_load(spec, dtype=dtype, cache=cache)

    monkeypatch.setattr(weights, "load", fake_load)
    loaded = fake_load(str(run))
    assert isinstance(loaded.tokenizer, ByteTokenizer) and loaded.source == str(run)
    assert loaded.cfg.vocab_size == TINY.vocab_size
    np.testing.assert_array_equal(np.asarray(loaded.params["embed"]), params["embed"])


def test_weights_load_run_dir_without_base_is_refused(tmp_path):
    run = tmp_path / "run"
    _export_tiny_run(run, base=None)
    with pytest.raises(weights.WeightsError, match="no base_model.json"):
        weights.load(str(run))


def test_base_model_spec_inherited(tmp_path):
    from jf_jax.training.config import config_from_dict
    from jf_jax.training.setup import base_model_spec

    parent = tmp_path / "r1"
    _export_tiny_run(parent, base="smollm2-135m")
    data = dict(source="trajectories", path="x")
    assert base_model_spec(config_from_dict(dict(model=dict(source="pretrained", path="smollm2-135m"),
                                                 data=data))) == "smollm2-135m"
    assert base_model_spec(config_from_dict(dict(model=dict(source="run", path=str(parent)), data=data))) \
        == "smollm2-135m"
    assert base_model_spec(config_from_dict(dict(model=dict(source="random", config=TINY.to_dict()),
                                                 data=data))) is None


@pytest.mark.parametrize("name", ["smollm2_jf", "smollm2_jf_r2", "smollm2_jf_n16", "smollm2_jf_n16_r2",
                                  "smollm2_jf_n16_b4", "smollm2_jf_n16_b4_r2", "smollm2_jf_n16_b4_r3",
                                  "smollm2_jf_n16_b4_r4", "smollm2_jf_n16_b4_r4b", "smollm2_jf_n16_b4_r4o",
                                  "smollm2_smoke", "tiny",
                                  "gpu_smollm2_jf_n16"])
def test_configs_load(name):
    from jf_jax.training.config import load_config

    cfg = load_config(f"configs/{name}.yaml")
    if name == "smollm2_jf":
        assert (cfg.model.source, cfg.model.path, cfg.data.block_size) == ("pretrained", "smollm2-135m", 8)
        assert len(cfg.data.path) == 2  # the two parallel collection workers
    if name == "smollm2_jf_r2":
        assert (cfg.model.source, cfg.model.path) == ("run", "runs/smollm2_jf_r1")
        assert cfg.data.block_size == 16
        assert cfg.data.block_size > load_config("configs/smollm2_jf.yaml").data.block_size
    if name == "smollm2_jf_n16":
        assert (cfg.model.source, cfg.data.block_size, cfg.model.compute_dtype) == ("pretrained", 16, "bfloat16")
    if name == "smollm2_jf_n16_r2":  # progressive: re-collect with round 1 at twice its block size
        assert (cfg.model.source, cfg.model.path, cfg.data.block_size) == ("run", "runs/smollm2_jf_n16", 32)
    if name == "smollm2_jf_n16_b4":  # n16's data and example count, four examples a step
        n16 = load_config("configs/smollm2_jf_n16.yaml")
        assert cfg.data.path == n16.data.path and cfg.loss.ar_teacher == "reference"
        assert cfg.data.batch_size * cfg.train.steps == n16.data.batch_size * n16.train.steps
    if name == "smollm2_jf_n16_b4_r2":  # n16_r2's progression and example count from the batch-4 model
        r2 = load_config("configs/smollm2_jf_n16_r2.yaml")
        assert (cfg.model.source, cfg.model.path, cfg.data.block_size) == ("run", "runs/smollm2_jf_n16_b4", 32)
        assert cfg.data.batch_size * cfg.train.steps == r2.data.batch_size * r2.train.steps
        assert cfg.loss.ar_teacher == "reference" and cfg.data.window == r2.data.window
    if name == "smollm2_jf_n16_b4_r4":  # round 3's recipe, from round 3's model, with more data
        r3 = load_config("configs/smollm2_jf_n16_b4_r3.yaml")
        assert (cfg.model.path, cfg.loss, cfg.optim, cfg.train) == ("runs/smollm2_jf_n16_b4_r3", r3.loss, r3.optim,
                                                                    r3.train)
        assert len(cfg.data.path) == 4 and cfg.data.block_size == r3.data.block_size == 32
    if name == "smollm2_jf_n16_b4_r4b":  # round 4's data and recipe, continued from its weights
        r4 = load_config("configs/smollm2_jf_n16_b4_r4.yaml")
        assert (cfg.model.path, cfg.data.path, cfg.loss, cfg.optim) == ("runs/smollm2_jf_n16_b4_r4", r4.data.path,
                                                                        r4.loss, r4.optim)
    if name == "smollm2_jf_n16_b4_r4o":  # round 4 without its extra prompts: round 3's recipe, weights, epochs
        r3, r4 = load_config("configs/smollm2_jf_n16_b4_r3.yaml"), load_config("configs/smollm2_jf_n16_b4_r4.yaml")
        assert (cfg.model.path, cfg.loss, cfg.optim, cfg.train) == ("runs/smollm2_jf_n16_b4_r3", r3.loss, r3.optim,
                                                                    r3.train)
        assert cfg.data.path == r4.data.path[:2] and all("extra" not in p for p in cfg.data.path)
    if name == "gpu_smollm2_jf_n16":  # n16_b4's recipe; one bucket (one compile of the step on a GPU)
        b4 = load_config("configs/smollm2_jf_n16_b4.yaml")
        assert (cfg.loss, cfg.data.block_size, cfg.data.window) == (b4.loss, 16, b4.data.window)
        assert cfg.data.buckets == (640,) and cfg.model.path == "smollm2-135m"


@pytest.mark.parametrize("mode", ["n16", "n16_b4", "n16_r2", "n16_b4_r2", "n16_b4_r3", "n16_b4_r4"])
def test_each_round_study_collects_what_its_config_trains_on(mode):
    """configs/studies/smollm2_MODE.yaml collects at its config's block size with the model its config continues
    from, and trains the run the next round's config starts from (runs/<run_name>)."""
    from jf_jax.pipeline.spec import read_study
    from jf_jax.training.config import load_config

    study = read_study(f"configs/studies/smollm2_{mode}.yaml")
    cfg = load_config(study.train.config)
    assert study.train.config == f"configs/smollm2_jf_{mode}.yaml" and study.name == cfg.run_name
    assert study.results == f"results/{cfg.run_name}" and [a.run_dir for a in study.arms] == [f"runs/{cfg.run_name}"]
    assert dict(study.collect.options)["block-size"] == cfg.data.block_size
    assert study.collect.model == ("smollm2-135m" if cfg.model.source == "pretrained" else cfg.model.path)
    sources = [s.prompts for s in study.collect.sources]
    assert sources == ["train_v1.jsonl"] + (["train_extra.jsonl"] if mode == "n16_b4_r4" else [])


def _run_study(module: str, *args: str):
    """A study run as its user runs it: ``python -m jf_jax.benchmarks.MODULE ARGS`` in a process of its own."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", f"jf_jax.benchmarks.{module}", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("bad", ["no colon here", ": x=1", "base: x=1", "a/b: x=1"])
def test_ablation_refuses_a_bad_variant_in_one_line(bad, tmp_path):
    proc = _run_study("ablation", "configs/tiny.yaml", "--steps", "1", "--prompts", str(tmp_path / "none.jsonl"),
                      "--out", str(tmp_path / "out"), "--variant", bad)
    assert proc.returncode == 2 and "NAME" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("config, overrides, named", [
    ("configs/tiny.yaml", [], "model.path"),
    ("configs/smollm2_smoke.yaml", ["data.path=NOWHERE"], "NOWHERE"),
])
def test_ablation_refuses_a_missing_model_or_data_before_measuring(config, overrides, named, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "x"}\n')
    proc = _run_study("ablation", config, *overrides, "--steps", "1", "--prompts", str(prompts),
                      "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and named in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "out.jsonl").exists()  # nothing measured


_ABLATION_TABLE = (
    "# {title}  (the layout jf_jax.benchmarks.ablation writes)\n\n"
    "| variant | overrides | TPF | vs base | TPF (mean/prompt) | mean TPF 95% interval | loop rate "
    "| TPF (mean/prompt) without loops | loss/ar | loss/consistency | train s | same as base | HumanEval NLL |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    "| base | - | {base_tpf} | {base_tpf} | 1.000 | [0.900, 1.100] | 0.00 | 1.000 | - | - | - | 1.00 | 0.750 |\n"
    "| kl | loss.ar_teacher=reference | 1.250 | 1.250 | 1.300 | [1.100, 1.500] | 0.33 | 1.200 | 0.500 | 0.250 "
    "| 3 | 0.50 | 0.875 |\n")


def test_lever_tradeoff_plot_reads_ablation_tables(tmp_path):
    a, b, plain = tmp_path / "a.md", tmp_path / "b.md", tmp_path / "plain.md"
    a.write_text(_ABLATION_TABLE.format(title="a", base_tpf="1.000"))
    proc = _run_study("lever_plot", str(a), str(a), "--out", str(tmp_path / "t.png"))
    assert proc.returncode == 0 and (tmp_path / "t.png").stat().st_size, proc.stderr
    b.write_text(_ABLATION_TABLE.format(title="b", base_tpf="1.500"))
    proc = _run_study("lever_plot", str(a), str(b), "--out", str(tmp_path / "u.png"))
    assert proc.returncode == 2 and "base rows differ" in proc.stderr  # measured differently: refused, not drawn
    plain.write_text("\n".join(line.rsplit("|", 2)[0] + "|" if line.startswith("|") else line
                               for line in _ABLATION_TABLE.format(title="p", base_tpf="1.000").splitlines()))
    proc = _run_study("lever_plot", str(plain), "--out", str(tmp_path / "v.png"))
    assert proc.returncode == 2 and "no HumanEval NLL column" in proc.stderr


def test_code_quality_checks():
    from jf_jax.eval.code_quality import check_answer, function_name

    assert function_name("Write a Python function `wrap(text, width=70)` that does") == "wrap"
    good = "Sure:\n```python\ndef wrap(text, width=70):\n    return [text]\n```\n"
    assert check_answer(good, "wrap") == dict(closed_block=True, parses=True, defines=True)
    assert check_answer(good, "dedent") == dict(closed_block=True, parses=True, defines=False)
    assert check_answer("```python\ndef wrap(text:\n```", "wrap") == dict(closed_block=True, parses=False,
                                                                         defines=False)
    assert check_answer("```python\ndef wrap(text):\n    return", "wrap")["closed_block"] is False  # cut off


def test_collect_refuses_a_prompt_too_long_for_the_context_before_decoding(tmp_path):
    from jf_jax.cli.collect import PromptTooLongError, run_collect

    model = FakeModel()
    rows = ROWS[:2] + [dict(id="long", domain="code", prompt="x" * model.cfg.max_position_embeddings)]
    with pytest.raises(PromptTooLongError, match="'long'"):
        run_collect(model, rows, str(tmp_path / "t"), block_size=4, max_new_tokens=8, progress=False)
    assert not (tmp_path / "t").exists()  # refused before the collection directory was started

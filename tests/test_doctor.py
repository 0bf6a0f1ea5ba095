"""What the machine gives the decode engine (``jf_jax.model.machine``), decided from injected facts: the CPU's
features, whether the kernels run, which path each dtype takes, the dtype ``auto`` picks; whether a kernel test
runs, skips or fails (``tests.support.kernel_gate``); and ``python -m jf_jax.doctor`` on this machine."""

import json

import pytest

from cpu_kernels import library
from jf_jax.cli import decode, doctor
from jf_jax.cli.main import main as jf_jax_main
from jf_jax.model import machine
from jf_jax.model.machine import Machine
from tests.support import kernel_gate

AVX2 = frozenset("fpu sse2 avx avx2 fma f16c bmi2".split())
AVX512_BF16 = AVX2 | {"avx512f", "avx512bw", "avx512_bf16", "avx512_vnni"}
CPUINFO = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\n"


def cpu(flags, library_problem=None, avx2_problem="same", **kw) -> Machine:
    """A CPU machine with ``flags`` (None: unknown), its kernel verdicts derived as ``machine.detect`` derives them;
    ``library_problem`` is both libraries' unless ``avx2_problem`` says otherwise (one build makes both)."""
    return Machine(backend="cpu", devices=("cpu",), cpu_model="test CPU", cpu_flags=flags, cores=2,
                   avx512_machine_reason=library.machine_reason("cpu", flags), avx512_library_problem=library_problem,
                   avx2_machine_reason=library.machine_reason("cpu", flags, library.AVX2),
                   avx2_library_problem=library_problem if avx2_problem == "same" else avx2_problem, **kw)


def test_cpuinfo_is_read_for_flags_and_model():
    assert library.cpu_flags(CPUINFO) == frozenset({"fpu", "avx2", "fma"})
    assert library.cpu_flags("processor: 0\n") is None
    assert machine.cpu_model(CPUINFO) == "AMD EPYC 7B13" and machine.cpu_model("") is None
    # how a measurement names its CPU: one "AMD EPYC" model name covers several generations
    epyc = "model name\t: AMD EPYC\ncpu family\t: 26\nmodel\t\t: 2\nflags\t\t: avx2 fma avx512f avx512_bf16\n"
    assert machine.cpu_kind(epyc, cores=2) == "AMD EPYC (family 26, model 2, AVX-512 + BF16), 2 cores"
    assert machine.cpu_kind(CPUINFO, cores=2) == "AMD EPYC 7B13 (family ?, model ?, AVX2), 2 cores"
    assert machine.cpu_kind("", cores=4) == "unknown CPU, 4 cores"


def test_only_the_backend_and_the_cpu_features_limit_the_machine():
    assert library.machine_reason("cpu", AVX512_BF16) is None
    assert library.machine_reason("cpu", AVX2) == "this CPU lacks avx512_bf16, avx512_vnni"
    assert "avx512_vnni" in library.machine_reason("cpu", AVX512_BF16 - {"avx512_vnni"})
    assert "cannot read /proc/cpuinfo" in library.machine_reason("cpu", None)
    assert library.machine_reason("gpu", AVX512_BF16) == "JAX runs on gpu; the kernels are for CPUs"
    assert library.machine_reason("cpu", AVX2, library.AVX2) is None
    assert library.machine_reason("cpu", AVX2 - {"fma"}, library.AVX2) == "this CPU lacks fma"
    assert library.machine_reason("cpu", AVX512_BF16, library.AVX512, ("avx2",)) == \
        "this process leaves out the avx512 kernels (JF_CPU_KERNELS=avx2)"


def test_the_process_may_limit_the_kernel_sets(monkeypatch, request):
    request.addfinalizer(library.chosen_sets.cache_clear)  # the other tests see this process's own variable
    monkeypatch.setenv("JF_CPU_KERNELS", "avx2")
    library.chosen_sets.cache_clear()
    assert library.chosen_sets() == ("avx2",)
    assert "leaves out the avx512 kernels" in library.machine_reason("cpu", AVX512_BF16, library.AVX512,
                                                                     library.chosen_sets())
    monkeypatch.setenv("JF_CPU_KERNELS", "avx")
    library.chosen_sets.cache_clear()
    with pytest.raises(ValueError, match="JF_CPU_KERNELS='avx'; expected one of all, avx2, none"):
        library.chosen_sets()


@pytest.mark.parametrize("flags, problem, action", [
    (AVX2, None, "skip"),
    (AVX2, "libjf_cpu_kernels_avx512.so is not built", "skip"),  # nothing to build for on this CPU
    (None, None, "skip"),
    (AVX512_BF16, None, "run"),
    (AVX512_BF16, "libjf_cpu_kernels_avx512.so is not built", "fail"),  # a capable CPU: a missing library is a fault
    (AVX512_BF16, "libjf_cpu_kernels_avx512.so does not load", "fail"),
])
def test_kernel_tests_skip_only_where_the_cpu_cannot_run_them(flags, problem, action):
    v = kernel_gate.verdict(library.machine_reason("cpu", flags), problem)
    # The AVX2 set on the same CPUs: every one of them but the unknown can run it, so a missing library fails.
    avx2 = kernel_gate.verdict(library.machine_reason("cpu", flags, library.AVX2), problem)
    assert avx2.action == ("skip" if flags is None else "fail" if problem else "run")
    assert v.action == action
    if action == "fail":
        assert problem in v.reason and "not a skip" in v.reason
    assert kernel_gate.verdict(library.machine_reason("gpu", flags), problem).action == "skip"


def test_this_machine_is_gated_as_it_is_detected():
    """The tests' gate and the engine's own detection agree on which kernel sets run here."""
    here = machine.detect()
    assert (kernel_gate.this_machine("avx512").action == "run") == here.avx512_kernels_run
    assert (kernel_gate.this_machine("avx2").action == "run") == here.avx2_gemm_runs


@pytest.mark.parametrize("m, dtype, path", [
    (cpu(AVX512_BF16), "bfloat16", "bf16 via jf-jax AVX512-BF16 kernels"),
    (cpu(AVX512_BF16, "libjf_cpu_kernels_avx512.so is not built (python -m cpu_kernels.build)"), "bfloat16",
     "bf16 via XLA dots (kernel library unavailable: python -m cpu_kernels.build)"),
    (cpu(AVX2), "bfloat16", "bf16 via the jf-jax AVX2 GEMM kernel (no AVX512-BF16 or AVX512-VNNI)"),
    (cpu(AVX2, "libjf_cpu_kernels_avx2.so is not built (python -m cpu_kernels.build)"), "bfloat16",
     "bf16 via XLA dots (no AVX512-BF16 or AVX512-VNNI)"),
    (cpu(AVX2 | {"avx512_bf16"}), "bfloat16", "bf16 via the jf-jax AVX2 GEMM kernel (no AVX512-VNNI)"),
    (cpu(None), "float32", None),
    (cpu(AVX512_BF16 | {"amx_bf16", "amx_tile"}), "bfloat16", "bf16 via jf-jax AVX512-BF16 kernels"),
    (Machine(backend="gpu", devices=("NVIDIA H100 80GB HBM3",), avx512_machine_reason="gpu"), "float32",
     "f32 via XLA on gpu"),
    (Machine(backend="tpu", devices=("TPU v5 lite",), avx512_machine_reason="tpu"), "float32",
     "f32 via XLA on tpu"),
], ids=["avx512-bf16", "avx512-bf16-unbuilt", "avx2", "avx2-unbuilt", "bf16-no-vnni", "unknown-cpu", "amx", "gpu",
        "tpu"])
def test_auto_picks_the_fastest_dtype_shown_lossless_here(m, dtype, path):
    choice = machine.choose_dtype("auto", m)
    assert (choice.dtype, choice.requested) == (dtype, "auto")
    assert path is None or machine.engine_path(m, choice.dtype).summary == path
    assert (machine.evidence_class(m), dtype) in machine.LOSSLESS or "no dtype has been shown lossless" in choice.reason


def test_gpu_bf16_is_passed_over_while_it_is_not_shown_lossless():
    h100 = Machine(backend="gpu", devices=("NVIDIA H100 80GB HBM3",), avx512_machine_reason="gpu")
    choice = machine.choose_dtype("auto", h100)
    assert choice.dtype == "float32" and "bfloat16 is faster" in choice.reason and "is NOT shown" in choice.reason


@pytest.mark.parametrize("m", [
    cpu(frozenset("fp asimd evtstrm aes crc32".split())),  # an ARM CPU's features
    cpu(None),  # features unknown (not Linux)
    Machine(backend="gpu", devices=("NVIDIA A100-SXM4-80GB",), avx512_machine_reason="gpu"),  # a GPU never tried
], ids=["arm", "unknown", "a100"])
def test_evidence_from_one_machine_class_is_not_lent_to_another(m):
    """What was shown on x86 CPUs with AVX2 and on H100s says nothing of an ARM CPU or an A100: auto takes the
    reference dtype there and says how to test the faster one."""
    choice = machine.choose_dtype("auto", m)
    assert choice.dtype == "float32" and "no dtype has been shown lossless" in choice.reason
    assert "doctor --check" in choice.reason
    assert all("not shown" in machine.lossless_evidence(m, d) for d in machine.DTYPES)
    assert machine.evidence_class(cpu(AVX2)) == machine.evidence_class(cpu(AVX512_BF16)) == machine.X86_AVX2


def test_int8_without_vnni_is_flagged_slow_and_never_chosen():
    assert "slow" in machine.engine_path(cpu(AVX2), "int8").note
    assert machine.engine_path(cpu(AVX512_BF16), "int8").summary == "int8 via jf-jax AVX512-VNNI kernels"
    assert all(machine.choose_dtype("auto", m).dtype != "int8" for m in (cpu(AVX2), cpu(AVX512_BF16)))


def test_an_explicit_dtype_is_kept_and_a_wrong_one_refused():
    assert machine.choose_dtype("int8", cpu(AVX2)).dtype == "int8"
    with pytest.raises(ValueError, match="unknown dtype 'float16'"):
        machine.choose_dtype("float16", cpu(AVX2))


def test_the_header_names_dtype_path_and_features():
    m = cpu(AVX2)
    text = machine.header(m, machine.choose_dtype("auto", m))
    assert text.startswith("engine: bf16 via the jf-jax AVX2 GEMM kernel (no AVX512-BF16 or AVX512-VNNI) on test CPU "
                           "[avx2 fma f16c]")
    assert "dtype auto -> bfloat16: " in text
    env = machine.environment(m, machine.choose_dtype("auto", m))
    assert env["dtype"] == "bfloat16" and env["dtype_requested"] == "auto" and env["cpu_features"]["avx2"]


def test_doctor_reports_this_machine(capsys):
    assert jf_jax_main(["doctor", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    here = machine.detect()
    assert r["backend"] == here.backend and set(r["decode_paths"]) == set(machine.DTYPES)
    assert r["auto"]["dtype"] == machine.choose_dtype("auto", here).dtype and "check" not in r
    assert doctor.main([]) == 0
    text = capsys.readouterr().out
    assert "--dtype auto  " in text and "cpu kernels   " in text and "lossless" in text


def test_doctor_text_for_a_machine_that_can_run_the_kernels_but_lacks_them():
    r = doctor.report(cpu(AVX512_BF16, "libjf_cpu_kernels_avx512.so is not built (python -m cpu_kernels.build)"))
    text = doctor.format_report(r)
    assert "cpu kernels   AVX-512 set (bf16 GEMM, W8A8): this CPU can run them, but: " \
           "libjf_cpu_kernels_avx512.so is not built" in text
    assert "note: the faster AVX512-BF16 kernels would run here" in text
    text = doctor.format_report(doctor.report(cpu(AVX2, "libjf_cpu_kernels_avx2.so is not built")))
    assert "note: the packed bf16 GEMM kernel would run here: libjf_cpu_kernels_avx2.so is not built" in text


def test_first_difference():
    assert doctor.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert doctor.first_difference([1, 2], [1, 2, 3]) == 2


def test_decode_accepts_auto_and_reports_the_resolved_dtype(monkeypatch, tmp_path, capsys):
    from jf_jax import api

    loaded = []

    def generate(model, prompts, *, method, **options):
        return [api.Completion(method=method, prompt=p, token_ids=[1], text="x", forwards=1, seconds=1.0,
                               prefill_seconds=0.5, stats=dict(tokens=1, forwards=1, seconds=1.0, prefill_seconds=0.5),
                               settings={}) for p in prompts]

    monkeypatch.setattr(machine, "detect", lambda: cpu(AVX2))
    monkeypatch.setattr(api, "load_model", lambda spec, dtype: loaded.append(dtype) or type("M", (), {"name": spec}))
    monkeypatch.setattr(api, "generate", generate)
    out = tmp_path / "r.json"
    assert decode.build_parser().parse_args([]).dtype == "auto"
    assert decode.main(["--model", "fake", "--prompt", "abc", "--methods", "ar", "--dtype", "auto",
                        "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert loaded == ["bfloat16"] and report["settings"]["dtype"] == "bfloat16"
    assert report["environment"]["engine"] == "bf16 via the jf-jax AVX2 GEMM kernel (no AVX512-BF16 or AVX512-VNNI)"
    assert report["environment"]["dtype_requested"] == "auto"
    assert "engine: bf16 via the jf-jax AVX2 GEMM kernel" in capsys.readouterr().err


def test_check_decodes_a_random_model_here(monkeypatch):
    """The check itself on a tiny shape (the real one, SmolLM2's layer shapes, takes half a minute to compile)."""
    monkeypatch.setattr(doctor, "CHECK_SHAPE", dict(doctor.CHECK_SHAPE, vocab_size=64, hidden_size=64,
                                                    intermediate_size=96, num_heads=4, num_kv_heads=2, head_dim=16))
    (result,) = doctor.check(machine.detect(), ("float32",), prompts=1, max_new_tokens=8, block_size=4,
                             bit_samples=1)
    assert result["equal"] and result["block_logits_bit_identical"] and result["tokens"] == 8
    assert "jacobi == AR (8 tokens, n = 4)" in doctor.format_report({**doctor.report(cpu(AVX2)), "check": [result]})


def test_block_bits_at_a_decode_shape_pads_both_forwards_alike(monkeypatch):
    """The bit test at a fixed decode shape, as GPU runs take it: a block and its one-token steps, both padded to 2x8
    with the padding masked, give a token the same bits here (a one-token step that wrote a padding slot's keys
    into the cache instead of its token's would change every later step's logits)."""
    import jax

    from jf_jax.decoding.shapes import DecodeShape
    from jf_jax.model.config import ModelConfig
    from jf_jax.model.params import init_params

    shape = dict(doctor.CHECK_SHAPE, vocab_size=64, hidden_size=64, intermediate_size=96, num_heads=4,
                 num_kv_heads=2, head_dim=16)
    cfg = ModelConfig(**shape, dtype="float32")
    params = init_params(cfg, jax.random.PRNGKey(1))
    samples = [[[3, 9, 27, 17, 5], [11, 2, 40, 7]]]
    assert doctor.block_bits(params, cfg, samples, DecodeShape(2, 8)) == 0.0
    assert doctor.block_bits(params, cfg, samples) == 0.0


def test_check_fails_the_command_when_tokens_or_bits_differ(monkeypatch, capsys):
    good = dict(dtype="float32", equal=True, block_logits_bit_identical=True, block_logits_max_difference=0.0,
                first_difference=None, tokens=8, block_size=4, seconds=1.0)
    for verdict, code in ((good, 0), (dict(good, equal=False, first_difference={"prompt": 0, "position": 3}), 1),
                          (dict(good, block_logits_bit_identical=False, block_logits_max_difference=0.01), 1)):
        monkeypatch.setattr(doctor, "check", lambda machine, v=verdict: [v])
        assert doctor.main(["--check"]) == code
    assert "differ from one-token steps by up to 0.01" in capsys.readouterr().out
    monkeypatch.setattr(doctor, "check", lambda machine: [dict(good, decode_shape="1x16")])
    doctor.main(["--check"])
    assert "bit-identical to one-token steps (both at the decode shape 1x16)" in capsys.readouterr().out


def test_speed_recommends_the_largest_block_within_the_cost_limit_unless_tuned():
    seconds = {1: 0.020, 2: 0.021, 4: 0.024, 8: 0.030, 16: 0.045, 32: 0.080}
    common = dict(context=256, repeats=5, bandwidth_gbs=20.0, weight_bytes=400_000_000)
    s = doctor.speed("m", "bfloat16", seconds, tuned_block_size=None, **common)
    assert s["block_size"] == 8 and s["cost_over_one_token"][16] == pytest.approx(2.25)
    assert s["ar_bound_tokens_per_second"] == pytest.approx(50.0) and s["fraction_of_bound"] == pytest.approx(1.0)
    text = "\n".join(doctor.format_speed(s))
    assert "AR is bound at 50 tok/s; measured 50.0 steps/s (100% of the bound)" in text
    assert "t=16 45.0 ms (2.25x)" in text and "block size  8: the largest measured block" in text
    assert doctor.speed("m", "bfloat16", seconds, tuned_block_size=32, **common)["block_size"] == 32
    costly = doctor.speed("m", "bfloat16", {1: 0.02, 2: 0.04}, tuned_block_size=None, **common)
    assert costly["block_size"] is None and "costs over 1.5x a one-token step" in costly["block_size_reason"]
    no_bandwidth = doctor.speed("m", "float32", seconds, tuned_block_size=None, **dict(common, bandwidth_gbs=None))
    assert no_bandwidth["fraction_of_bound"] is None and "bandwidth" not in "\n".join(doctor.format_speed(no_bandwidth))


def test_doctor_measures_a_model_on_this_machine(tiny_gguf, capsys):
    assert doctor.main(["--measure", "--model", str(tiny_gguf), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)["speed"]
    assert s["model"] == str(tiny_gguf) and s["dtype"] == machine.choose_dtype("auto", machine.detect()).dtype
    assert [int(t) for t in s["latency_ms"]] == list(doctor.MEASURE_SIZES) and min(s["latency_ms"].values()) > 0
    assert s["read_bandwidth_gbs"] > 0 and 0 < s["fraction_of_bound"]


def test_doctor_refuses_a_model_without_measure_and_names_a_missing_one(capsys, tmp_path):
    assert doctor.main(["--model", "x.gguf"]) == 2
    assert "add --measure" in capsys.readouterr().err
    assert doctor.main(["--measure", "--model", str(tmp_path / "absent.gguf")]) == 2
    assert "absent.gguf" in capsys.readouterr().err


def test_attention_takes_the_avx2_sets_kernel_wherever_that_set_runs():
    for flags in (AVX512_BF16, AVX2):
        assert machine.engine_path(cpu(flags), "float32").attention == "jf-jax decode-attention kernel (AVX2 set)"
        assert machine.engine_path(cpu(flags, None, "libjf_cpu_kernels_avx2.so is not built"), "bfloat16") \
            .attention.startswith("plain JAX in XLA (the kernel's twin")

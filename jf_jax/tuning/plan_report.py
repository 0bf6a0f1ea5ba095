"""What the plan's compiled programs mean on a target accelerator: memory against its HBM, roofline times, the
Jacobi knee and the cost of a round of training data (``jf-jax plan``; ``tuning.plan`` compiles the programs).

Memory: XLA:CPU's buffer assignment of each program at the target's shapes (arguments + outputs not aliased to
donated arguments + temporaries), beside an analytic count (float32 parameters 4 B, AdamW's two moments 8 B and the
gradients 4 B per parameter of the device's share, the bfloat16 reference 2 B, the KV cache). XLA:CPU's
temporaries overstate a GPU's: for the recipe's Qwen2.5-7B train step on one H200 they were 60.4 GiB against the
GPU's own 30.9 (results/studies/gpu_h200_7b/), so a program is judged three ways: it fits by XLA:CPU's figure; it
fits only with its temporaries scaled by that measured ratio (``CPU_TEMP_RATIO``: a tight fit, one measurement
behind it); or it does not fit.

Times (per device, perfect overlap, the roofline's ``max``):

* train step = max(FLOPs / (peak * efficiency), bytes / bandwidth), FLOPs and bytes counted in the compiled HLO with
  loops as they run (``tuning.hlo_stats``), cross-checked with (6 + 2 remat) * matmul params * tokens + the
  reference's forward + attention; collectives separately, at the link rate (an all-reduce moving its buffer twice);
* a decode step = max(its dot FLOPs / peak, (weights + KV cache read and written) / bandwidth), collectives again
  separately; AR's tokens/s at the decode batch is rows / ((weights + KV read) / bandwidth), the bandwidth bound (an
  H200 ran batch-1 AR at 49.6% of it at the datasheet bandwidth: ``AR_MEASURED_FRACTION``);
* the Jacobi knee: the tokens per row at which a forward's compute time reaches its weight-reading time, from the
  FLOPs of the compiled one-token and n-token forwards (linear in the tokens).
"""

from __future__ import annotations

import dataclasses
import math

from jf_jax.model.config import ModelConfig
from jf_jax.model.params import abstract_params, count_params
from jf_jax.tuning.plan import CompiledProgram, DecodeShape, MeshShape, TrainShape
from jf_jax.tuning.roofline import Device

GIB = 2**30
CPU_TEMP_RATIO = 60.4 / 30.9
"""XLA:CPU's temporaries over the GPU's for the recipe's 7B train step on one H200 (results/studies/gpu_h200_7b/).
Re-checked after the train step began keeping activations split by rows (commit 8950bd8): on one device that changes
nothing, and XLA:CPU's temporaries for that configuration are still 60.4 GiB (results/studies/plan_7b/)."""
AR_MEASURED_FRACTION = 167.6 / (4.8e12 / 14.20e9)
"""Batch-1 AR on an H200 at Qwen2.5-7B's shapes ran at 167.6 tokens/s (same study): 63.6% of the bound at the
bandwidth the H200 measured (3.74 TB/s), 49.6% of the bound at the datasheet's 4.8 TB/s, which the plan uses."""
FITS, TIGHT, NO_FIT = "fits", "fits only by the H200 calibration", "does not fit"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoundShape:
    """A round of training data: ``prompts`` prompts, one training sequence each, one epoch; collection decodes
    ``response_tokens`` per prompt with Jacobi at ``collect_tpf`` tokens per forward (a base model commits ~1)."""

    prompts: int = 450_000
    response_tokens: int | None = None  # default: the clean half of a training sequence after its prompt
    collect_tpf: float = 1.0


def matmul_params(cfg: ModelConfig) -> int:
    """Parameters every token multiplies (all but an untied input embedding, which is a lookup)."""
    n = count_params(abstract_params(cfg))
    return n - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)


def verdict(peak: float, temp: float, hbm: float) -> str:
    if peak <= hbm:
        return FITS
    return TIGHT if peak - temp + temp / CPU_TEMP_RATIO <= hbm else NO_FIT


def reason(peak: float, temp: float, hbm: float) -> str:
    """One line: the program's need per device against the HBM, both ways of reading the temporaries."""
    calibrated = peak - temp + temp / CPU_TEMP_RATIO
    return (f"needs {peak / GIB:.1f} GiB per device by XLA:CPU's buffer assignment ({calibrated / GIB:.1f} GiB with "
            f"its temporaries scaled to the H200's) against {hbm / GIB:.0f} GiB of HBM")


def train_report(cfg: ModelConfig, mesh: MeshShape, train: TrainShape, program: CompiledProgram, device: Device,
                 efficiency: float) -> dict:
    n = count_params(abstract_params(cfg))
    share = mesh.fsdp * mesh.tensor  # the data axis replicates parameters and state
    reference = 2 * n / share if train.teacher == "reference" else 0
    analytic = dict(params_bytes=4 * n / share, optimizer_bytes=8 * n / share, grads_bytes=4 * n / share,
                    reference_bytes=reference)
    analytic["total_bytes"] = sum(analytic.values())
    p = program.parts
    calibrated = program.peak_bytes - program.temp_bytes + program.temp_bytes / CPU_TEMP_RATIO
    per_device = dict(params_bytes=p["params"], optimizer_bytes=p["optimizer"], reference_bytes=p["reference"],
                      batch_bytes=p["batch"], temporaries_bytes=program.temp_bytes,
                      outputs_not_aliased_bytes=program.output_bytes - program.alias_bytes,
                      peak_bytes=program.peak_bytes, calibrated_peak_bytes=calibrated, hbm_bytes=device.hbm_bytes)
    # FLOPs: the compiled dots; the analytic cross-check counts matmuls and attention per row.
    mm, tokens = matmul_params(cfg), train.batch * train.seq_len
    attention = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim  # QK^T and PV, per query per key, forward
    forward = 2 * mm * tokens + attention * train.batch * train.seq_len ** 2
    ref_forward = (2 * mm * train.batch * train.teacher_tokens + attention * train.batch * train.teacher_tokens ** 2
                   if train.teacher == "reference" else 0)
    analytic_flops = ((4 if train.remat else 3) * forward + ref_forward) / mesh.devices
    flops, op_bytes = program.hlo.dot_flops, program.hlo.op_bytes
    compute_s = flops / (device.peak_flops * efficiency)
    memory_s = op_bytes / device.bandwidth
    collective_s = collective_seconds(program, device)
    step_s = max(compute_s, memory_s)
    return dict(
        verdict=verdict(program.peak_bytes, program.temp_bytes, device.hbm_bytes),
        reason=reason(program.peak_bytes, program.temp_bytes, device.hbm_bytes), per_device=per_device,
        analytic_per_device=analytic, compile_seconds=program.compile_seconds, tokens_per_step=tokens,
        flops_per_device=flops, analytic_flops_per_device=analytic_flops,
        flops_ratio_to_analytic=flops / analytic_flops,
        op_bytes_per_device=op_bytes, compute_seconds=compute_s, memory_seconds=memory_s, step_seconds=step_s,
        collective_seconds=collective_s, step_seconds_with_collectives=max(step_s, collective_s),
        tokens_per_second=tokens / step_s, collectives=program.hlo.to_json(), program=program.to_json())


def collective_seconds(program: CompiledProgram, device: Device) -> float:
    """The collectives' bytes at the target's link rate, one direction; an all-reduce (reduce-scatter + all-gather)
    moves its buffer twice. Ring factors (n - 1) / n are left out: an upper figure for small groups."""
    if not device.link_bandwidth:
        return math.nan
    b = program.hlo.collective_bytes
    return (2 * b["all-reduce"] + sum(v for k, v in b.items() if k != "all-reduce")) / device.link_bandwidth


def decode_report(cfg: ModelConfig, mesh: MeshShape, decode: DecodeShape, jacobi: CompiledProgram,
                  ar: CompiledProgram, device: Device) -> dict:
    streamed = jacobi.parts["weights"] + (jacobi.parts["embedding"] if cfg.tie_word_embeddings else 0)
    kv = jacobi.parts["kv_cache"]
    kv_read = kv * decode.context / (decode.context + decode.block_size)
    rows_dev = decode.batch // mesh.rows_divisor

    def step(program: CompiledProgram, tokens: int) -> float:
        written = kv * tokens / (decode.context + decode.block_size)
        return max(program.hlo.dot_flops / device.peak_flops, (streamed + kv_read + written) / device.bandwidth)

    ar_bound_s = (streamed + kv_read) / device.bandwidth  # AR's bandwidth bound: weights + KV read per step
    ar_s, jacobi_s = step(ar, 1), step(jacobi, decode.block_size)
    links = {k: collective_seconds(p, device) for k, p in (("ar", ar), ("jacobi", jacobi))}
    # FLOPs per device are linear in the tokens per row: f(n) = f(1) + slope * (n - 1).
    slope = (jacobi.hlo.dot_flops - ar.hlo.dot_flops) / max(decode.block_size - 1, 1)
    weight_s = (streamed + kv_read) / device.bandwidth
    knee = (1 + (weight_s * device.peak_flops - ar.hlo.dot_flops) / slope) if slope > 0 else math.nan
    per_device = dict(weights_bytes=jacobi.parts["weights"], embedding_bytes=jacobi.parts["embedding"],
                      kv_cache_bytes=kv, temporaries_bytes=jacobi.temp_bytes, peak_bytes=jacobi.peak_bytes,
                      calibrated_peak_bytes=jacobi.peak_bytes - jacobi.temp_bytes + jacobi.temp_bytes / CPU_TEMP_RATIO,
                      ar_peak_bytes=ar.peak_bytes, streamed_bytes_per_step=streamed + kv_read,
                      hbm_bytes=device.hbm_bytes)
    worst = max((jacobi, ar), key=lambda p: p.peak_bytes)
    return dict(
        verdict=verdict(worst.peak_bytes, worst.temp_bytes, device.hbm_bytes),
        reason=reason(worst.peak_bytes, worst.temp_bytes, device.hbm_bytes), per_device=per_device,
        rows_per_device=rows_dev, compile_seconds=dict(jacobi=jacobi.compile_seconds, ar=ar.compile_seconds),
        ar_bound_seconds=ar_bound_s, ar_tokens_per_second=decode.batch / ar_bound_s,
        ar_tokens_per_second_at_measured_fraction=AR_MEASURED_FRACTION * decode.batch / ar_bound_s,
        ar_step_seconds=ar_s, jacobi_step_seconds=jacobi_s, jacobi_over_ar=jacobi_s / ar_s,
        collective_seconds=links, ar_step_seconds_with_collectives=max(ar_s, links["ar"]),
        jacobi_step_seconds_with_collectives=max(jacobi_s, links["jacobi"]), knee_tokens_per_row=knee,
        collectives=dict(jacobi=jacobi.hlo.to_json(), ar=ar.hlo.to_json()),
        programs=dict(jacobi=jacobi.to_json(), ar=ar.to_json()))


def round_report(train: TrainShape, mesh: MeshShape, decode: DecodeShape, decode_mesh: MeshShape, rnd: RoundShape,
                 train_r: dict | None, decode_r: dict | None) -> dict:
    """Chip-hours of one round: training (one sequence per prompt, one epoch, ``batch`` a step) and collection
    (``prompts / decode batch`` batches of ``response_tokens / collect_tpf`` Jacobi forwards each; prefill left out)."""
    response = rnd.response_tokens or (train.seq_len - train.prompt_len) // 2
    out = dict(prompts=rnd.prompts, response_tokens=response, collect_tpf=rnd.collect_tpf,
               sequences_per_prompt=1, epochs=1)
    if train_r is not None:
        steps = math.ceil(rnd.prompts / train.batch)
        hours = steps * train_r["step_seconds"] / 3600
        out.update(train_steps=steps, train_hours=hours, train_chip_hours=hours * mesh.devices,
                   train_chip_hours_with_collectives=steps * train_r["step_seconds_with_collectives"] / 3600
                   * mesh.devices)
    if decode_r is not None:
        forwards = math.ceil(rnd.prompts / decode.batch) * math.ceil(response / rnd.collect_tpf)
        hours = forwards * decode_r["jacobi_step_seconds"] / 3600
        out.update(collect_forwards=forwards, collect_hours_at_bound=hours,
                   collect_chip_hours_at_bound=hours * decode_mesh.devices,
                   collect_chip_hours_at_measured_fraction=hours * decode_mesh.devices / AR_MEASURED_FRACTION)
    return out

"""The text ``jf-jax plan`` prints: one plan's JSON (``jf_jax.cli.plan.run``) as a few tables and sentences."""

from __future__ import annotations

import math

GIB = 2**30


def gib(x: float) -> str:
    return f"{x / GIB:.2f} GiB"


def seconds(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x * 1e3:.2f} ms" if x < 1 else f"{x:.2f} s"


def collective_lines(stats: dict) -> list[str]:
    kinds = [f"{k} {v / 1e9:.2f} GB ({stats['collective_ops'][k]}x)" for k, v in stats["collective_bytes"].items() if v]
    return [f"  collectives per step per device: {', '.join(kinds) or 'none'}; total "
            f"{stats['total_collective_bytes'] / 1e9:.2f} GB (each op's larger of operand and result bytes on the "
            "device, times the trip count of its loops, from the compiled HLO)"]


def train_lines(r: dict, plan: dict) -> list[str]:
    s, d, a, t = plan["train_settings"], r["per_device"], r["analytic_per_device"], plan["target"]
    lines = [f"train step on {plan['mesh']}: {s['batch']} rows x {s['seq_len']} tokens (prompt {s['prompt_len']}, "
             f"reference over {s['teacher_tokens']}), remat {'on' if s['remat'] else 'off'}, AR teacher "
             f"{s['teacher']}, AdamW float32, bf16 compute; compiled in {r['compile_seconds']:.1f} s",
             f"  {'per device':<22}{'XLA:CPU':>12}{'analytic':>12}",
             f"  {'parameters (f32)':<22}{gib(d['params_bytes']):>12}{gib(a['params_bytes']):>12}",
             f"  {'optimizer state':<22}{gib(d['optimizer_bytes']):>12}{gib(a['optimizer_bytes']):>12}",
             f"  {'gradients':<22}{'(temps)':>12}{gib(a['grads_bytes']):>12}",
             f"  {'reference (bf16)':<22}{gib(d['reference_bytes']):>12}{gib(a['reference_bytes']):>12}",
             f"  {'batch':<22}{gib(d['batch_bytes']):>12}",
             f"  {'temporaries':<22}{gib(d['temporaries_bytes']):>12}",
             f"  {'peak / floor':<22}{gib(d['peak_bytes']):>12}{gib(a['total_bytes']):>12}  of {gib(t['hbm_bytes'])}: "
             f"{r['verdict']} (temporaries scaled to the H200's: {gib(d['calibrated_peak_bytes'])})"]
    lines += collective_lines(r["collectives"])
    bound = "compute" if r["compute_seconds"] >= r["memory_seconds"] else "memory"
    lines += [f"  time per step: {r['flops_per_device'] / 1e12:.1f} TFLOP per device (compiled dots; analytic "
              f"{r['analytic_flops_per_device'] / 1e12:.1f}, ratio {r['flops_ratio_to_analytic']:.2f}) at "
              f"{t['peak_flops'] / 1e12:.0f} TFLOP/s x {plan['efficiency']:.2f} = {seconds(r['compute_seconds'])}; "
              f"{r['op_bytes_per_device'] / 1e9:.0f} GB of XLA:CPU op traffic at {t['bandwidth'] / 1e12:.2f} TB/s = "
              f"{seconds(r['memory_seconds'])}",
              f"  -> {seconds(r['step_seconds'])} a step ({bound}-bound), {r['tokens_per_second']:.0f} tokens/s; "
              f"collectives at the link rate {seconds(r['collective_seconds'])} (a step with them overlapped: "
              f"{seconds(r['step_seconds_with_collectives'])}; one after the other: "
              f"{seconds(r['step_seconds'] + r['collective_seconds'])})"]
    return lines


def decode_lines(r: dict, plan: dict) -> list[str]:
    s, d, t = plan["decode_settings"], r["per_device"], plan["target"]
    c = r["compile_seconds"]
    lines = [f"decode on {plan['decode_mesh']}: {s['batch']} rows ({r['rows_per_device']} per device), {s['context']} "
             f"cached slots, Jacobi forward of {s['block_size']} tokens and the AR step, bf16 weights; compiled in "
             f"{c['jacobi']:.1f} s + {c['ar']:.1f} s",
             f"  per device: weights {gib(d['weights_bytes'])}, embedding {gib(d['embedding_bytes'])}, KV cache "
             f"{gib(d['kv_cache_bytes'])}, temporaries {gib(d['temporaries_bytes'])}; peak {gib(d['peak_bytes'])} of "
             f"{gib(t['hbm_bytes'])}: {r['verdict']}"]
    lines += collective_lines(r["collectives"]["jacobi"])
    lines += [f"  AR at batch {s['batch']}: {r['ar_tokens_per_second']:.0f} tokens/s at the bandwidth bound "
              f"({d['streamed_bytes_per_step'] / 1e9:.2f} GB per device a step at {t['bandwidth'] / 1e12:.2f} TB/s), "
              f"{r['ar_tokens_per_second_at_measured_fraction']:.0f} at the fraction of it an H200 ran at (49.6%)",
              f"  Jacobi forward of {s['block_size']}: {seconds(r['jacobi_step_seconds'])} = "
              f"{r['jacobi_over_ar']:.2f}x the AR step's {seconds(r['ar_step_seconds'])}; knee at "
              f"{r['knee_tokens_per_row']:.0f} tokens per row (compute time = weight-reading time); collectives at the "
              f"link rate {seconds(r['collective_seconds']['jacobi'])} a forward"]
    return lines


def round_lines(r: dict) -> list[str]:
    lines = [f"a round of {r['prompts']:,} prompts (one {r['response_tokens']}-token response collected and one "
             f"training sequence per prompt, one epoch, collection at TPF {r['collect_tpf']:g}):"]
    if "train_chip_hours" in r:
        lines.append(f"  training: {r['train_steps']:,} steps, {r['train_chip_hours']:,.0f} chip-hours "
                     f"({r['train_chip_hours_with_collectives']:,.0f} with the collectives overlapped)")
    if "collect_chip_hours_at_bound" in r:
        lines.append(f"  collection: {r['collect_forwards']:,} forwards, {r['collect_chip_hours_at_bound']:,.0f} "
                     f"chip-hours at the roofline, {r['collect_chip_hours_at_measured_fraction']:,.0f} at an H200's "
                     "measured "
                     "49.6% of it")
    return lines


def report_lines(plan: dict) -> list[str]:
    t = plan["target"]
    lines = [f"jf-jax plan: {plan['model']} ({plan['parameters'] / 1e9:.2f} B parameters) on {t['name']} "
             f"({gib(t['hbm_bytes'])} HBM, {t['bandwidth'] / 1e12:.2f} TB/s, {t['peak_flops'] / 1e12:.0f} TFLOP/s "
             "bf16, "
             f"links {t['link_bandwidth'] / 1e9:.0f} GB/s one way; {t['source']})",
             f"note: {plan['memory_note']}; times are rooflines (MFU {plan['efficiency']:.2f} assumed for training)"]
    if plan["train"] is not None:
        lines += train_lines(plan["train"], plan)
    if plan["decode"] is not None:
        lines += decode_lines(plan["decode"], plan)
    lines += round_lines(plan["round"])
    return lines

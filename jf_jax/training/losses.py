"""Jacobi Forcing losses on a packed batch (docs/method.md, section 5 and decision 5).

One forward over the packed rows gives float32 logits ``z`` [B, L, V] (computed once: the teacher logits are
the clean-stream logits the AR loss uses anyway). With ``lse = logsumexp(z)``:

* AR: ``ce[p] = lse[p] - z[p, ar_target[p]]``; ``ar = sum(ar_weight * ce) / sum(ar_weight)``. With
  ``ar_teacher="reference"`` the target is instead the whole next-token distribution of a frozen reference model
  (the run's initial weights, or ``ar_reference``) at the same position:
  ``ce[p] = KL(softmax(r[p]) || softmax(z[p]))`` with ``r`` the reference's logits under the same mask. Clean and
  prompt positions see only clean tokens, so ``r`` there is the reference's plain causal distribution, and the
  reference runs over those tokens alone (the batch's ``teacher_index``, about half of each row). Training on
  the model's own greedy answers sharpens it towards them and costs quality (results/studies/levers_n16/levers_n16.md);
  distilling the reference's distribution keeps what it knew about the other tokens.
* Consistency, per pair (student s, teacher t) of ``cons_student / cons_teacher``:
  ``soft_ce = lse[s] - sum_v softmax(stop_gradient(z[t]))_v * z[s, v]``
  (= KL(teacher || student) + teacher entropy; temperature 1), and
  ``consistency = sum(cons_weight * soft_ce) / #kept`` with ``cons_weight = 1/T`` of the pair's sequence and
  #kept the number of pairs. For one sequence this is exactly "token-mean over kept positions divided by the
  number of blocks"; in a batch every pair keeps its own sequence's 1/T and the token-mean runs over the batch.
* ``total = ar_weight * ar + consistency_weight * consistency``.

Normalisers are counts over the *whole* batch, computed from the data alone (``loss_normalizers``), so gradient
accumulation over micro-batches sums ``weighted_sums / normalizers`` and equals the full-batch gradient, and
a sequence's loss does not depend on how the rows were packed or padded.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jf_jax.model import transformer as model
from jf_jax.model.config import ModelConfig
from jf_jax.model.params import Params
from jf_jax.training.packing import TEACHER_TOKENS
from pallas_kernels.mask import MASK_KINDS, MASK_NOISE_CONDITIONED, TokenMeta


AR_TEACHERS = ("data", "reference")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LossConfig:
    ar_weight: float = 10.0
    """Weight of the AR loss (REF uses 10)."""
    consistency_weight: float = 1.0
    train_prompt: bool = True
    """Whether prompt-internal next-token pairs are AR targets (REF: yes). Applied when packing."""
    mask: str = MASK_NOISE_CONDITIONED
    """"noise_conditioned" (the method) or "clean_context" (the CLLM*-style ablation)."""
    ar_teacher: str = "data"
    """"data": cross-entropy on the trajectory's tokens (REF). "reference": KL from a frozen reference model's
    next-token distribution (one extra forward per step over the prompt and clean tokens, no backward)."""
    ar_reference: str | None = None
    """The model ``ar_teacher="reference"`` distils from: None for the run's initial weights, or a model spec of
    the same architecture (``jf_jax.weights.load``: "smollm2-135m", a run directory, a .gguf, a HF directory),
    e.g. the base model in a later round, so that every round is anchored to it rather than to its parent."""
    teacher_tokens: str = "clean"
    """The tokens the reference's forward covers (``packing.TEACHER_TOKENS``): "clean" (prompt and clean tokens)
    or "all" (the whole row: the same loss at a higher cost, kept to measure the saving). Applied when packing."""

    def __post_init__(self):
        if self.mask not in MASK_KINDS:
            raise ValueError(f"loss.mask must be one of {MASK_KINDS}, got {self.mask!r}")
        if self.ar_teacher not in AR_TEACHERS:
            raise ValueError(f"loss.ar_teacher must be one of {AR_TEACHERS}, got {self.ar_teacher!r}")
        if self.ar_reference is not None and self.ar_teacher != "reference":
            raise ValueError("loss.ar_reference names the model to distil from; it needs loss.ar_teacher=reference")
        if self.teacher_tokens not in TEACHER_TOKENS:
            raise ValueError(f"loss.teacher_tokens must be one of {TEACHER_TOKENS}, got {self.teacher_tokens!r}")
        if self.ar_weight < 0 or self.consistency_weight < 0:
            raise ValueError("loss weights must be >= 0")


def batch_meta(batch) -> TokenMeta:
    return TokenMeta(position=batch["position"], segment=batch["segment"], stream=batch["stream"],
                     block=batch["block"])


def loss_normalizers(batch) -> dict:
    """Token counts of a (full, not micro) batch: the denominators of both losses (at least 1)."""
    return dict(ar=jnp.maximum(jnp.sum(batch["ar_weight"]), 1.0),
                consistency=jnp.maximum(jnp.sum((batch["cons_weight"] > 0).astype(jnp.float32)), 1.0))


def _gather_rows(x, index):
    """x [B, L, ...], index [B, M] -> [B, M, ...]."""
    return jax.vmap(lambda xb, ib: xb[ib])(x, index)


def _teacher_rows(x, batch, fill=None):
    """x [B, L, ...] at the batch's ``teacher_index`` [B, L_t] -> [B, L_t, ...]; ``fill`` where the index pads
    (None: row 0's entry, for values that a zero weight or a padding segment already cancels)."""
    index = batch["teacher_index"]
    picked = _gather_rows(x, jnp.maximum(index, 0))
    if fill is None:
        return picked
    valid = index >= 0
    return jnp.where(valid.reshape(valid.shape + (1,) * (picked.ndim - 2)), picked, fill)


def weighted_sums_from_logits(z, batch, reference_z=None) -> dict:
    """Un-normalised loss sums from float32 logits z [B, L, V]: {"ar": sum w*ce, "consistency": sum w*soft_ce}.

    reference_z: a frozen reference model's logits [B, L_t, V] at the batch's ``teacher_index`` positions; when
    given, the AR term is KL(reference || model) per position instead of the cross-entropy on ``ar_target``
    (every position with an AR weight is among them)."""
    lse = jax.nn.logsumexp(z, axis=-1)  # [B, L]
    if reference_z is None:
        target_logit = jnp.take_along_axis(z, batch["ar_target"][..., None], axis=-1)[..., 0]  # [B, L]
        ar = jnp.sum(batch["ar_weight"] * (lse - target_logit))
    else:
        log_r = jax.nn.log_softmax(jax.lax.stop_gradient(reference_z), axis=-1)  # [B, L_t, V]
        log_q = _teacher_rows(z, batch) - _teacher_rows(lse, batch)[..., None]
        kl = jnp.sum(jnp.exp(log_r) * (log_r - log_q), axis=-1)  # [B, L_t]
        ar = jnp.sum(_teacher_rows(batch["ar_weight"], batch, 0.0) * kl)

    student = _gather_rows(z, batch["cons_student"])  # [B, M, V]
    teacher = jax.lax.stop_gradient(_gather_rows(z, batch["cons_teacher"]))  # [B, M, V]
    student_lse = _gather_rows(lse, batch["cons_student"])  # [B, M]
    soft_ce = student_lse - jnp.sum(jax.nn.softmax(teacher, axis=-1) * student, axis=-1)
    consistency = jnp.sum(batch["cons_weight"] * soft_ce)
    return dict(ar=ar, consistency=consistency)


def _logits(params: Params, cfg: ModelConfig, tokens, meta: TokenMeta, lcfg: LossConfig):
    hidden, _ = model.forward(params, cfg, tokens, meta=meta, mask_kind=lcfg.mask)
    return model.logits(params, cfg, hidden)


def reference_logits(reference: Params, cfg: ModelConfig, batch, lcfg: LossConfig):
    """The reference model's logits [B, L_t, V] over the ``teacher_index`` tokens alone, each with its own
    position, stream and block, so the mask gives them what they see in the whole row (prompt and clean
    tokens see no noisy token); padding entries get segment -1."""
    meta = batch_meta(batch)
    teacher_meta = TokenMeta(position=_teacher_rows(meta.position, batch),
                             segment=_teacher_rows(meta.segment, batch, fill=-1),
                             stream=_teacher_rows(meta.stream, batch), block=_teacher_rows(meta.block, batch))
    tokens = _teacher_rows(batch["tokens"], batch)
    return jax.lax.stop_gradient(_logits(reference, cfg, tokens, teacher_meta, lcfg))


def check_reference(lcfg: LossConfig, reference: Params | None) -> None:
    if lcfg.ar_teacher == "reference" and reference is None:
        raise ValueError("loss.ar_teacher=reference needs the reference model's parameters (reference=...)")


def weighted_sums(params: Params, cfg: ModelConfig, batch, lcfg: LossConfig, reference: Params | None = None) -> dict:
    """Runs the model on a packed batch and returns the un-normalised loss sums. ``reference``: the frozen
    reference parameters (same config) that ``ar_teacher="reference"`` distils from; ignored otherwise."""
    check_reference(lcfg, reference)
    reference_z = reference_logits(reference, cfg, batch, lcfg) if lcfg.ar_teacher == "reference" else None
    return weighted_sums_from_logits(_logits(params, cfg, batch["tokens"], batch_meta(batch), lcfg), batch,
                                     reference_z)


def combine(sums: dict, norms: dict, lcfg: LossConfig) -> tuple[jax.Array, dict]:
    """(total loss, metrics) from weighted sums and normalisers."""
    ar = sums["ar"] / norms["ar"]
    consistency = sums["consistency"] / norms["consistency"]
    total = lcfg.ar_weight * ar + lcfg.consistency_weight * consistency
    return total, {"loss/total": total, "loss/ar": ar, "loss/consistency": consistency}


def loss_fn(params: Params, cfg: ModelConfig, batch, lcfg: LossConfig, norms: dict | None = None,
            reference: Params | None = None):
    """Total loss of ``batch`` (a micro-batch when ``norms`` come from the full batch) and its metrics."""
    norms = loss_normalizers(batch) if norms is None else norms
    return combine(weighted_sums(params, cfg, batch, lcfg, reference), norms, lcfg)

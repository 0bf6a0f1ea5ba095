"""Host-side packing: Jacobi trajectories -> padded training batches with per-token mask data (numpy only).

One response with prompt ``x`` (length P) and T blocks of size n becomes one sequence (docs/method.md, section 4)::

    index     0 .. P-1 | P+2jn .. P+2jn+n-1 | P+(2j+1)n .. P+(2j+2)n-1     (j = 0 .. T-1)
    token     x        | noisy_j            | clean_j = y*_j
    position  0 .. P-1 | P+jn .. P+jn+n-1   | P+jn .. P+jn+n-1             (the two copies share positions)
    stream    0        | 1 (STREAM_NOISY)   | 2 (STREAM_CLEAN)
    block     -1       | j                  | j

The attention mask is not built here: attention evaluates ``pallas_kernels.mask.allowed`` on these arrays.

Targets (docs/method.md, section 5 and decision 5):

* AR pairs (weight 1), all in the clean stream: prompt p -> p+1 (only if ``train_prompt``), the bridge
  P-1 -> clean_0[0], the bridges last(clean_{j-1}) -> clean_j[0], and i -> i+1 inside clean_j; a pair counts
  only if its target is at or before the first EOS of the response.
* Consistency pairs: for block j with first divergence f_j (``noise_schedule.first_divergence`` of noisy_j
  against y*_j; blocks with none are skipped), student ``P+2jn+t`` and teacher ``P+(2j+1)n+t`` for
  t = f_j .. n-1, each weighted 1/T. A pair is dropped when the token its logit predicts lies after the first
  EOS (response index j*n+t+1 > EOS index): post-EOS student positions are not trained (REF forgets this).

EOS: if the first EOS of the response falls in block j_e, blocks after j_e are dropped (T = j_e + 1), and
clean tokens after the EOS are replaced by ``pad_id`` (REF's ``_flip_block_after_eos_to_pad``); validity is
decided by position, not by comparing with ``pad_id``, so ``pad_id == eos_id`` is safe.

Batches: each row holds one or more sequences (``segment`` 0, 1, ...; positions restart per sequence);
padding tokens have segment -1 and zero weights. Rows have a bucketed length L and consistency pairs are
stored compactly as ``[B, L // 2]`` index arrays (a sequence never has more pairs than noisy tokens).
``teacher_index`` [B, L_t] lists, in order, the row's prompt and clean tokens (-1 pads it): the only positions
with AR targets, which never attend to noisy tokens, so a frozen reference model distilled from
(``loss.ar_teacher=reference``) runs over these L_t <= L tokens alone and gives the logits it would give them
inside the whole row.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jf_jax.training.noise_schedule import first_divergence, select_noisy_blocks
from pallas_kernels.mask import STREAM_CLEAN, STREAM_CONTEXT, STREAM_NOISY

BATCH_KEYS = ("tokens", "position", "segment", "stream", "block", "ar_target", "ar_weight",
              "cons_student", "cons_teacher", "cons_weight", "teacher_index")
TEACHER_TOKENS = ("clean", "all")
"""What ``teacher_index`` lists: "clean" (prompt and clean tokens) or "all" (every real token of the row: the
same reference logits where there are AR targets, at the cost of the whole row; kept to measure the saving)."""
_TEACHER_ROUND = 16  # teacher lengths are rounded up to this (a bucket has one teacher length either way)


@dataclasses.dataclass(frozen=True)
class Example:
    """One response ready for packing: prompt [P], chosen noisy states [T, n], fixed points [T, n]."""

    prompt: np.ndarray
    noisy: np.ndarray
    clean: np.ndarray

    def __post_init__(self):
        if self.noisy.ndim != 2 or self.noisy.shape != self.clean.shape or self.noisy.shape[0] < 1:
            raise ValueError(f"noisy {self.noisy.shape} and clean {self.clean.shape} must be equal [T >= 1, n]")
        if self.prompt.ndim != 1 or self.prompt.size < 1:
            raise ValueError(f"prompt must be a non-empty vector, got shape {self.prompt.shape}")


def example_from_records(records, window: int, schedule: str = "progressive",
                         rng: np.random.Generator | None = None) -> Example:
    """Applies the noise schedule to one response's records (``trajectories.Record``, blocks in order)."""
    noisy, clean, _ = select_noisy_blocks([r.states for r in records], window, schedule, rng)
    return Example(np.asarray(records[0].prompt_ids, np.int32), noisy, clean)


@dataclasses.dataclass(frozen=True)
class PackedSequence:
    """One packed response; every per-token array has length P + 2Tn."""

    tokens: np.ndarray
    position: np.ndarray
    stream: np.ndarray
    block: np.ndarray
    ar_target: np.ndarray
    ar_weight: np.ndarray
    cons_student: np.ndarray
    """[M] local indices of consistency students (noisy positions)."""
    cons_teacher: np.ndarray
    """[M] local indices of their teachers (clean positions at the same offset)."""
    cons_weight: np.ndarray
    """[M] 1/T each."""

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def pack_example(ex: Example, *, eos_id: int | None, pad_id: int, train_prompt: bool = True) -> PackedSequence:
    prompt, noisy, clean = (np.asarray(a, np.int32) for a in (ex.prompt, ex.noisy, ex.clean))
    P, (T, n) = prompt.shape[0], clean.shape
    response = clean.reshape(-1)
    eos_at = np.flatnonzero(response == eos_id) if eos_id is not None else np.zeros(0, np.int64)
    eos_index = int(eos_at[0]) if eos_at.size else None  # response index of the first EOS
    if eos_index is not None:
        T = eos_index // n + 1
        noisy, clean = noisy[:T], clean[:T].copy()
        flat = clean.reshape(-1)
        flat[eos_index + 1:] = pad_id
    last_valid = eos_index if eos_index is not None else T * n  # response indices <= this are real targets

    L = P + 2 * T * n
    tokens = np.empty(L, np.int32)
    position = np.empty(L, np.int32)
    stream = np.full(L, STREAM_CONTEXT, np.int32)
    block = np.full(L, -1, np.int32)
    tokens[:P], position[:P] = prompt, np.arange(P)
    offs = np.arange(n)
    for j in range(T):
        s_noisy, s_clean = P + 2 * j * n, P + (2 * j + 1) * n
        tokens[s_noisy:s_noisy + n], tokens[s_clean:s_clean + n] = noisy[j], clean[j]
        position[s_noisy:s_noisy + n] = position[s_clean:s_clean + n] = P + j * n + offs
        stream[s_noisy:s_noisy + n], stream[s_clean:s_clean + n] = STREAM_NOISY, STREAM_CLEAN
        block[s_noisy:s_noisy + n] = block[s_clean:s_clean + n] = j

    # AR: the clean stream in order is prompt ++ clean_0 ++ clean_1 ...; each element predicts the next one.
    clean_index = np.concatenate([np.arange(P)] + [P + (2 * j + 1) * n + offs for j in range(T)])
    ar_target = np.zeros(L, np.int32)
    ar_weight = np.zeros(L, np.float32)
    src, dst = clean_index[:-1], clean_index[1:]
    ar_target[src] = tokens[dst]
    response_index = np.arange(src.size) + 1 - P  # response index of each pair's target (<0: inside prompt)
    keep = (response_index <= last_valid) & ((response_index >= 0) | train_prompt)
    ar_weight[src] = keep.astype(np.float32)

    students, teachers = [], []
    for j in range(T):
        f = first_divergence(noisy[j], ex.clean[j])
        t = np.arange(f, n)
        t = t[j * n + t + 1 <= last_valid]
        students.append(P + 2 * j * n + t)
        teachers.append(P + (2 * j + 1) * n + t)
    cons_student = np.concatenate(students).astype(np.int32)
    cons_teacher = np.concatenate(teachers).astype(np.int32)
    cons_weight = np.full(cons_student.shape, 1.0 / T, np.float32)
    return PackedSequence(tokens, position, stream, block, ar_target, ar_weight,
                          cons_student, cons_teacher, cons_weight)


def bucket_for(length: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket holding ``length`` tokens (None if none does)."""
    fitting = [b for b in sorted(buckets) if b >= length]
    return fitting[0] if fitting else None


def assign_rows(lengths: Sequence[int], row_len: int) -> list[list[int]]:
    """Greedy first-fit of sequences (in the given order) into rows of ``row_len`` tokens."""
    rows, free = [], []
    for i, length in enumerate(lengths):
        if length > row_len:
            raise ValueError(f"sequence {i} has {length} tokens, more than the row length {row_len}")
        for r, space in enumerate(free):
            if length <= space:
                rows[r].append(i)
                free[r] -= length
                break
        else:
            rows.append([i])
            free.append(row_len - length)
    return rows


def teacher_positions(seq: PackedSequence, teacher_tokens: str = "clean") -> np.ndarray:
    """Local indices of the tokens a reference model's forward covers (``TEACHER_TOKENS``), in order."""
    if teacher_tokens not in TEACHER_TOKENS:
        raise ValueError(f"teacher_tokens must be one of {TEACHER_TOKENS}, got {teacher_tokens!r}")
    if teacher_tokens == "all":
        return np.arange(len(seq))
    return np.flatnonzero(seq.stream != STREAM_NOISY)


def teacher_length(counts: Sequence[int], row_len: int) -> int:
    """A static teacher length for rows of one sequence each with these teacher token counts: the largest,
    rounded up to a multiple of 16, at most ``row_len``."""
    return min(row_len, -(-max(max(counts, default=1), 1) // _TEACHER_ROUND) * _TEACHER_ROUND)


def make_batch(rows: Sequence[Sequence[PackedSequence]], row_len: int, *, pad_id: int,
               batch_size: int | None = None, teacher_len: int | None = None,
               teacher_tokens: str = "clean") -> dict[str, np.ndarray]:
    """Pads rows of packed sequences into a batch dict (keys ``BATCH_KEYS``), [B, row_len] / [B, row_len // 2] /
    ``teacher_index`` [B, teacher_len] (default ``row_len``).

    ``batch_size`` (default ``len(rows)``) adds empty all-padding rows so every batch has the same shape.
    """
    teacher_len = row_len if teacher_len is None else teacher_len
    B = len(rows) if batch_size is None else batch_size
    if len(rows) > B:
        raise ValueError(f"{len(rows)} rows do not fit a batch of {B}")
    M = row_len // 2
    out = dict(tokens=np.full((B, row_len), pad_id, np.int32), position=np.zeros((B, row_len), np.int32),
               segment=np.full((B, row_len), -1, np.int32), stream=np.full((B, row_len), STREAM_CONTEXT, np.int32),
               block=np.full((B, row_len), -1, np.int32), ar_target=np.zeros((B, row_len), np.int32),
               ar_weight=np.zeros((B, row_len), np.float32), cons_student=np.zeros((B, M), np.int32),
               cons_teacher=np.zeros((B, M), np.int32), cons_weight=np.zeros((B, M), np.float32),
               teacher_index=np.full((B, teacher_len), -1, np.int32))
    for b, row in enumerate(rows):
        start, pairs, taught = 0, 0, 0
        for seg, seq in enumerate(row):
            end = start + len(seq)
            if end > row_len:
                raise ValueError(f"row {b} needs {end} tokens, more than the row length {row_len}")
            for key in ("tokens", "position", "stream", "block", "ar_target", "ar_weight"):
                out[key][b, start:end] = getattr(seq, key)
            out["segment"][b, start:end] = seg
            m = seq.cons_student.shape[0]
            out["cons_student"][b, pairs:pairs + m] = seq.cons_student + start
            out["cons_teacher"][b, pairs:pairs + m] = seq.cons_teacher + start
            out["cons_weight"][b, pairs:pairs + m] = seq.cons_weight
            t = teacher_positions(seq, teacher_tokens)
            if taught + t.size > teacher_len:
                raise ValueError(f"row {b} has more than teacher_len={teacher_len} {teacher_tokens} teacher tokens")
            out["teacher_index"][b, taught:taught + t.size] = t + start
            start, pairs, taught = end, pairs + m, taught + t.size
    return out


class BatchStream:
    """Deterministic batches as a function of the step: ``batch(step)`` depends only on (seed, step).

    Each epoch shuffles the sequences with ``default_rng([seed, epoch])``, groups them by length bucket,
    forms rows (one sequence per row, or several first-fit into the bucket length with ``pack_rows``), cuts
    each bucket's rows into batches of ``batch_size`` (the last one padded with empty rows), and shuffles the
    batch order. Resuming at any step therefore reproduces the uninterrupted data order exactly.
    Sequences longer than the largest bucket are dropped (``num_dropped``). Every batch of a bucket has the same
    teacher length (``teacher_lengths``), so a bucket still compiles one train step: the most teacher tokens of
    any of its sequences (one sequence per row), or the bucket length when rows pack several.
    """

    def __init__(self, sequences: Sequence[PackedSequence], *, batch_size: int, buckets: Sequence[int],
                 pad_id: int, seed: int = 0, pack_rows: bool = False, teacher_tokens: str = "clean"):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        fits = [bucket_for(len(s), buckets) is not None for s in sequences]
        self.sequences = [s for s, ok in zip(sequences, fits) if ok]
        self.num_dropped = len(sequences) - len(self.sequences)
        if not self.sequences:
            raise ValueError(f"no sequence fits the largest bucket {max(buckets)} "
                             f"(shortest has {min(len(s) for s in sequences) if sequences else 0} tokens)")
        self.batch_size, self.buckets, self.pad_id = batch_size, sorted(buckets), pad_id
        self.seed, self.pack_rows, self.teacher_tokens = seed, pack_rows, teacher_tokens
        counts: dict[int, list[int]] = {}
        for s in self.sequences:
            counts.setdefault(bucket_for(len(s), self.buckets), []).append(teacher_positions(s, teacher_tokens).size)
        self.teacher_lengths = {b: b if pack_rows else teacher_length(c, b) for b, c in counts.items()}
        self._plans: dict[int, list[tuple[int, list[list[int]]]]] = {}
        self._epoch_starts = [0]

    def plan(self, epoch: int) -> list[tuple[int, list[list[int]]]]:
        """The epoch's batches as (row length, rows of sequence indices)."""
        if epoch not in self._plans:
            rng = np.random.default_rng([self.seed, epoch])
            order = rng.permutation(len(self.sequences))
            by_bucket: dict[int, list[int]] = {}
            for i in order:
                by_bucket.setdefault(bucket_for(len(self.sequences[i]), self.buckets), []).append(int(i))
            batches = []
            for row_len in sorted(by_bucket):
                idx = by_bucket[row_len]
                rows = ([[idx[r] for r in row] for row in assign_rows([len(self.sequences[i]) for i in idx], row_len)]
                        if self.pack_rows else [[i] for i in idx])
                batches += [(row_len, rows[k:k + self.batch_size]) for k in range(0, len(rows), self.batch_size)]
            self._plans = {epoch: [batches[k] for k in rng.permutation(len(batches))]}  # keep one epoch cached
        return self._plans[epoch]

    def locate(self, step: int) -> tuple[int, int]:
        """(epoch, index within the epoch) of a 0-based step."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        epoch = 0
        while True:
            if epoch + 1 >= len(self._epoch_starts):
                self._epoch_starts.append(self._epoch_starts[epoch] + len(self.plan(epoch)))
            if step < self._epoch_starts[epoch + 1]:
                return epoch, step - self._epoch_starts[epoch]
            epoch += 1

    def batch(self, step: int) -> dict[str, np.ndarray]:
        epoch, k = self.locate(step)
        row_len, rows = self.plan(epoch)[k]
        return make_batch([[self.sequences[i] for i in row] for row in rows], row_len, pad_id=self.pad_id,
                          batch_size=self.batch_size, teacher_len=self.teacher_lengths[row_len],
                          teacher_tokens=self.teacher_tokens)


def pack_ar_example(ex: Example, *, eos_id: int | None, pad_id: int, train_prompt: bool = True) -> PackedSequence:
    """The plain AR layout of the same data: ``prompt ++ y*_0 ++ y*_1 ...`` as ordinary causal tokens.

    Same EOS handling and AR pairs as ``pack_example`` and no consistency pairs; the AR loss of this layout
    must equal the AR loss of the packed Jacobi Forcing layout (it is the AR-only control's input format).
    """
    full = pack_example(ex, eos_id=eos_id, pad_id=pad_id, train_prompt=train_prompt)
    keep = full.stream != STREAM_NOISY
    tokens = full.tokens[keep]
    ar_target = np.zeros_like(tokens)
    ar_target[:-1] = tokens[1:]
    ar_weight = full.ar_weight[keep]  # the clean stream keeps its order, so pair i -> i+1 keeps its weight
    empty_i, empty_f = np.zeros(0, np.int32), np.zeros(0, np.float32)
    return PackedSequence(tokens, np.arange(tokens.size, dtype=np.int32), np.full_like(tokens, STREAM_CONTEXT),
                          np.full_like(tokens, -1), ar_target, ar_weight, empty_i, empty_i, empty_f)

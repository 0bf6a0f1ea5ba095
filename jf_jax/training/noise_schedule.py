"""Which stored Jacobi state of each block becomes the noisy block of a training sequence.

docs/method.md, section 3 and decision 3. For a block with stored states ``s_0 .. s_K`` (``s_0`` = the true
random draft, ``s_K`` = the fixed point ``y*``):

* first divergence ``f(s) = min{i : s[i] != y*[i]}`` (``n`` if ``s == y*``);
* noise ratio ``r(s) = (n - f(s)) / n``: the length of the suffix from the first wrong token, over n (not the
  number of wrong tokens);
* schedule levels ``{0, 1/w, ..., (w-1)/w}`` (the paper's Eq. 7; REF's ``linspace(0, 1, w)`` is not used);
* block ``j`` (0-based within its response) gets a target level, and the state whose ratio is closest to it is
  chosen, ties going to the earlier state (numpy ``argmin``):

  - ``progressive`` (the method): level ``j mod w``;
  - ``reverse`` (ablation): level ``w - 1 - (j mod w)``, i.e. 1 -> 0 within each window;
  - ``random`` (ablation): a level drawn uniformly per block from a caller-supplied ``numpy`` Generator.
"""

from __future__ import annotations

import numpy as np

SCHEDULES = ("progressive", "reverse", "random")


def first_divergence(state, fixed_point) -> int:
    """Index of the first position where ``state`` differs from ``fixed_point`` (``n`` when equal)."""
    state, fixed_point = np.asarray(state), np.asarray(fixed_point)
    if state.shape != fixed_point.shape or state.ndim != 1:
        raise ValueError(f"state {state.shape} and fixed point {fixed_point.shape} must be equal-length vectors")
    diff = np.flatnonzero(state != fixed_point)
    return int(diff[0]) if diff.size else int(state.shape[0])


def noise_ratio(state, fixed_point) -> float:
    """``(n - f) / n`` with ``f`` the first divergence from the fixed point."""
    n = np.asarray(fixed_point).shape[0]
    return (n - first_divergence(state, fixed_point)) / n


def schedule_levels(window: int) -> np.ndarray:
    """The linear levels ``{0, 1/w, ..., (w-1)/w}``."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    return np.arange(window, dtype=np.float64) / window


def target_level(block_index: int, window: int, schedule: str = "progressive",
                 rng: np.random.Generator | None = None) -> int:
    """The scheduled level index ``i`` of block ``block_index`` (0-based in its response); the ratio is i / w."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if block_index < 0:
        raise ValueError(f"block_index must be >= 0, got {block_index}")
    if schedule == "progressive":
        return block_index % window
    if schedule == "reverse":
        return window - 1 - block_index % window
    if schedule == "random":
        if rng is None:
            raise ValueError("the random schedule needs a numpy Generator (rng=...)")
        return int(rng.integers(window))
    raise ValueError(f"unknown noise schedule {schedule!r}; expected one of {SCHEDULES}")


def target_ratio(block_index: int, window: int, schedule: str = "progressive",
                 rng: np.random.Generator | None = None) -> float:
    """The scheduled noise ratio of block ``block_index``: ``target_level(...) / window``."""
    return target_level(block_index, window, schedule, rng) / window


def state_ratios(states) -> np.ndarray:
    """Noise ratios of every stored state ``[K+1, n]`` against the last one (the fixed point)."""
    states = _check_states(states)
    return np.array([noise_ratio(s, states[-1]) for s in states])


def select_state(states, level: int, window: int) -> int:
    """Index of the state whose noise ratio is closest to ``level / window`` (ties: the earliest state).

    Distances are compared exactly in integers, ``|(n - f) * w - level * n|``, so ties are real ties.
    """
    states = _check_states(states)
    n = states.shape[1]
    suffix = np.array([n - first_divergence(s, states[-1]) for s in states], np.int64)
    return int(np.argmin(np.abs(suffix * window - level * n)))


def _check_states(states) -> np.ndarray:
    states = np.asarray(states)
    if states.ndim != 2 or states.shape[0] < 1 or states.shape[1] < 1:
        raise ValueError(f"states must be [num_states >= 1, n >= 1], got shape {states.shape}")
    return states


def select_noisy_blocks(blocks, window: int, schedule: str = "progressive",
                        rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Applies the schedule to the blocks of one response.

    blocks: sequence of ``[K_j + 1, n]`` state arrays, block 0 first. Returns ``(noisy [T, n], clean [T, n],
    chosen [T])``: the chosen state of each block, its fixed point, and the index of the chosen state.
    """
    if len(blocks) == 0:
        raise ValueError("a response needs at least one block")
    noisy, clean, chosen = [], [], []
    for j, states in enumerate(blocks):
        states = np.asarray(states)
        k = select_state(states, target_level(j, window, schedule, rng), window)
        noisy.append(states[k])
        clean.append(states[-1])
        chosen.append(k)
    widths = {b.shape[0] for b in noisy}
    if len(widths) != 1:
        raise ValueError(f"all blocks of a response must have the same size, got {sorted(widths)}")
    return np.stack(noisy).astype(np.int32), np.stack(clean).astype(np.int32), np.asarray(chosen, np.int32)

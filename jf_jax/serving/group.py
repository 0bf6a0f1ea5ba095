"""One (method, block size) pair a server decodes with: its slots, its batch state and its lanes.

A group is a batch of B slots in one loop state of the pair's decoder (``serving.batch``), with one decoder per
sampling setting, a *lane*: temperature and top_p are static in the decoders' programs. The engine
(``serving.engine``) holds one group per ``ServedMethod`` it serves and steps every group that has running rows,
one after the other; groups share the weights and nothing else, so a row meets exactly the programs and states it
would on a server of that one pair. Rows of two pairs cannot share a batch state: the loop states differ in
structure between methods (an mr state has a pool and several blocks) and in shape between block sizes.

On a mesh (``jf-jax serve --mesh``) the weights are split as ``decoding.placement`` places them, the batch state's
rows over the batch axes and its KV cache's heads over ``tensor`` (``batch.place_state``), and every program is
traced under the mesh (``placement.traced_on``), as ``jf-jax decode --mesh`` runs them.

Everything here runs in the engine's threads; the engine's lock guards ``lanes`` and ``slots``.
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np

from jf_jax.decoding.placement import traced_on
from jf_jax.decoding.sampling import GREEDY, Sampling
from jf_jax.model.config import ModelConfig
from jf_jax.serving import batch as rows
from jf_jax.serving.metrics import method_labels


class ShutDown(Exception):
    """Compiling stopped because the server is shutting down."""


@dataclasses.dataclass
class Lane:
    """One decoder of a group: the group's pair at one sampling setting, and whether its programs are compiled."""

    method: rows.ServedMethod
    sampling: Sampling
    decoder: rows.BlockDecoder
    ready: threading.Event = dataclasses.field(default_factory=threading.Event)
    error: str | None = None


class Group:
    """The slots of one ``ServedMethod``: a batch state of ``layout.rows`` rows and the lanes that step it."""

    def __init__(self, cfg: ModelConfig, params, eos: np.ndarray, batch: rows.BatchConfig, mesh=None):
        self.cfg, self.params, self.eos, self.batch, self.mesh = cfg, params, eos, batch, mesh
        self.method = batch.served_method
        self.label = method_labels(self.method.method, self.method.block_size)
        self.layout = rows.plan_layout(cfg, batch)
        self.lanes: dict[Sampling, Lane] = {}
        self.slots: list = [None] * self.layout.rows
        """The request (``engine.Handle``) holding each row, or None."""
        self.state = None

    def new_lane(self, sampling: Sampling) -> Lane:
        lane = Lane(self.method, sampling, rows.make_decoder(self.cfg, self.batch, sampling, self.layout.shape))
        self.lanes[sampling] = lane
        return lane

    def prefill(self, lane: Lane, prompt, max_new: int, seed: int):
        with traced_on(self.mesh):
            return rows.prefill_row(lane.decoder, self.params, self.layout, list(prompt), max_new, self.eos, seed)

    def compile_lane(self, lane: Lane, closing: threading.Event) -> None:
        """Compiles a lane's programs (one prefill per prompt bucket and its step) on throwaway states; raises
        ``ShutDown`` between two programs once ``closing`` is set."""
        row = None
        for width in self.layout.prompt_buckets:
            if closing.is_set():
                raise ShutDown
            row = self.prefill(lane, self._filler(width), 1, seed=0)
        with traced_on(self.mesh):
            rows.read_rows(lane.decoder.step(self.params, self._empty_batch(row)))

    def warm_up(self, lanes: list[Lane]) -> None:
        """The group's batch state, built so that every program a request can reach is compiled: the row insertion
        of every prompt bucket, marking a row done, and each lane's step on the real state (its arrays are the ones
        requests will meet)."""
        self.reset()
        greedy = self.lanes[GREEDY]
        for width in self.layout.prompt_buckets:
            self.insert(self.prefill(greedy, self._filler(width), 1, seed=0), 0)
        self.finish(0)
        with traced_on(self.mesh):
            for lane in lanes:
                self.state = lane.decoder.step(self.params, self.state)
        rows.read_rows(self.state)

    def reset(self) -> None:
        """A fresh batch state of done rows (also after a failure that may have consumed the old one: its buffers
        are donated)."""
        self.state = self._empty_batch(self.prefill(self.lanes[GREEDY], [0], 1, seed=0))

    def _empty_batch(self, row):
        with traced_on(self.mesh):
            return rows.place_state(self.mesh, rows.empty_batch(row, self.layout))

    def _filler(self, width: int) -> list[int]:
        return [0] * min(width, self.layout.max_context - 1)

    def insert(self, row, slot: int) -> None:
        with traced_on(self.mesh):
            self.state = rows.insert_row(self.state, row, slot)

    def finish(self, slot: int) -> None:
        with traced_on(self.mesh):
            self.state = rows.finish_row(self.state, slot)

    def running(self) -> np.ndarray:
        return np.array([h is not None for h in self.slots])

    def step(self) -> tuple[np.ndarray, int, tuple]:
        """One step of every running row: (rows holding a request, rows that took a forward, the host copies of
        ``batch.read_rows`` after it). One program call when every running row is in one lane; otherwise each lane
        steps with the other lanes' rows marked done (a done row keeps its state and commits nothing)."""
        running = self.running()
        lane_of = [h.request.sampling if h is not None else None for h in self.slots]
        active = list(dict.fromkeys(s for s in lane_of if s is not None))
        before = np.asarray(self.state.done)
        with traced_on(self.mesh):
            return self._step_lanes(running, lane_of, active, before)

    def _step_lanes(self, running: np.ndarray, lane_of: list, active: list, before: np.ndarray):
        if len(active) == 1:  # the other rows are done already
            self.state = self.lanes[active[0]].decoder.step(self.params, self.state)
        else:
            done = before.copy()
            for sampling in active:
                # a row done at its prefill (EOS first, max_tokens 1) stays done: un-marking it would decode on
                mine = running & ~before & np.array([s == sampling for s in lane_of])
                if mine.any():
                    self.state = rows.with_done(self.state, ~mine)
                    self.state = self.lanes[sampling].decoder.step(self.params, self.state)
                    done[mine] = np.asarray(self.state.done)[mine]
            self.state = rows.with_done(self.state, done)
        return running, int((running & ~before).sum()), rows.read_rows(self.state)

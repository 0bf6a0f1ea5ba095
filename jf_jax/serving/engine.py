"""The continuous-batching engine: B slots, one scheduler thread, Jacobi (or AR / mr) steps over the whole batch.

The scheduler loop, between two steps of the batch:

1. admits waiting requests into free slots, oldest first: each is prefilled alone as a one-row state and written
   into its slot (``serving.batch``); the rows already running are not touched;
2. frees the slots of requests whose client went away (the row is marked done: it costs nothing more);
3. runs one ``step`` of the batch: one forward for every running row, each row accepting one or more tokens
   (a Jacobi iteration may accept several);
4. reads each row's new tokens and hands them to its request (text, stop strings: ``serving.text``), and frees the
   rows that ended on EOS, ``max_tokens`` or a stop string.

Sampling settings (temperature, top_p) are static in the decoders' programs, so the engine keeps one decoder per
setting, a *lane*; rows of different lanes share the batch state and, when several lanes run at once, each lane's
step runs with the other lanes' rows marked done (a done row keeps its state and commits nothing). Greedy and the
settings named at start are compiled during warm-up; a new setting compiles in a background thread (its requests
wait in the queue meanwhile, the batch keeps running), up to ``max_sampling`` settings.

Each request is decoded with the keys it would get alone (``batch.prefill_row``), so its tokens are those of
``api.generate`` on its prompt alone, whatever shares the batch and whenever it arrived.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading
import time

import numpy as np

from jf_jax.decoding.common import StopReason, eos_array
from jf_jax.decoding.sampling import GREEDY, Sampling
from jf_jax.model.decode_view import as_decode_view
from jf_jax.serving import batch as rows
from jf_jax.serving.metrics import Metrics, count_compilations
from jf_jax.serving.protocol import APIError, GenerationRequest
from jf_jax.serving.responses import Outcome
from jf_jax.serving.text import TextStream

log = logging.getLogger("jf_jax.serve")
IDLE_WAIT_S = 0.05


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    batch: rows.BatchConfig = rows.BatchConfig()
    max_queue: int = 64
    """Requests waiting for a slot; one more gets 429."""
    max_sampling: int = 4
    """Distinct (temperature, top_p) settings the engine compiles, greedy included."""
    warm_sampling: tuple[Sampling, ...] = ()
    """Settings compiled at warm-up beside greedy."""


class Handle:
    """One request inside the engine. Its events go to an asyncio queue of the loop that submitted it:
    ("text", text, ids), then ("done", text, Outcome) or ("error", APIError)."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop, decode):
        self.request = request
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        self.arrival = time.perf_counter()
        self.last_tokens: float | None = None
        self.text = TextStream(decode, request.stop)
        self.slot: int | None = None
        self.seen = 0  # the row's tokens already read out

    def send(self, *event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody listens any more
            self.cancelled.set()


@dataclasses.dataclass
class Lane:
    sampling: Sampling
    decoder: rows.BlockDecoder
    ready: threading.Event = dataclasses.field(default_factory=threading.Event)
    error: str | None = None


class Engine:
    def __init__(self, model, config: EngineConfig):
        self.model, self.config = model, config
        self.params = as_decode_view(model.params)
        self.layout = rows.plan_layout(model.cfg, config.batch)
        self.eos = eos_array(model.tokenizer.eos_ids)
        self.metrics = Metrics()
        self.lanes: dict[Sampling, Lane] = {}
        self.queue: collections.deque[Handle] = collections.deque()
        self.slots: list[Handle | None] = [None] * self.layout.rows
        self.state = None
        self.lock = threading.Condition()
        self.ready = threading.Event()
        self.failure: str | None = None
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="jf-jax-scheduler", daemon=True)

    # --- called from the HTTP side ------------------------------------------------------------------

    def start(self) -> "Engine":
        self.thread.start()
        return self

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            self.lock.notify_all()
        self.thread.join(timeout=30)

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> Handle:
        """Queues ``request``; 503 before warm-up ends, 429 when the queue is full, 400 for one sampling setting too
        many."""
        if not self.ready.is_set():
            raise APIError(503, self.failure or "the server is still warming up", kind="server_error",
                           code="not_ready", headers={"Retry-After": "5"})
        handle = Handle(request, loop, self.model.tokenizer.decode)
        with self.lock:
            if len(self.queue) >= self.config.max_queue:
                raise APIError(429, f"the queue is full ({self.config.max_queue} requests wait for a slot of "
                                    f"{self.layout.rows}); retry later", kind="rate_limit_error", code="queue_full",
                               headers={"Retry-After": "1"})
            self._lane(request.sampling)
            self.queue.append(handle)
            self.lock.notify_all()
        return handle

    def cancel(self, handle: Handle) -> None:
        """The client went away: the row (or queue entry) is dropped at the next iteration."""
        handle.cancelled.set()
        with self.lock:
            self.lock.notify_all()

    def gauges(self) -> dict[str, tuple[str, float]]:
        with self.lock:
            running = sum(h is not None for h in self.slots)
            return {"queue_depth": ("requests waiting for a slot", len(self.queue)),
                    "running_requests": ("requests holding a slot", running),
                    "batch_slots": ("rows of the batch (--max-batch)", self.layout.rows),
                    "batch_occupancy": ("fraction of the batch's rows holding a request", running / self.layout.rows),
                    "sampling_lanes": ("sampling settings compiled or compiling", len(self.lanes)),
                    "ready": ("1 once warm-up is done", float(self.ready.is_set()))}

    # --- lanes: one decoder per sampling setting --------------------------------------------------------

    def _lane(self, sampling: Sampling, background: bool = True) -> Lane:
        """The lane of ``sampling`` (under ``self.lock``), created and compiled in a thread when new."""
        if sampling in self.lanes:
            lane = self.lanes[sampling]
            if lane.error:
                raise APIError(500, f"compiling sampling {sampling.describe()} failed: {lane.error}",
                               kind="server_error")
            return lane
        if len(self.lanes) >= self.config.max_sampling:
            have = ", ".join(f"temperature={s.temperature:g} top_p={s.top_p:g}" for s in self.lanes)
            raise APIError(400, f"this server runs at most {self.config.max_sampling} sampling settings "
                                f"(--max-sampling) and has them: {have}", "temperature", "unsupported_value")
        lane = Lane(sampling, rows.make_decoder(self.model.cfg, self.config.batch, sampling, self.layout.shape))
        self.lanes[sampling] = lane
        if background:
            threading.Thread(target=self._compile_lane, args=(lane,), name="jf-jax-compile", daemon=True).start()
        return lane

    def _compile_lane(self, lane: Lane) -> None:
        """Compiles a lane's programs (one prefill per prompt bucket and its step) on throwaway states."""
        count_compilations(self.metrics)
        try:
            row = None
            for width in self.layout.prompt_buckets:
                row = self._prefill(lane, [0] * min(width, self.layout.max_context - 1), 1, seed=0)
            batch = rows.empty_batch(row, self.layout)
            rows.read_rows(lane.decoder.step(self.params, batch))
        except Exception as e:  # noqa: BLE001 (reported to the lane's requests)
            log.exception("compiling a lane failed")
            lane.error = f"{type(e).__name__}: {e}"
        lane.ready.set()
        with self.lock:
            self.lock.notify_all()

    def _prefill(self, lane: Lane, prompt, max_new: int, seed: int):
        return rows.prefill_row(lane.decoder, self.params, self.layout, list(prompt), max_new, self.eos, seed)

    # --- the scheduler thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        count_compilations(self.metrics)
        try:
            self._warm_up()
        except Exception as e:  # noqa: BLE001 (the server reports it on /health)
            log.exception("warm-up failed")
            self.failure = f"warm-up failed: {type(e).__name__}: {e}"
            return
        self.metrics.ready()
        self.ready.set()
        while True:
            with self.lock:
                if self.stopping:
                    break
                if not self._has_work():
                    self.lock.wait(IDLE_WAIT_S)
                    continue
            try:
                self._admit()
                self._drop_cancelled()
                if any(h is not None for h in self.slots):
                    self._step()
            except Exception as e:  # noqa: BLE001 (the batch is lost, the server is not)
                log.exception("a decode step failed")
                self._fail_running(APIError(500, f"decoding failed: {type(e).__name__}: {e}", kind="server_error"))
                try:
                    self._reset()
                except Exception as e:  # noqa: BLE001 (nothing can be decoded any more: /health says why)
                    log.exception("the batch state cannot be rebuilt")
                    self.failure = f"the batch state cannot be rebuilt: {type(e).__name__}: {e}"
                    self.ready.clear()
                    break
        self._fail_running(APIError(503, self.failure or "the server is shutting down", kind="server_error",
                                    code="shutdown"))
        self._fail_queued(APIError(503, self.failure or "the server is shutting down", kind="server_error",
                                   code="shutdown"))

    def _warm_up(self) -> None:
        """Compiles every program a request can reach: each lane's prefills and step, the row insertion of every
        prompt bucket, marking a row done."""
        with self.lock:
            lanes = [self._lane(s, background=False) for s in (GREEDY, *self.config.warm_sampling)]
        # lanes compile side by side (XLA compiles a program on one core)
        threads = [threading.Thread(target=self._compile_lane, args=(lane,), daemon=True) for lane in lanes]
        for thread in threads:
            thread.start()
        for thread, lane in zip(threads, lanes):
            thread.join()
            if lane.error:
                raise RuntimeError(lane.error)
        greedy = lanes[0]
        row = self._prefill(greedy, [0], 1, seed=0)
        self.state = rows.empty_batch(row, self.layout)
        for width in self.layout.prompt_buckets:
            row = self._prefill(greedy, [0] * min(width, self.layout.max_context - 1), 1, seed=0)
            self.state = rows.insert_row(self.state, row, 0)
        self.state = rows.finish_row(self.state, 0)
        for lane in lanes:  # each step once more on the real state: its arrays are the ones requests will meet
            self.state = lane.decoder.step(self.params, self.state)
        rows.read_rows(self.state)

    def _has_work(self) -> bool:
        waiting = any(self.lanes[h.request.sampling].ready.is_set() or h.cancelled.is_set() for h in self.queue)
        return waiting and None in self.slots or any(h is not None for h in self.slots)

    def _admit(self) -> None:
        while True:
            with self.lock:
                free = [i for i, h in enumerate(self.slots) if h is None]
                # oldest first among the requests whose lane is compiled (a compiling lane's requests wait)
                handle = next((h for h in self.queue if h.cancelled.is_set()
                               or self.lanes[h.request.sampling].ready.is_set()), None)
                if handle is None or (not free and not handle.cancelled.is_set()):
                    return
                self.queue.remove(handle)
            if handle.cancelled.is_set():
                self.metrics.request("cancelled")
                continue
            self._start(handle, free[0])

    def _start(self, handle: Handle, slot: int) -> None:
        req = handle.request
        lane = self.lanes[req.sampling]
        try:
            if lane.error:
                raise RuntimeError(f"the programs of sampling {req.sampling.describe()} failed to compile")
            row = self._prefill(lane, req.prompt, req.max_tokens, req.seed)
            self.state = rows.insert_row(self.state, row, slot)
        except Exception as e:  # noqa: BLE001 (one request's failure is its own)
            log.exception("admitting a request failed")
            self.metrics.request("error")
            handle.send("error", APIError(500, f"decoding failed: {type(e).__name__}: {e}", kind="server_error"))
            if self.state.cache.k.is_deleted():  # a failed insertion consumed the donated batch state
                raise RuntimeError("the batch state was lost while admitting a request") from e
            return
        handle.slot, handle.seen = slot, 0
        with self.lock:
            self.slots[slot] = handle
        with self.metrics.lock:
            self.metrics.prompt_tokens += len(req.prompt)
            self.metrics.row_forwards += 1  # the prefill is a forward (it chooses AR's first token), as in the library

    def _drop_cancelled(self) -> None:
        for slot, handle in enumerate(self.slots):
            if handle is not None and handle.cancelled.is_set():
                self.state = rows.finish_row(self.state, slot)
                self._free(slot)
                self.metrics.request("cancelled")

    def _free(self, slot: int) -> None:
        with self.lock:
            self.slots[slot] = None

    def _step(self) -> None:
        running = np.array([h is not None for h in self.slots])
        lane_of = [h.request.sampling if h is not None else None for h in self.slots]
        active = list(dict.fromkeys(s for s in lane_of if s is not None))
        before = np.asarray(self.state.done)
        if len(active) == 1:  # the common case: every running row in one lane, the others done already
            self.state = self.lanes[active[0]].decoder.step(self.params, self.state)
        else:  # each lane steps its own rows; the others are marked done for that call (state kept, no commit)
            done = before.copy()
            for sampling in active:
                # a row done at its prefill (EOS first, max_tokens 1) stays done: un-marking it would decode on
                mine = running & ~before & np.array([s == sampling for s in lane_of])
                if mine.any():
                    self.state = rows.with_done(self.state, ~mine)
                    self.state = self.lanes[sampling].decoder.step(self.params, self.state)
                    done[mine] = np.asarray(self.state.done)[mine]
            self.state = rows.with_done(self.state, done)
        out, count, done, stop, forwards = rows.read_rows(self.state)
        with self.metrics.lock:
            self.metrics.steps += 1
            self.metrics.row_forwards += int((running & ~before).sum())
        for slot in np.flatnonzero(running):
            self._deliver(int(slot), out[slot], int(count[slot]), bool(done[slot]), int(stop[slot]),
                          int(forwards[slot]))

    def _deliver(self, slot: int, out, count: int, done: bool, stop: int, forwards: int) -> None:
        handle = self.slots[slot]
        new = out[handle.seen:count].tolist()
        handle.seen = count
        now = time.perf_counter()
        with self.metrics.lock:
            self.metrics.generated_tokens += len(new)
            if new and handle.last_tokens is None:
                self.metrics.ttft.observe(now - handle.arrival)
            elif new:
                self.metrics.itl.observe((now - handle.last_tokens) / len(new), len(new))
        if new:
            handle.last_tokens = now
        before = len(handle.text.tokens)
        text = handle.text.push(new)
        ids = handle.text.tokens[before:]
        if handle.text.stopped or done:
            if not done:
                self.state = rows.finish_row(self.state, slot)
            reason = "length" if stop == StopReason.MAX_NEW_TOKENS and not handle.text.stopped else "stop"
            req = handle.request
            outcome = Outcome(reason, len(req.prompt), tuple(handle.text.tokens), forwards,
                              self.config.batch.method, self.config.batch.block)
            handle.send("done", text + handle.text.finish(), ids, outcome)
            self._free(slot)
            self.metrics.request("ok")
        elif text or ids:
            handle.send("text", text, ids)

    def _fail_running(self, error: APIError) -> None:
        with self.lock:
            handles = [h for h in self.slots if h is not None]
            self.slots = [None] * self.layout.rows
        for handle in handles:
            self.metrics.request("error")
            handle.send("error", error)

    def _fail_queued(self, error: APIError) -> None:
        with self.lock:
            handles = list(self.queue)
            self.queue.clear()
        for handle in handles:
            self.metrics.request("error")
            handle.send("error", error)

    def _reset(self) -> None:
        """A fresh batch state after a failure that may have consumed the old one (its buffers are donated)."""
        row = self._prefill(self.lanes[GREEDY], [0], 1, seed=0)
        self.state = rows.empty_batch(row, self.layout)

"""The continuous-batching engine: one scheduler thread stepping a batch of B slots per served (method, block size).

Each (method, block size) pair the server serves is a *group* (``serving.group``): B slots in one loop state of its
decoder. The scheduler loop, between two steps:

1. admits waiting requests into free slots of their group, oldest first: each is prefilled alone as a one-row state
   and written into its slot (``serving.batch``); the rows already running are not touched;
2. frees the slots of requests whose client went away (the row is marked done: it costs nothing more);
3. runs one ``step`` of every group with running rows, in turn: one forward for each of its rows, each row
   accepting one or more tokens (a Jacobi iteration may accept several);
4. reads each row's new tokens and hands them to its request (text, stop strings: ``serving.text``), and frees the
   rows that ended on EOS, ``max_tokens`` or a stop string.

Sampling settings (temperature, top_p) are static in the decoders' programs, so a group keeps one decoder per
setting, a *lane*; rows of different lanes share the group's batch state and, when several lanes run at once, each
lane's step runs with the other lanes' rows marked done (a done row keeps its state and commits nothing). Greedy and
the settings named at start are compiled for every group during warm-up; a new setting compiles for the group that
needs it in a background thread (its requests wait in the queue meanwhile, the batches keep running), up to
``max_sampling`` distinct settings.

Shutdown (``drain``): nothing more is admitted (``submit`` answers 503), what was submitted runs to its end, and
what is still running or queued when the drain time is over gets a 503 error event; then the thread ends.

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
from jf_jax.decoding.placement import place_params
from jf_jax.decoding.sampling import GREEDY, Sampling
from jf_jax.model.decode_view import as_decode_view
from jf_jax.serving import batch as rows
from jf_jax.serving.group import Group, Lane, ShutDown
from jf_jax.serving.metrics import Metrics, count_compilations, method_labels
from jf_jax.serving.protocol import APIError, GenerationRequest
from jf_jax.serving.responses import Outcome
from jf_jax.serving.text import TextStream

log = logging.getLogger("jf_jax.serve")
IDLE_WAIT_S = 0.05


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    batch: rows.BatchConfig = rows.BatchConfig()
    """The shared options of every group; its method and block size are the default pair."""
    methods: tuple[rows.ServedMethod, ...] = ()
    """The pairs served beside the default one (a group of ``batch.max_batch`` slots each)."""
    max_queue: int = 64
    """Requests waiting for a slot; one more gets 429."""
    max_sampling: int = 4
    """Distinct (temperature, top_p) settings the engine compiles, greedy included."""
    warm_sampling: tuple[Sampling, ...] = ()
    """Settings compiled at warm-up beside greedy."""

    @property
    def served(self) -> tuple[rows.ServedMethod, ...]:
        """Every pair served, the default first."""
        return tuple(dict.fromkeys((self.batch.served_method, *self.methods)))


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
        self.seen = 0  # the row's tokens already read out

    def send(self, *event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody listens any more
            self.cancelled.set()


class Engine:
    """The scheduler of one server: a group per served pair, the queue, the lock the HTTP side shares."""

    def __init__(self, model, config: EngineConfig, mesh=None):
        """``mesh``: the devices to decode on (``model.sharding``'s axes; ``serving.group``), or None for one."""
        self.model, self.config, self.mesh = model, config, mesh
        self.params = place_params(mesh, as_decode_view(model.params), model.cfg)
        self.eos = eos_array(model.tokenizer.eos_ids)
        self.groups = {m: Group(model.cfg, self.params, self.eos, config.batch.for_method(m), mesh)
                       for m in config.served}
        first = next(iter(self.groups.values())).layout
        self.max_context, self.slots_per_group = first.max_context, first.rows  # the same in every group
        self.metrics = Metrics([method_labels(m.method, m.block_size) for m in self.groups])
        self.queue: collections.deque[Handle] = collections.deque()
        self.lock = threading.Condition()
        self.ready = threading.Event()
        self.closing = threading.Event()  # the engine will decode nothing more: compilations under way stop
        self.failure: str | None = None
        self.stopping = False
        self.drain_deadline: float | None = None
        self.thread = threading.Thread(target=self._run, name="jf-jax-scheduler", daemon=True)

    # --- called from the HTTP side ------------------------------------------------------------------

    def start(self) -> "Engine":
        self.thread.start()
        return self

    def stop(self, timeout: float = 30) -> bool:
        """Ends the scheduler thread now (what runs or waits gets a 503 error event); whether it ended in time."""
        with self.lock:
            self.stopping = True
            self.closing.set()
            self.lock.notify_all()
        self.thread.join(timeout=timeout)
        return not self.thread.is_alive()

    def drain(self, seconds: float) -> None:
        """Shutdown: admits nothing more (``submit`` answers 503) and lets what was submitted finish; what still runs
        or waits ``seconds`` from now gets a 503 error event. The scheduler thread ends when nothing is left. Another
        call can only bring the deadline closer (a second signal: ``drain(0)`` cancels at once)."""
        with self.lock:
            deadline = time.monotonic() + seconds
            self.drain_deadline = deadline if self.drain_deadline is None else min(self.drain_deadline, deadline)
            running, queued = self._running_count(), len(self.queue)
            self.lock.notify_all()
        if not self.ready.is_set():  # nothing can have been admitted: warm-up stops at its next program
            self.closing.set()
        log.warning("shutting down: %d running and %d queued requests have %g s to finish", running, queued, seconds)

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> Handle:
        """Queues ``request``; 503 before warm-up ends or once shutting down, 429 when the queue is full, 400 for one
        sampling setting too many."""
        if self.drain_deadline is not None or self.stopping:
            raise APIError(503, "the server is shutting down", kind="server_error", code="shutdown")
        if not self.ready.is_set():
            raise APIError(503, self.failure or "the server is still warming up", kind="server_error",
                           code="not_ready", headers={"Retry-After": "5"})
        handle = Handle(request, loop, self.model.tokenizer.decode)
        with self.lock:
            if len(self.queue) >= self.config.max_queue:
                raise APIError(429, f"the queue is full ({self.config.max_queue} requests wait for a slot); retry "
                                    "later", kind="rate_limit_error", code="queue_full", headers={"Retry-After": "1"})
            self._lane(request.method, request.sampling)
            self.queue.append(handle)
            self.lock.notify_all()
        return handle

    def cancel(self, handle: Handle) -> None:
        """The client went away: the row (or queue entry) is dropped at the next iteration."""
        handle.cancelled.set()
        with self.lock:
            self.lock.notify_all()

    def gauges(self) -> dict[str, tuple[str, float | dict[str, float]]]:
        with self.lock:
            running = self._running_count()
            slots = self.slots_per_group * len(self.groups)
            by_method = {method_labels(m.method, m.block_size): float(sum(h is not None for h in g.slots))
                         for m, g in self.groups.items()}
            return {"queue_depth": ("requests waiting for a slot", len(self.queue)),
                    "running_requests": ("requests holding a slot", running),
                    "batch_slots": ("rows of every served method's batch (--max-batch each)", slots),
                    "batch_occupancy": ("fraction of the batches' rows holding a request", running / slots),
                    "sampling_lanes": ("sampling settings compiled or compiling", len(self._samplings())),
                    "served_methods": ("(method, block size) pairs served, a batch each", len(self.groups)),
                    "devices": ("devices the batches decode on (--mesh)", 1 if self.mesh is None else self.mesh.size),
                    "method_running_requests": ("requests holding a slot, by served method", by_method),
                    "ready": ("1 once warm-up is done", float(self.ready.is_set()))}

    # --- lanes: one decoder per group and sampling setting ------------------------------------------------

    def _samplings(self) -> set:
        return {s for g in self.groups.values() for s in g.lanes}

    def _lane(self, method: rows.ServedMethod, sampling: Sampling, background: bool = True) -> Lane:
        """The lane of ``sampling`` in ``method``'s group (under ``self.lock``), created and compiled in a thread
        when new."""
        group = self.groups[method]
        if sampling in group.lanes:
            lane = group.lanes[sampling]
            if lane.error:
                raise APIError(500, f"compiling sampling {sampling.describe()} for {method.describe()} failed: "
                                    f"{lane.error}", kind="server_error")
            return lane
        samplings = self._samplings()
        if sampling not in samplings and len(samplings) >= self.config.max_sampling:
            have = ", ".join(f"temperature={s.temperature:g} top_p={s.top_p:g}" for s in samplings)
            raise APIError(400, f"this server runs at most {self.config.max_sampling} sampling settings "
                                f"(--max-sampling) and has them: {have}", "temperature", "unsupported_value")
        lane = group.new_lane(sampling)
        if background:
            threading.Thread(target=self._compile_lane, args=(lane,), name="jf-jax-compile", daemon=True).start()
        return lane

    def _compile_lane(self, lane: Lane) -> None:
        count_compilations(self.metrics)
        try:
            self.groups[lane.method].compile_lane(lane, self.closing)
        except ShutDown:
            lane.error = "the server is shutting down"
        except Exception as e:  # noqa: BLE001 (reported to the lane's requests)
            log.exception("compiling a lane failed")
            lane.error = f"{type(e).__name__}: {e}"
        lane.ready.set()
        with self.lock:
            self.lock.notify_all()

    def _prefill(self, lane: Lane, prompt, max_new: int, seed: int):
        return self.groups[lane.method].prefill(lane, prompt, max_new, seed)

    # --- the scheduler thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        count_compilations(self.metrics)
        try:
            self._warm_up()
        except Exception as e:  # noqa: BLE001 (the server reports it on /health)
            if self.closing.is_set():  # stopped or drained during warm-up: not a failure
                return
            log.exception("warm-up failed")
            self.failure = f"warm-up failed: {type(e).__name__}: {e}"
            return
        self.metrics.ready()
        self.ready.set()
        while True:
            with self.lock:
                if self._should_end():
                    break
                if not self._has_work():
                    self.lock.wait(IDLE_WAIT_S)
                    continue
            try:
                self._admit()
                self._drop_cancelled()
                self._step()
            except Exception as e:  # noqa: BLE001 (the batches are lost, the server is not)
                log.exception("a decode step failed")
                self._fail(APIError(500, f"decoding failed: {type(e).__name__}: {e}", kind="server_error"))
                try:
                    for group in self.groups.values():
                        group.reset()
                except Exception as e:  # noqa: BLE001 (nothing can be decoded any more: /health says why)
                    log.exception("the batch state cannot be rebuilt")
                    self.failure = f"the batch state cannot be rebuilt: {type(e).__name__}: {e}"
                    self.ready.clear()
                    break
        self.closing.set()
        reason = self.failure or ("the server shut down before this request finished" if self.drain_deadline
                                  is not None else "the server is shutting down")
        self._fail(APIError(503, reason, kind="server_error", code="shutdown"), "cancelled", queued=True)

    def _should_end(self) -> bool:
        """(Under ``self.lock``.) Stopped, or draining with nothing left or no time left."""
        if self.stopping:
            return True
        if self.drain_deadline is None:
            return False
        return time.monotonic() >= self.drain_deadline or not self.queue and not self._running_count()

    def _warm_up(self) -> None:
        """Compiles every program a request can reach: in every group, each lane's prefills and step, the row
        insertion of every prompt bucket, marking a row done."""
        with self.lock:
            lanes = [self._lane(m, s, background=False) for m in self.groups
                     for s in (GREEDY, *self.config.warm_sampling)]
        # lanes compile side by side (XLA compiles a program on one core)
        threads = [threading.Thread(target=self._compile_lane, args=(lane,), daemon=True) for lane in lanes]
        for thread in threads:
            thread.start()
        for thread, lane in zip(threads, lanes):
            thread.join()
            if lane.error:
                raise RuntimeError(lane.error)
        for group in self.groups.values():
            if self.closing.is_set():
                raise ShutDown
            group.warm_up([lane for lane in lanes if lane.method == group.method])

    def _running_count(self) -> int:
        return sum(h is not None for g in self.groups.values() for h in g.slots)

    def _admissible(self, handle: Handle) -> bool:
        """(Under ``self.lock``.) Whether ``handle`` can start now: its lane is compiled, its group has a free slot."""
        group = self.groups[handle.request.method]
        return group.lanes[handle.request.sampling].ready.is_set() and None in group.slots

    def _has_work(self) -> bool:
        return (any(h.cancelled.is_set() or self._admissible(h) for h in self.queue)
                or self._running_count() > 0)

    def _admit(self) -> None:
        while True:
            with self.lock:
                # oldest first among the requests that can start (a compiling lane's or a full group's wait)
                handle = next((h for h in self.queue if h.cancelled.is_set() or self._admissible(h)), None)
                if handle is None:
                    return
                self.queue.remove(handle)
            if handle.cancelled.is_set():
                self.metrics.request("cancelled")
                continue
            group = self.groups[handle.request.method]
            self._start(handle, group, group.slots.index(None))

    def _start(self, handle: Handle, group: Group, slot: int) -> None:
        req = handle.request
        lane = group.lanes[req.sampling]
        try:
            if lane.error:
                raise RuntimeError(f"the programs of sampling {req.sampling.describe()} failed to compile")
            group.insert(self._prefill(lane, req.prompt, req.max_tokens, req.seed), slot)
        except Exception as e:  # noqa: BLE001 (one request's failure is its own)
            log.exception("admitting a request failed")
            self.metrics.request("error")
            handle.send("error", APIError(500, f"decoding failed: {type(e).__name__}: {e}", kind="server_error"))
            if group.state.cache.k.is_deleted():  # a failed insertion consumed the donated batch state
                raise RuntimeError("the batch state was lost while admitting a request") from e
            return
        handle.seen = 0
        with self.lock:
            group.slots[slot] = handle
        with self.metrics.lock:
            self.metrics.prompt_tokens += len(req.prompt)
            self.metrics.count_forwards(group.label, 1)  # the prefill is a forward (it chooses AR's first token)

    def _drop_cancelled(self) -> None:
        for group in self.groups.values():
            for slot, handle in enumerate(group.slots):
                if handle is not None and handle.cancelled.is_set():
                    group.finish(slot)
                    self._free(group, slot)
                    self.metrics.request("cancelled")

    def _free(self, group: Group, slot: int) -> None:
        with self.lock:
            group.slots[slot] = None

    def _step(self) -> None:
        """One step of every group with running rows, one group after the other."""
        for group in self.groups.values():
            if not group.running().any():
                continue
            running, stepped, (out, count, done, stop, forwards) = group.step()
            with self.metrics.lock:
                self.metrics.steps += 1
                self.metrics.count_forwards(group.label, stepped)
            for slot in np.flatnonzero(running):
                self._deliver(group, int(slot), out[slot], int(count[slot]), bool(done[slot]), int(stop[slot]),
                              int(forwards[slot]))

    def _deliver(self, group: Group, slot: int, out, count: int, done: bool, stop: int, forwards: int) -> None:
        handle = group.slots[slot]
        new = out[handle.seen:count].tolist()
        handle.seen = count
        now = time.perf_counter()
        with self.metrics.lock:
            self.metrics.count_tokens(group.label, len(new))
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
                group.finish(slot)
            reason = "length" if stop == StopReason.MAX_NEW_TOKENS and not handle.text.stopped else "stop"
            outcome = Outcome(reason, len(handle.request.prompt), tuple(handle.text.tokens), forwards,
                              group.method.method, group.method.block_size)
            handle.send("done", text + handle.text.finish(), ids, outcome)
            self._free(group, slot)
            self.metrics.request("ok")
        elif text or ids:
            handle.send("text", text, ids)

    def _fail(self, error: APIError, outcome: str = "error", queued: bool = False) -> None:
        """Ends every running request (and with ``queued`` every waiting one) with ``error``."""
        with self.lock:
            handles = [h for g in self.groups.values() for h in g.slots if h is not None]
            for group in self.groups.values():
                group.slots = [None] * len(group.slots)
            if queued:
                handles += self.queue
                self.queue.clear()
        for handle in handles:
            self.metrics.request(outcome)
            handle.send("error", error)

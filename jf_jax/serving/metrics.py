"""The server's counters and histograms, written in the Prometheus text format (``GET /metrics``).

Counters are bumped by the scheduler thread and the HTTP handlers under one lock; gauges (queue depth, batch
occupancy) are read from the engine when the page is rendered. Compilations are counted with ``jax.monitoring``'s
backend-compile event, which XLA records for every program it compiles (or loads from the persistent cache), in the
engine's own threads: after warm-up the count must not move, which is what fixed shapes buy (``serving.batch``).
"""

from __future__ import annotations

import bisect
import threading

import jax

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
PREFIX = "jf_jax_serve_"

_counting = threading.local()
_listening = [False]
_listening_lock = threading.Lock()


def _on_event(event: str, duration: float, **_):
    counter = getattr(_counting, "metrics", None)
    if event == COMPILE_EVENT and counter is not None:
        with counter.lock:
            counter.compilations += 1


def count_compilations(metrics: "Metrics") -> None:
    """Counts the programs the *calling thread* compiles from now on into ``metrics``: XLA compiles in the thread
    that first calls a program, so the engine's threads are counted and nothing else of the process is (a test's
    own ``api.generate`` calls, another engine)."""
    with _listening_lock:
        if not _listening[0]:
            jax.monitoring.register_event_duration_secs_listener(_on_event)
            _listening[0] = True
    _counting.metrics = metrics


class Histogram:
    """A cumulative Prometheus histogram (not thread-safe on its own: ``Metrics`` holds the lock)."""

    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += times
        self.sum += value * times

    def lines(self, name: str) -> list[str]:
        out, total = [], 0
        for edge, count in zip((*self.buckets, float("inf")), self.counts):
            total += count
            out.append(f'{name}_bucket{{le="{"+Inf" if edge == float("inf") else edge}"}} {total}')
        return out + [f"{name}_sum {self.sum:.6f}", f"{name}_count {total}"]


class Metrics:
    """Everything /metrics reports that is counted rather than read."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests: dict[str, int] = {}
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.row_forwards = 0
        self.steps = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.compilations = 0
        self.compiles_at_ready: int | None = None

    def request(self, outcome: str) -> None:
        """One request ended: "ok", "cancelled", "error" (server side), "rejected" (refused before decoding)."""
        with self.lock:
            self.requests[outcome] = self.requests.get(outcome, 0) + 1

    def ready(self) -> None:
        with self.lock:
            self.compiles_at_ready = self.compilations

    def compiled(self) -> tuple[int, int]:
        """(programs the engine's threads compiled, of which after warm-up)."""
        with self.lock:
            after = 0 if self.compiles_at_ready is None else self.compilations - self.compiles_at_ready
            return self.compilations, after

    def render(self, gauges: dict[str, tuple[str, float]]) -> str:
        """The exposition text; ``gauges`` name -> (help, value) are read by the caller."""
        total, after = self.compiled()
        with self.lock:
            counters = {
                "prompt_tokens_total": ("prompt tokens of admitted requests", self.prompt_tokens),
                "generation_tokens_total": ("tokens generated (accepted) over all requests", self.generated_tokens),
                "row_forwards_total": ("forwards of requests: each prefill, and each step once per running row",
                                       self.row_forwards),
                "steps_total": ("decode steps of the batch (one program call each)", self.steps),
                "compilations_total": ("XLA programs compiled since the engine started", total),
                "compilations_after_warmup_total": ("programs compiled after warm-up (0 with fixed shapes)", after),
            }
            tpf = self.generated_tokens / self.row_forwards if self.row_forwards else 0.0
            lines = [f"# HELP {PREFIX}requests_total requests by outcome", f"# TYPE {PREFIX}requests_total counter"]
            lines += [f'{PREFIX}requests_total{{outcome="{k}"}} {v}' for k, v in sorted(self.requests.items())]
            for name, (text, value) in counters.items():
                lines += [f"# HELP {PREFIX}{name} {text}", f"# TYPE {PREFIX}{name} counter", f"{PREFIX}{name} {value}"]
            gauges = {**gauges, "tokens_per_forward": ("generated tokens per row forward (Jacobi's speedup)", tpf)}
            for name, (text, value) in gauges.items():
                lines += [f"# HELP {PREFIX}{name} {text}", f"# TYPE {PREFIX}{name} gauge", f"{PREFIX}{name} {value:g}"]
            for name, text, hist in (("time_to_first_token_seconds", "arrival to first token", self.ttft),
                                     ("inter_token_latency_seconds", "gap between tokens (a burst of k tokens "
                                      "counts k gaps of 1/k of its wait)", self.itl)):
                lines += [f"# HELP {PREFIX}{name} {text}", f"# TYPE {PREFIX}{name} histogram"]
                lines += hist.lines(PREFIX + name)
        return "\n".join(lines) + "\n"

"""A bounded load test of ``jf-jax serve`` on loopback: throughput, time to first token and inter-token latency of
streamed requests at a few concurrency levels, for each decoding method, one server per method.

For each method a server is started (``python -m jf_jax.serve --method M ...`` on 127.0.0.1, a free port), warmed
up, then for each concurrency c, ``max(c, --min-requests)`` greedy chat requests (prompts cycled from ``PROMPTS``)
are sent by c client threads, each streaming its answer with ``return_token_ids``. Measured on the client:

* throughput: generated tokens / wall clock of the level;
* TTFT: request sent -> first chunk holding tokens (p50, p99);
* inter-token latency: each chunk's gap since the previous one, divided among its tokens (a Jacobi step may
  deliver several), one value per token (p50, p99);

and on the server (``/metrics`` before and after): tokens per row forward. The token ids of each prompt are compared
across methods (every method must give AR's tokens). Stdlib only on the client side.

    python experiments/bench_serve.py --json results/studies/serving/bench_serve.json \
        --markdown results/studies/serving/bench_serve.md
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import pathlib
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time

PROMPTS = [  # not in any training or tuning set of the repository
    "Write a Python function that merges two sorted lists into one sorted list.",
    "A farmer has 17 sheep and buys 3 times as many goats. How many animals does he have?",
    "Give three tips for writing clear commit messages.",
    "Write a Python class for a stack with push, pop and peek.",
]


class Server:
    """A ``python -m jf_jax.serve`` subprocess on 127.0.0.1 and a free port."""

    def __init__(self, args: list[str]):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "jf_jax.serve", *args, "--port", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT, text=True)

    def get(self, path: str) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request("GET", path)
        resp = conn.getresponse()
        out = resp.status, resp.read().decode()
        conn.close()
        return out

    def wait_ready(self, timeout: float = 900) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"the server exited:\n{self.log.read()[-3000:]}")
            with contextlib.suppress(OSError):
                if self.get("/health")[0] == 200:
                    return
            time.sleep(0.5)
        raise TimeoutError("the server did not become ready")

    def metric(self, name: str) -> float:
        for line in self.get("/metrics")[1].splitlines():
            if line.startswith(f"jf_jax_serve_{name} "):
                return float(line.split()[-1])
        raise KeyError(name)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def percentile(values, q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def one_request(client, prompt: str, max_tokens: int) -> dict:
    """Streams one greedy chat request; returns its timings and token ids."""
    conn = http.client.HTTPConnection("127.0.0.1", client.port, timeout=600)
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "stream": True,
            "return_token_ids": True, "temperature": 0}
    sent = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    ids, first, gaps, last = [], None, [], None
    for line in resp:
        line = line.decode().strip()
        if not line.startswith("data: {"):
            continue
        chunk = json.loads(line[len("data: "):])
        new = chunk["choices"][0].get("token_ids", []) if chunk["choices"] else []
        if not new:
            continue
        now = time.perf_counter()
        if first is None:
            first = now - sent
        else:
            gaps += [(now - last) / len(new)] * len(new)
        last = now
        ids += new
    conn.close()
    return {"prompt": prompt, "ttft": first, "gaps": gaps, "token_ids": ids}


def level(client, concurrency: int, requests: int, max_tokens: int) -> dict:
    before = {k: client.metric(k) for k in ("generation_tokens_total", "row_forwards_total")}
    todo = list(range(requests))
    lock = threading.Lock()
    results = []

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            try:
                r = one_request(client, PROMPTS[i % len(PROMPTS)], max_tokens)
            except Exception as e:  # noqa: BLE001 (reported below: a level with a failed request has no numbers)
                r = {"error": f"{type(e).__name__}: {e}"}
            with lock:
                results.append(r)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError(f"{len(errors)} of {requests} requests failed, e.g. {errors[0]}")
    after = {k: client.metric(k) for k in before}
    tokens = sum(len(r["token_ids"]) for r in results)
    gaps = [g for r in results for g in r["gaps"]]
    ttft = [r["ttft"] for r in results if r["ttft"] is not None]
    forwards = after["row_forwards_total"] - before["row_forwards_total"]
    return {"concurrency": concurrency, "requests": requests, "tokens": tokens, "seconds": round(wall, 3),
            "tokens_per_s": round(tokens / wall, 2),
            "ttft_p50": percentile(ttft, 50), "ttft_p99": percentile(ttft, 99),
            "itl_p50": percentile(gaps, 50), "itl_p99": percentile(gaps, 99),
            "tpf": round((after["generation_tokens_total"] - before["generation_tokens_total"]) / forwards, 3)
            if forwards else None,
            "answers": {r["prompt"]: r["token_ids"] for r in results}}


def ms(x):
    return "-" if x is None else f"{1000 * x:.0f}"


def markdown(report: dict) -> str:
    lines = [f"Machine: {report['machine']}; command: `{report['command']}`", "",
             "| method | concurrency | requests | tokens | tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms "
             "| TPF |", "|---|---|---|---|---|---|---|---|---|---|"]
    for method, levels in report["methods"].items():
        for r in levels:
            lines.append(f"| {method} | {r['concurrency']} | {r['requests']} | {r['tokens']} | {r['tokens_per_s']} | "
                         f"{ms(r['ttft_p50'])} | {ms(r['ttft_p99'])} | {ms(r['itl_p50'])} | {ms(r['itl_p99'])} | "
                         f"{r['tpf']} |")
    lines += ["", f"Same token ids for every prompt across methods and levels: {report['equal_tokens']}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--methods", default="ar,jacobi,mr")
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--max-batch", type=int, default=4)
    p.add_argument("--max-context", type=int, default=256)
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--min-requests", type=int, default=4, help="requests per level at least (each level sends "
                   "max(concurrency, this))")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--json", type=pathlib.Path)
    p.add_argument("--markdown", type=pathlib.Path)
    args = p.parse_args(argv)
    report = {"machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
              "command": "python experiments/bench_serve.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "settings": {k: v for k, v in vars(args).items() if k not in ("json", "markdown")}, "methods": {}}
    levels = [int(c) for c in args.concurrency.split(",")]
    for method in args.methods.split(","):
        server_args = ["--model", args.model, "--dtype", args.dtype, "--method", method, "--block-size",
                       str(args.block_size), "--max-batch", str(args.max_batch), "--max-context",
                       str(args.max_context), "--min-prompt-bucket", "64", "--max-queue", "64",
                       "--log-level", "warning"]
        started = time.perf_counter()
        server = Server(server_args)
        try:
            server.wait_ready()
            print(f"{method}: ready after {time.perf_counter() - started:.0f} s", flush=True)
            one_request(server, PROMPTS[0], 4)  # first-request effects (allocations) stay out of the levels
            report["methods"][method] = []
            for c in levels:
                r = level(server, c, max(c, args.min_requests), args.max_tokens)
                report["methods"][method].append(r)
                print(f"  c={c}: {r['tokens_per_s']} tok/s, TTFT p50 {ms(r['ttft_p50'])} ms, ITL p50 "
                      f"{ms(r['itl_p50'])} ms, TPF {r['tpf']}", flush=True)
        finally:
            server.stop()
    answers = [r["answers"] for levels_ in report["methods"].values() for r in levels_]
    report["equal_tokens"] = all(a.get(prompt, b[prompt]) == b[prompt] for a in answers for b in answers
                                 for prompt in b)
    for levels_ in report["methods"].values():
        for r in levels_:
            r["answers"] = {prompt: len(ids) for prompt, ids in r["answers"].items()}  # lengths suffice in the file
    text = markdown(report)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)
    return 0 if report["equal_tokens"] else 1


if __name__ == "__main__":
    sys.exit(main())

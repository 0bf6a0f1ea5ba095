"""A bounded load test of ``jf-jax serve`` on loopback, side by side with llama.cpp's servers, and a lossless check.

**Side by side** (default): every server is started on 127.0.0.1 (a free port each) and warmed up; then at each
concurrency c, each server in turn (rotated each round) gets the same ``max(c, --min-requests)`` greedy streamed
completions from c client threads: jf-jax (``--methods``, a server per method) and llama.cpp's servers
(``--llama-cpp-python``, ``--llama-server``) on the GGUF types of ``--llama-cpp-types``. The prompts are code tasks
(``jf_jax.data.code_prompts``: the standard library's docstrings) rendered by jf-jax's chat template and sent as
text to ``/v1/completions`` (llama-cpp-python takes no token ids; both servers tokenize the text, special tokens
included, to the same ids). Client-side: tokens / wall clock, time to first token (TTFT) and inter-token latency
(ITL: each chunk's gap since the previous one, divided among its tokens), p50 and p99.

**Check** (``--check``): per jf-jax method, ``--check-requests`` chat requests (greedy and seeded sampling, streamed
or not, max_tokens varied) from ``--check-concurrency`` clients that start and send after seeded random waits
(staggered arrivals); each answer's ``return_token_ids`` must equal ``jf_jax.api.generate`` of its prompt alone
with AR (same dtype, sampling, seed), and the server's ``compilations_after_warmup_total`` must stay 0. Exit 1
otherwise. Requests and tokens are bounded, each request has a timeout, servers are killed however the run ends.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import http.client
import json
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time

CHECK_SAMPLING = (0.8, 0.9)  # (temperature, top_p) of the check's sampled requests, compiled at warm-up
# llama_model_quantize's file types: the embedded Q4_1 file's weights dequantized (what jf-jax computes with)
GGUF_FTYPES = {"f32": 0, "bf16": 32}


def code_prompts(tokenizer, count: int, max_tokens: int, seed: int = 0) -> list[str]:
    """``count`` code tasks (user messages) whose chat-rendered prompt fits in ``max_tokens`` tokens, seeded order."""
    from jf_jax.data.code_prompts import stdlib_tasks

    tasks = stdlib_tasks(max_doc_chars=240)
    random.Random(seed).shuffle(tasks)
    fit = [t.prompt for t in tasks
           if len(tokenizer.encode(tokenizer.apply_chat_template(t.prompt, add_generation_prompt=True))) <= max_tokens]
    if len(fit) < count:
        raise ValueError(f"only {len(fit)} code prompts fit in {max_tokens} tokens")
    return fit[:count]


class Server:
    """A server subprocess on 127.0.0.1 and a free port; ``kind`` is "jf-jax", "llama-cpp-python" or "llama-server"."""

    def __init__(self, name: str, kind: str, argv: list[str], env: dict | None = None):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.name, self.kind = name, kind
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen([*argv, "--port", str(self.port)], stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})}, text=True)

    def get(self, path: str) -> tuple[int, str]:
        with contextlib.closing(http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)) as conn:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read().decode()

    def wait_ready(self, timeout: float = 900) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"{self.name} exited:\n{self.log.read()[-3000:]}")
            with contextlib.suppress(OSError):
                if self.get("/health" if self.kind != "llama-cpp-python" else "/v1/models")[0] == 200:
                    return
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} did not become ready")

    def metric(self, name: str) -> float:
        found = [line for line in self.get("/metrics")[1].splitlines() if line.startswith(f"jf_jax_serve_{name} ")]
        return float(found[0].split()[-1])

    def forwards(self) -> tuple[float, float] | None:
        """(generated tokens, row forwards) so far by jf-jax's counters: their ratio is Jacobi's gain in forwards."""
        names = ("generation_tokens_total", "row_forwards_total")
        return tuple(map(self.metric, names)) if self.kind == "jf-jax" else None

    def body(self, prompt: str, max_tokens: int, stream: bool = True) -> dict:
        # llama-cpp-python's default repeat penalty (1.1) would change greedy answers; 1 is llama-server's default
        body = {"prompt": prompt, "max_tokens": max_tokens, "stream": stream, "temperature": 0}
        return {**body, "return_token_ids": True} if self.kind == "jf-jax" else {**body, "repeat_penalty": 1.0}

    def stop(self) -> None:
        self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        self.proc.kill()  # a no-op once it has exited
        self.proc.wait()
        self.log.close()


def post(server: Server, path: str, body: dict) -> dict:
    """One request; streamed or not, returns its timings, token ids (jf-jax) or token count, and text."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)  # s, between two reads
    sent = time.perf_counter()
    with contextlib.closing(conn):
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"{server.name}: HTTP {resp.status}: {resp.read()[:300]!r}")
        if not body.get("stream"):
            answer = json.loads(resp.read())
            choice = answer["choices"][0]
            return {"token_ids": choice.get("token_ids"), "tokens": answer["usage"]["completion_tokens"],
                    "text": choice.get("text", (choice.get("message") or {}).get("content")), "ttft": None, "gaps": []}
        out, last = {"token_ids": [], "tokens": 0, "text": "", "ttft": None, "gaps": []}, None
        for line in resp:
            choices = json.loads(line[len(b"data: "):])["choices"] if line.startswith(b"data: {") else None
            if not choices:
                continue
            piece = choices[0].get("text", choices[0].get("delta", {}).get("content")) or ""
            new = choices[0].get("token_ids")
            # llama.cpp's servers send one token per chunk (a character split over tokens waits for its end)
            count = len(new) if new is not None else int(bool(piece))
            out["text"] += piece
            if count:
                now = time.perf_counter()
                if out["ttft"] is None:
                    out["ttft"] = now - sent
                else:
                    out["gaps"] += [(now - last) / count] * count
                last, out["tokens"], out["token_ids"] = now, out["tokens"] + count, out["token_ids"] + (new or [])
        return out


def percentile(values, q: float) -> float | None:
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))] if values else None


def run_clients(concurrency: int, jobs: list, send, gap_s: float = 0.0, seed: int = 0) -> tuple[list, float]:
    """``send(job)`` for every job from ``concurrency`` threads, in order; with ``gap_s``, client k starts after
    k * gap_s and every request waits a seeded uniform [0, 2 gap_s) first (staggered arrivals)."""
    rng = random.Random(seed)
    waits = [gap_s * i * (i < concurrency) + rng.uniform(0, 2 * gap_s) for i in range(len(jobs))]

    def one(i: int) -> dict:
        time.sleep(waits[i])
        try:
            return send(jobs[i])
        except Exception as e:  # noqa: BLE001 (a failed request fails the run, below)
            return {"error": f"{type(e).__name__}: {e}"}

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, range(len(jobs))))  # bounded: each request has a socket timeout
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError(f"{len(errors)} of {len(jobs)} requests failed, e.g. {errors[0]}")
    return results, time.perf_counter() - start


def summary(c: int, runs: list[dict]) -> dict:
    """The rounds of one (server, concurrency) pooled: tokens over summed wall clock, percentiles over all values."""
    results = [r for run in runs for r in run["results"]]
    ttft, gaps = [r["ttft"] for r in results if r["ttft"] is not None], [g for r in results for g in r["gaps"]]
    tokens, seconds = sum(r["tokens"] for r in results), sum(run["seconds"] for run in runs)
    return {"concurrency": c, "requests": len(results), "tokens": tokens, "seconds": round(seconds, 3),
            "tokens_per_s": round(tokens / seconds, 2), "rounds_tokens_per_s": [
                round(sum(r["tokens"] for r in run["results"]) / run["seconds"], 2) for run in runs],
            "load_average": [round(run["load_average"], 1) for run in runs], "tpf": [run["tpf"] for run in runs],
            "ttft_p50": percentile(ttft, 50), "ttft_p99": percentile(ttft, 99),
            "itl_p50": percentile(gaps, 50), "itl_p99": percentile(gaps, 99)}


def jf_jax_argv(args, method: str, dtype: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "jf_jax.serve", "--model", args.model, "--dtype", dtype, "--method", method,
            "--block-size", str(args.block_size), "--max-batch", str(args.max_batch), "--max-context",
            str(args.max_context), "--min-prompt-bucket", "64", "--max-queue", "256", "--log-level", "warning", *extra]


def gguf_file(args, kind: str, workdir: str) -> str:
    """The GGUF of type ``kind`` for llama.cpp: the embedded Q4_1 file itself, or its weights dequantized by
    llama.cpp's own quantizer (allow_requantize: Q4_1 -> F32 exactly, -> BF16 rounded as jf-jax rounds)."""
    from jf_jax.weights.embedded import smollm2_gguf_path

    source = smollm2_gguf_path() if args.model == "smollm2-135m" else args.model
    out = source if kind == "q4_1" else f"{workdir}/{kind}.gguf"
    script = ("import ctypes, sys, llama_cpp\np = llama_cpp.llama_model_quantize_default_params()\n"
              "p.ftype, p.allow_requantize, p.nthread = int(sys.argv[3]), True, 2\n"
              "sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))")
    if not os.path.exists(out):  # made once for both llama.cpp servers
        subprocess.run([args.llama_cpp_python, "-c", script, source, out, str(GGUF_FTYPES[kind])], check=True,
                       capture_output=True, timeout=300)
    return out


def llama_argv(args, kind: str, gguf: str) -> tuple[str, list[str], dict]:
    """(server kind, command, environment) of a llama.cpp server on ``gguf``, a context per slot of --max-context.
    llama-cpp-python's server decodes one request at a time (no batching option; interrupt_requests, on by default,
    would end a running stream when another request arrives); llama-server decodes --max-batch slots together, as
    jf-jax does, without prompt caches (jf-jax has none; llama-cpp-python reuses the previous request's prefix)."""
    env, threads = {"OMP_WAIT_POLICY": args.llama_omp_wait}, str(args.threads)  # env: see --llama-omp-wait
    if kind == "llama-cpp-python":
        return kind, [args.llama_cpp_python, "-m", "llama_cpp.server", "--model", gguf, "--host", "127.0.0.1",
                      "--n_threads", threads, "--n_threads_batch", threads, "--n_ctx", str(args.max_context),
                      "--n_batch", "512", "--interrupt_requests", "False", "--verbose", "False"], env
    return kind, [args.llama_server, "--model", gguf, "--host", "127.0.0.1", "--threads", threads, "--threads-batch",
                  threads, "--ctx-size", str(args.max_context * args.max_batch), "--parallel", str(args.max_batch),
                  "--batch-size", "512", "--no-webui", "--log-disable", "--no-cache-prompt", "--cache-ram", "0"], env


def side_by_side(args, report: dict) -> bool:
    """Starts every server, then alternates them at each concurrency; fills report["servers"]."""
    from jf_jax import api

    levels = [int(c) for c in args.concurrency.split(",")]
    tokenizer = api.load_model(args.model, dtype="float32").tokenizer
    prompts = [tokenizer.apply_chat_template(p, add_generation_prompt=True) for p in
               code_prompts(tokenizer, max(max(levels), args.min_requests), args.max_context - args.max_tokens)]
    servers, workdir = [], tempfile.TemporaryDirectory()
    try:
        servers += [Server(f"jf-jax {method} {args.dtype}", "jf-jax", jf_jax_argv(args, method, args.dtype))
                    for method in args.methods.split(",") if method]
        programs = [p for p in ("llama-cpp-python", "llama-server") if getattr(args, p.replace("-", "_"))]
        servers += [Server(f"{p} {kind}", *llama_argv(args, p, gguf_file(args, kind, workdir.name)))
                    for kind in args.llama_cpp_types.split(",") if kind and programs for p in programs]
        for server in servers:
            started = time.perf_counter()
            server.wait_ready()
            warm = [post(server, "/v1/completions", server.body(prompts[0], args.max_tokens, stream))
                    for stream in (False, True)]  # first-request effects stay out of the levels
            # the streamed token count must be the server's own (llama.cpp's chunks are counted, not read)
            report["servers"][server.name] = {"ready_s": round(time.perf_counter() - started, 1), "levels": [],
                                              "stream_count_ok": warm[0]["tokens"] == warm[1]["tokens"]}
            print(f"{server.name}: ready after {report['servers'][server.name]['ready_s']} s", flush=True)
        runs = {}
        for c in levels:
            for rnd in range(args.rounds):
                for server in servers[rnd % len(servers):] + servers[:rnd % len(servers)]:
                    before = server.forwards()
                    results, wall = run_clients(c, prompts[:max(c, args.min_requests)], lambda p, s=server: post(
                        s, "/v1/completions", s.body(p, args.max_tokens)))
                    after = server.forwards()
                    # the load average shows the other work on the machine as the level ended
                    runs.setdefault((server.name, c), []).append(
                        {"results": results, "seconds": wall, "load_average": os.getloadavg()[0],
                         "tpf": before and round((after[0] - before[0]) / (after[1] - before[1]), 3)})
                    print(f"  {server.name} c={c}: {sum(r['tokens'] for r in results) / wall:.1f} tok/s", flush=True)
    finally:
        for server in servers:
            server.stop()
        workdir.cleanup()
    for (name, c), rs in runs.items():
        # greedy answers equal to the first server's at this level, prompt by prompt: numerics, not speed
        first = [r["text"] for r in runs[(servers[0].name, c)][0]["results"]]
        same = sum(r["text"] == f for run in rs for r, f in zip(run["results"], first))
        report["servers"][name]["levels"].append({**summary(c, rs), "same_text_as_first": same})
    return all(s["stream_count_ok"] for s in report["servers"].values())


def check(args, report: dict) -> bool:
    """Staggered concurrent requests per jf-jax method against solo AR, and compilations after warm-up."""
    from jf_jax import api
    from jf_jax.model import machine

    dtype = machine.choose_dtype(args.dtype).dtype
    model = api.load_model(args.model, dtype=dtype)
    prompts = code_prompts(model.tokenizer, args.check_requests // 2, args.max_context - args.max_tokens, seed=1)
    # each prompt twice, greedy and sampled; seeds also draw Jacobi's drafts, so greedy requests get one too
    cases = [{"prompt": prompts[i // 2], **dict(zip(("temperature", "top_p"), CHECK_SAMPLING if i % 2 else (0.0, 1.0))),
              "seed": 1000 + i, "stream": i % 4 < 2,
              "max_tokens": args.max_tokens // 2 + (7 * i) % (args.max_tokens // 2 + 1)}
             for i in range(2 * len(prompts))]

    def send(server, case):
        body = {k: v for k, v in case.items() if k != "prompt"} | {"return_token_ids": True}
        return post(server, "/v1/chat/completions", body | {"messages": [{"role": "user", "content": case["prompt"]}]})

    answers = {}
    for method in args.methods.split(","):
        server = Server(f"jf-jax {method} {dtype}", "jf-jax",
                        jf_jax_argv(args, method, dtype, "--sampling", "{}:{}".format(*CHECK_SAMPLING)))
        try:
            server.wait_ready()
            at_ready = server.metric("compilations_total"), server.metric("compilations_after_warmup_total")
            results, wall = run_clients(args.check_concurrency, cases, lambda case: send(server, case),
                                        gap_s=args.check_gap, seed=2)
            after = server.metric("compilations_total"), server.metric("compilations_after_warmup_total")
        finally:
            server.stop()
        answers[method] = [r["token_ids"] for r in results]
        tokens = sum(len(ids) for ids in answers[method])
        report["check"][method] = {
            "dtype": dtype, "requests": len(cases), "sampled": sum(c["temperature"] > 0 for c in cases),
            "streamed": sum(c["stream"] for c in cases), "tokens": tokens, "seconds": round(wall, 1),
            "tokens_per_s": round(tokens / wall, 1), "compilations_at_ready": at_ready[0],
            "compilations_during_run": after[0] - at_ready[0], "compilations_after_warmup": after[1]}
        print(f"{method}: {len(cases)} requests in {wall:.0f} s; compilations after warm-up: {after[1]}", flush=True)
    started = time.perf_counter()
    for case in cases:  # after the servers stopped: solo AR has the cores to itself
        case["solo"] = api.generate(model, [case["prompt"]], method="ar", max_new_tokens=case["max_tokens"],
                                    temperature=case["temperature"], top_p=case["top_p"], seed=case["seed"],
                                    warmup=False)[0].token_ids
    report["solo_seconds"] = round(time.perf_counter() - started, 1)
    for method, ids in answers.items():
        wrong = [i for i, case in enumerate(cases) if ids[i] != case["solo"]]
        report["check"][method]["mismatches"] = len(wrong)
        for i in wrong[:5]:
            print(f"  {method} mismatch, request {i}: server {ids[i][:12]}... solo {cases[i]['solo'][:12]}...")
    return all(r["mismatches"] == 0 and r["compilations_after_warmup"] == 0 for r in report["check"].values())


def table(header: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(map(str, row)) + " |" for row in rows)]


def markdown(report: dict) -> str:
    ms = lambda x: "-" if x is None else f"{1000 * x:.0f}"  # noqa: E731
    lines = [f"CPU: {report['cpu']}. Command: `{report['command']}`", ""]
    if report["servers"]:
        rows = sorted(((r["concurrency"], name, r) for name, s in report["servers"].items() for r in s["levels"]),
                      key=lambda row: row[0])
        lines += table(["concurrency", "server", "requests", "tokens", "tok/s (per round)", "TTFT p50 ms",
                        "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms", "TPF", "same text as first", "load avg"],
                       [[c, name, r["requests"], r["tokens"],
                         f"**{r['tokens_per_s']}** ({', '.join(map(str, r['rounds_tokens_per_s']))})",
                         ms(r["ttft_p50"]), ms(r["ttft_p99"]), ms(r["itl_p50"]), ms(r["itl_p99"]), r["tpf"][0] or "-",
                         f"{r['same_text_as_first']}/{r['requests']}", ", ".join(map(str, r["load_average"]))]
                        for c, name, r in rows])
        lines += ["", "Ready and warmed up after (s; streamed token count = usage): " + ", ".join(
            f"{n} {s['ready_s']} ({s['stream_count_ok']})" for n, s in report["servers"].items())]
    if report["check"]:
        lines += table(["method", "dtype", "requests", "sampled", "streamed", "tokens", "s", "tok/s",
                        "mismatches vs solo AR", "compiled at warm-up", "compiled during the run", "after warm-up"],
                       [[m, r["dtype"], r["requests"], r["sampled"], r["streamed"], r["tokens"], r["seconds"],
                         r["tokens_per_s"], f"**{r['mismatches']}**", int(r["compilations_at_ready"]),
                         int(r["compilations_during_run"]), f"**{int(r['compilations_after_warmup'])}**"]
                        for m, r in report["check"].items()])
        lines += ["", f"Solo AR reference decoding of every request: {report['solo_seconds']} s."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m", help="a spec jf-jax serve takes; llama.cpp needs a .gguf")
    p.add_argument("--dtype", default="auto", help="jf-jax's dtype (auto, float32, bfloat16)")
    p.add_argument("--methods", default="ar,jacobi,mr", help="jf-jax methods, one server each ('' for none)")
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--max-batch", type=int, default=4, help="jf-jax's slots, and llama-server's --parallel")
    p.add_argument("--max-context", type=int, default=256, help="per slot, for every server")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--min-requests", type=int, default=16, help="a level sends max(concurrency, this) requests")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=1, help="each level this many times per server, alternated")
    p.add_argument("--threads", type=int, default=2, help="llama.cpp's threads (decode and prompt)")
    p.add_argument("--llama-omp-wait", default="PASSIVE", help="llama.cpp's OMP_WAIT_POLICY: its threads spin at "
                   "each barrier when ACTIVE, which on a machine shared with other work collapses its speed")
    p.add_argument("--llama-cpp-python", help="a python with llama-cpp-python[server]: its server joins the run")
    p.add_argument("--llama-server", help="a llama-server binary (llama.cpp's own server): joins the run")
    p.add_argument("--llama-cpp-types", default="q4_1", help="GGUF weights for llama.cpp: q4_1 (the embedded "
                   "file), bf16, f32 (its weights dequantized by llama.cpp's quantizer, through --llama-cpp-python)")
    p.add_argument("--check", action="store_true", help="the lossless check instead of the side-by-side run")
    p.add_argument("--check-requests", type=int, default=200)
    p.add_argument("--check-concurrency", type=int, default=16)
    p.add_argument("--check-gap", type=float, default=0.05, help="seconds: mean wait before each request")
    p.add_argument("--json", type=pathlib.Path)
    p.add_argument("--markdown", type=pathlib.Path)
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the servers are stopped (finally blocks)
    from jf_jax.model.machine import cpu_kind

    report = {"cpu": cpu_kind(), "command": "python experiments/bench_serve.py " + " ".join(
        argv if argv is not None else sys.argv[1:]), "settings": vars(args) | {"json": None, "markdown": None},
        "servers": {}, "check": {}}
    ok = check(args, report) if args.check else side_by_side(args, report)
    print(text := markdown(report))
    for path, content in ((args.json, json.dumps(report, indent=1) + "\n"), (args.markdown, text)):
        if path:
            path.write_text(content)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

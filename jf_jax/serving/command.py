"""``jf-jax serve`` (``python -m jf_jax.serve``): load a model, start the engine, serve OpenAI's API over HTTP.

The model loads first; then the server listens at once and the engine compiles its programs in its own thread
(``GET /health`` answers 503 until it can serve, 200 after). SIGTERM or Ctrl-C drains: the listener closes, new
requests get 503, the running and queued ones finish within --drain-seconds (what is left then is cancelled with an
error event) and the process exits with status 0. docs/serving.md has the endpoints and the guarantee.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from jf_jax.cli.mesh import build_mesh, mesh_error, parse_mesh, plain_layout
from jf_jax.decoding.common import GenerationError
from jf_jax.decoding.sampling import Sampling
from jf_jax.serving.batch import SERVED_METHODS, BatchConfig, ServedMethod
from jf_jax.serving.engine import Engine, EngineConfig
from jf_jax.serving.protocol import Served

log = logging.getLogger("jf_jax.serve")


def sampling_list(text: str) -> tuple[Sampling, ...]:
    """argparse type: comma list of TEMPERATURE or TEMPERATURE:TOP_P, e.g. "0.7,1:0.9"."""
    out = []
    try:
        for item in filter(None, (x.strip() for x in text.split(","))):
            temperature, _, top_p = item.partition(":")
            out.append(Sampling(temperature=float(temperature), top_p=float(top_p) if top_p else 1.0))
    except (ValueError, GenerationError) as e:
        raise argparse.ArgumentTypeError(f"expected TEMPERATURE[:TOP_P],... got {text!r}: {e}") from None
    return tuple(out)


def method_list(text: str) -> tuple[str, ...]:
    """argparse type: comma list of methods, e.g. "ar,jacobi,mr"."""
    methods = tuple(dict.fromkeys(filter(None, (x.strip() for x in text.split(",")))))
    unknown = [m for m in methods if m not in SERVED_METHODS]
    if not methods or unknown:
        raise argparse.ArgumentTypeError(f"expected methods among {','.join(SERVED_METHODS)}, got {text!r}")
    return methods


def int_list(text: str) -> tuple[int, ...]:
    """argparse type: comma list of integers, e.g. "8,16"."""
    try:
        values = tuple(dict.fromkeys(int(x) for x in text.split(",") if x.strip()))
    except ValueError:
        values = ()
    if not values:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    defaults = BatchConfig()
    p = argparse.ArgumentParser(prog="jf-jax serve", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m",
                   help="smollm2-135m (embedded default), a Hugging Face directory, a .gguf file or a run directory")
    p.add_argument("--served-model-name", help="the model id clients send and /v1/models lists (default: the "
                   "--model name, or a path's file name without .gguf)")
    p.add_argument("--method", choices=SERVED_METHODS, default=defaults.method,
                   help="the method of a request that names none (every method gives AR's tokens; default "
                        "%(default)s)")
    p.add_argument("--block-size", type=int, default=defaults.block_size,
                   help="jacobi / mr block size of a request that names none (default %(default)s)")
    p.add_argument("--methods", type=method_list, default=(),
                   help="methods served beside --method, e.g. ar,jacobi,mr: a request picks one with its 'method' "
                        "field (a batch of --max-batch slots and its programs per method and block size)")
    p.add_argument("--block-sizes", type=int_list, default=(),
                   help="block sizes served beside --block-size for jacobi and mr, e.g. 8,16 (the 'block_size' "
                        "field); every served method but ar runs with each")
    p.add_argument("--num-blocks", type=int, default=defaults.num_blocks, help="mr: blocks in flight")
    p.add_argument("--spawn-ratio", type=float, default=defaults.spawn_ratio, help="mr: spawn threshold")
    p.add_argument("--pool-size", type=int, default=defaults.pool_size, help="mr: rejection-recycling rows")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="auto: the fastest dtype shown lossless on this machine (python -m jf_jax.doctor)")
    p.add_argument("--max-batch", type=int, default=defaults.max_batch,
                   help="rows decoded together (slots), per served method and block size")
    p.add_argument("--max-context", type=int, default=defaults.max_context,
                   help="prompt + generated tokens per request (capped at the model's context)")
    p.add_argument("--min-prompt-bucket", type=int, default=defaults.min_prompt_bucket,
                   help="narrowest prefill width: prompts are padded to a power-of-two multiple of it up to the "
                        "context, one compiled prefill per width (default %(default)s)")
    p.add_argument("--max-queue", type=int, default=EngineConfig.max_queue,
                   help="requests waiting for a slot before 429")
    p.add_argument("--sampling", type=sampling_list, default=(),
                   help="sampling settings to compile at warm-up beside greedy, e.g. 0.7,1:0.95 (others compile on "
                        "first use, in the background)")
    p.add_argument("--max-sampling", type=int, default=EngineConfig.max_sampling,
                   help="distinct (temperature, top_p) settings the server compiles, greedy included")
    p.add_argument("--decode-shape", default=defaults.decode_shape, help="auto, off or ROWSxWIDTH (jf-jax decode)")
    p.add_argument("--mesh", type=parse_mesh, help="decode on several devices, e.g. tensor=4 or data=2,tensor=4: "
                   "weights and KV cache heads split over tensor, each batch's rows over data x fsdp (--max-batch a "
                   "multiple of data x fsdp), as jf-jax decode --mesh")
    # 25 s: within the 30 s a container orchestrator commonly grants between SIGTERM and SIGKILL
    p.add_argument("--drain-seconds", type=float, default=25.0,
                   help="on SIGTERM or Ctrl-C, how long running and queued requests may take to finish before they "
                        "are cancelled (default %(default)s)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p


def model_name(spec: str) -> str:
    base = os.path.basename(spec.rstrip("/"))
    return base[: -len(".gguf")] if base.endswith(".gguf") else base


def served_for(model, spec: str, name: str | None, engine: Engine) -> Served:
    tok = model.tokenizer
    render = (lambda messages: tok.apply_chat_template(messages, add_generation_prompt=True)
              ) if tok.chat_template else None
    return Served(model=name or model_name(spec), aliases=(spec,), methods=engine.config.served,
                  block_size=engine.config.batch.block_size, max_context=engine.max_context,
                  vocab_size=model.cfg.vocab_size, encode=tok.encode, render_chat=render)


def served_methods(args) -> tuple[ServedMethod, ...]:
    """The pairs served beside the default (--method, --block-size): every method of --method and --methods with
    every block size of --block-size and --block-sizes (AR with block size 1 only)."""
    methods = dict.fromkeys((args.method, *args.methods))
    blocks = dict.fromkeys((args.block_size, *args.block_sizes))
    return tuple(dict.fromkeys(ServedMethod.of(m, b) for m in methods for b in blocks))


def engine_config(args) -> EngineConfig:
    batch = BatchConfig(method=args.method, block_size=args.block_size, max_batch=args.max_batch,
                        max_context=args.max_context, num_blocks=args.num_blocks, spawn_ratio=args.spawn_ratio,
                        pool_size=args.pool_size, decode_shape=args.decode_shape,
                        min_prompt_bucket=args.min_prompt_bucket)
    if args.max_queue < 0 or args.max_sampling < 1 + len(set(args.sampling)):
        raise GenerationError("--max-queue must be >= 0 and --max-sampling must count greedy and every --sampling")
    if not 0 <= args.drain_seconds < float("inf"):
        raise GenerationError(f"--drain-seconds must be a number >= 0, got {args.drain_seconds}")
    return EngineConfig(batch=batch, methods=served_methods(args), max_queue=args.max_queue,
                        max_sampling=args.max_sampling,
                        warm_sampling=tuple(dict.fromkeys(s for s in args.sampling if not s.is_greedy)))


def build(model, spec: str, config: EngineConfig, name: str | None = None, mesh=None):
    """(engine, app) for a loaded model, decoding on ``mesh`` (None: one device); the engine is started (it warms
    up in its thread)."""
    from jf_jax.serving.app import create_app  # deferred: starlette is only needed to serve

    engine = Engine(model, config, mesh).start()
    return engine, create_app(engine, served_for(model, spec, name, engine))


def report_when_ready(engine: Engine, started: float, server) -> None:
    """Logs the end of warm-up; a failed warm-up stops the server (the process exits with status 1)."""
    while not engine.ready.wait(0.5):
        if engine.failure:
            log.error("%s", engine.failure)
            server.should_exit = True
            return
        if engine.closing.is_set():  # shut down before it was ready
            return
    total, _ = engine.metrics.compiled()
    layout = next(iter(engine.groups.values())).layout
    mesh = "one device" if engine.mesh is None else ", ".join(f"{a}={n}" for a, n in engine.mesh.shape.items())
    log.info("ready after %.1f s: %d programs compiled; methods %s (the first is the default), %d slots each, "
             "context %d, prompt buckets %s; %s", time.perf_counter() - started, total,
             ", ".join(m.describe() for m in engine.groups), layout.rows, layout.max_context,
             ",".join(map(str, layout.prompt_buckets)), mesh)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # orbax (through absl) narrates every cache write of a converted model at INFO: not the server's news
    logging.getLogger("absl").setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        config = engine_config(args)
        problem = mesh_error(args.mesh, [args.model])  # devices and heads against the mesh, before the model loads
        if problem is None and args.mesh is not None and args.max_batch % (args.mesh.data * args.mesh.fsdp):
            problem = (f"--max-batch {args.max_batch} does not split over the {args.mesh.data * args.mesh.fsdp} "
                       f"row devices of --mesh {args.mesh} (data x fsdp): use a multiple of it")
        if problem:
            raise GenerationError(problem)
    except GenerationError as e:
        print(f"jf-jax serve: error: {e}", file=sys.stderr)
        return 2
    import threading

    import uvicorn

    from jf_jax import api
    from jf_jax.serving.app import DrainingServer  # deferred: uvicorn is only needed to serve

    started = time.perf_counter()
    model = api.load_model(args.model, dtype=args.dtype, **plain_layout(args.mesh))
    try:
        mesh = build_mesh(args.mesh, model.cfg)  # a model whose heads the tensor axis cannot split is refused
    except ValueError as e:
        print(f"jf-jax serve: error: {e}", file=sys.stderr)
        return 2
    engine, app = build(model, args.model, config, args.served_model_name, mesh)
    server = DrainingServer(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                           access_log=args.log_level == "debug"), engine, args.drain_seconds)
    threading.Thread(target=report_when_ready, args=(engine, started, server), daemon=True).start()
    log.info("listening on http://%s:%d; warming up (GET /health answers 200 when ready)", args.host, args.port)
    try:
        server.run()
    finally:
        if not engine.stop():
            log.warning("the scheduler thread did not end in time (a program was still compiling)")
    return 0 if engine.failure is None else 1

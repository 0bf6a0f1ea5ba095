"""The HTTP face of the engine: an ASGI (Starlette) app with OpenAI's routes, /health and /metrics, and the uvicorn
server that runs it and drains the engine on exit signals.

Handlers never decode: they check the request (``serving.protocol``), queue it (``Engine.submit``) and relay the
engine's events, as one JSON body or as server-sent events (``data: {...}`` chunks, then ``data: [DONE]``). A client
that goes away is noticed by Starlette (its disconnect cancels the streaming task; a non-streamed request polls for
it) and its row is freed at the scheduler's next iteration.

Shutdown (``DrainingServer``): on the first SIGTERM or SIGINT the engine stops admitting (``Engine.drain``: a
request that still reaches it gets 503 with code ``shutdown``) and uvicorn closes its listener, then waits for the
open responses. The running and queued requests decode to their end; what is left when the drain time is over gets
a 503 error event (a stream ends with an error chunk and ``data: [DONE]``, a plain request with the 503 body), so
every response ends well-formed. A second signal cancels what is left at once. uvicorn's own handling would
re-raise the signal once it has shut down, so that its default action ends the process (status 143 for SIGTERM);
here the drain is the orderly end, so the signal is handled and not re-raised and the command returns 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
import threading
import time

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from jf_jax.decoding.common import MAX_SEED
from jf_jax.serving.engine import Engine, Handle
from jf_jax.serving.protocol import APIError, Served, parse_body, parse_request
from jf_jax.serving.responses import DONE, Header, chunk_body, completion_body, final_chunk, sse, usage_chunk

log = logging.getLogger("jf_jax.serve")
DISCONNECT_POLL_S = 0.5
DRAIN_SIGNALS = (signal.SIGINT, signal.SIGTERM)
SLOW_CLIENT_GRACE_S = 5.0
"""How long past the drain time uvicorn waits for responses still being sent (a client that stopped reading)
before it cancels them: the backstop that bounds the shutdown whatever the clients do."""


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def create_app(engine: Engine, served: Served) -> Starlette:
    """The app serving ``engine`` under the names and limits of ``served``."""
    created = int(time.time())

    async def health(request: Request) -> Response:
        if engine.ready.is_set():
            return JSONResponse({"status": "ok"})
        status = "failed" if engine.failure else "loading"
        return JSONResponse({"status": status, "detail": engine.failure}, status_code=503)

    async def models(request: Request) -> Response:
        default = served.methods[0]
        card = {"id": served.model, "object": "model", "created": created, "owned_by": "jf-jax",
                "max_model_len": served.max_context, "method": default.method, "block_size": default.block_size,
                "methods": [{"method": m.method, "block_size": m.block_size} for m in served.methods]}
        return JSONResponse({"object": "list", "data": [card]})

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(engine.metrics.render(engine.gauges()), media_type="text/plain; version=0.0.4")

    async def generate(request: Request, kind: str) -> Response:
        try:
            body = parse_body(await request.body())
            req = parse_request(body, kind, served, default_seed=secrets.randbelow(MAX_SEED + 1))
            handle = engine.submit(req, asyncio.get_running_loop())
        except APIError as e:
            engine.metrics.request("rejected")
            return error_response(e)
        header = Header.new(kind, int(time.time()), served.model)
        if req.stream:
            return StreamingResponse(stream(handle, header), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await whole(request, handle, header)

    async def whole(request: Request, handle: Handle, header: Header) -> Response:
        text = []
        try:
            while True:
                try:
                    event = await asyncio.wait_for(handle.events.get(), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        return Response(status_code=499)  # nobody reads it; the row is freed below
                    continue
                if event[0] == "error":
                    return error_response(event[1])
                text.append(event[1])
                if event[0] == "done":
                    outcome = event[3]
                    return JSONResponse(completion_body(header, "".join(text), outcome,
                                                        handle.request.return_token_ids))
        finally:
            engine.cancel(handle)  # a no-op once the request ended; frees its row if it had not

    async def stream(handle: Handle, header: Header):
        ids = handle.request.return_token_ids
        try:
            if header.kind == "chat":
                yield sse(chunk_body(header, "", first=True))
            while True:
                event = await handle.events.get()
                if event[0] == "error":
                    yield sse(event[1].body())
                    break
                if event[0] == "text":
                    yield sse(chunk_body(header, event[1], token_ids=event[2] if ids else None))
                    continue
                _, text, new_ids, outcome = event
                yield sse(final_chunk(header, text, outcome, new_ids if ids else None))
                if handle.request.include_usage:
                    yield sse(usage_chunk(header, outcome))
                break
            yield DONE
        finally:  # also reached when the client disconnects: Starlette cancels this generator
            engine.cancel(handle)

    async def completions(request: Request) -> Response:
        return await generate(request, "completion")

    async def chat(request: Request) -> Response:
        return await generate(request, "chat")

    async def http_error(request: Request, exc: HTTPException) -> Response:
        return error_response(APIError(exc.status_code, str(exc.detail), code="not_found"
                                       if exc.status_code == 404 else None))

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error")
        return error_response(APIError(500, f"internal error: {type(exc).__name__}: {exc}", kind="server_error"))

    routes = [Route("/health", health), Route("/v1/models", models), Route("/metrics", metrics),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat, methods=["POST"])]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error})


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose exit signals drain ``engine`` for up to ``drain_seconds``."""

    def __init__(self, config: uvicorn.Config, engine: Engine, drain_seconds: float):
        config.timeout_graceful_shutdown = drain_seconds + SLOW_CLIENT_GRACE_S
        super().__init__(config)
        self.engine, self.drain_seconds = engine, drain_seconds

    def handle_exit(self, sig, frame) -> None:
        self.engine.drain(0.0 if self.should_exit else self.drain_seconds)
        self.should_exit = True

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in DRAIN_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

"""A live ``jf-jax serve`` for tests: uvicorn on 127.0.0.1 and a free port, in a thread of the test process (or the
real command in a subprocess), stopped at the end; plain HTTP helpers on top of the standard library."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    """Requests to one server (a new connection each, as concurrent clients do)."""

    def __init__(self, port: int):
        self.port = port
        self.base = f"http://127.0.0.1:{port}"

    def request(self, method: str, path: str, body=None, raw: bytes | None = None, timeout: float = 120):
        """(status, headers, parsed JSON or text) of one request."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        text = resp.read().decode()
        conn.close()
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = text
        return resp.status, dict(resp.getheaders()), parsed

    def post(self, path: str, body=None, **kw):
        return self.request("POST", path, body, **kw)

    def get(self, path: str):
        return self.request("GET", path)

    def stream(self, path: str, body: dict, timeout: float = 120):
        """The ``data:`` payloads of a streamed response (parsed JSON, and the final "[DONE]")."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        conn.request("POST", path, body=json.dumps({**body, "stream": True}).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        events = []
        for line in resp:
            line = line.decode().strip()
            if line.startswith("data: "):
                payload = line[len("data: "):]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
        conn.close()
        return events

    def metric(self, name: str, labels: str = "") -> float:
        _, _, text = self.get("/metrics")
        key = f"jf_jax_serve_{name}{labels}"
        for line in text.splitlines():
            if line.startswith(key + " "):
                return float(line.split()[-1])
        raise KeyError(key)

    def wait_ready(self, timeout: float = 600) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            with contextlib.suppress(OSError):
                if self.get("/health")[0] == 200:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"server on port {self.port} not ready after {timeout} s")


@contextlib.contextmanager
def serve_in_thread(engine, app):
    """Serves ``app`` (whose ``engine`` is started) on a free port until the block ends; yields a ``Client``."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    client = Client(port)
    try:
        client.wait_ready()
        yield client
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        engine.stop()


@contextlib.contextmanager
def serve_in_subprocess(*args: str, timeout: float = 600, env: dict | None = None):
    """``python -m jf_jax.serve ARGS --port FREE`` until the block ends (``env``: variables added to this process's);
    yields a ``Client`` whose ``process`` is the server's ``Popen`` and ``log`` the file of its stdout and stderr."""
    port = free_port()
    log = tempfile.TemporaryFile("w+")  # a file, not a pipe: a chatty server never blocks on a full pipe
    proc = subprocess.Popen([sys.executable, "-m", "jf_jax.serve", *args, "--port", str(port)], stdout=log,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})})
    client = Client(port)
    client.process, client.log = proc, log
    try:
        deadline = time.time() + timeout
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"the server exited with {proc.returncode}:\n{log.read()[-3000:]}")
            with contextlib.suppress(OSError):
                if client.get("/health")[0] == 200:
                    break
            if time.time() > deadline:
                raise TimeoutError("the server did not become ready")
            time.sleep(0.3)
        yield client
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()

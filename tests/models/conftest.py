"""Session fixtures for the provider tests: the embedded model (loaded once), a real
OpenAI-compatible server (llama-cpp-python's own, with the bundled model) on a loopback port,
and a scripted wire server (``wire``) that records each request body a provider sends and
answers with the next scripted response."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from loom.models.local import LocalModel, bundled_model_path

HERE = Path(__file__).parent
SRC = HERE.parent.parent / "src"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def local_model() -> LocalModel:
    return LocalModel()


@pytest.fixture(scope="session")
def llama_server() -> Iterator[str]:
    """Base URL (``http://127.0.0.1:<port>/v1``) of a running ``llama_cpp.server``."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE)])}
    cmd = [
        sys.executable,
        str(HERE / "llama_server.py"),
        "--model",
        str(bundled_model_path()),
        "--model_alias",
        "smollm2",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        "1024",
        "--verbose",
        "False",
    ]
    log = tempfile.TemporaryFile()  # noqa: SIM115 - a pipe nobody reads could fill and stall the server
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 60
    try:
        while True:
            if proc.poll() is not None:
                log.seek(0)
                err = log.read().decode(errors="replace")
                pytest.fail(f"llama_cpp.server exited with {proc.returncode}: {err[-2000:]}")
            try:
                with urllib.request.urlopen(f"{base}/models", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("llama_cpp.server did not start within 60 s")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


class WireServer(ThreadingHTTPServer):
    """A loopback HTTP server standing in for a provider's API: it keeps every request's path
    and JSON body (``requests``) and answers each with the next of ``answers`` (status, body):
    a 200 as an event stream, anything else as a JSON error."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _WireHandler)
        self.answers: list[tuple[int, bytes]] = []
        self.requests: list[tuple[str, dict[str, Any]]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}"

    def script(self, *answers: tuple[int, bytes]) -> None:
        self.answers.extend(answers)

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [body for _, body in self.requests]


class _WireHandler(BaseHTTPRequestHandler):
    server: WireServer

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length", 0)))
        self.server.requests.append((self.path, json.loads(raw)))
        status, body = self.server.answers.pop(0) if self.server.answers else (500, b"{}")
        self.send_response(status)
        kind = "text/event-stream" if status == 200 else "application/json"
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()


@pytest.fixture
def wire() -> Iterator[WireServer]:
    """A fresh :class:`WireServer` on a loopback port."""
    srv = WireServer()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()

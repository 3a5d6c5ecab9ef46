"""Servers for the embedder tests, each started once per test session on a loopback port:
llama-cpp-python's own OpenAI-compatible server with the bundled SmolLM2 GGUF in embedding
mode, and a small starlette app (``fake_embeddings_app``) that answers the error cases."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).parent
SRC = HERE.parent.parent / "src"
# Runs llama_cpp.server with llama.cpp's extra CPU buffers off, as the provider tests do.
LLAMA_SERVER = HERE.parent / "models" / "llama_server.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(cmd: list[str], base: str, env: dict[str, str], what: str) -> Iterator[str]:
    """Start ``cmd``, wait until ``{base}/models`` answers 200 (polling, never a fixed sleep),
    yield ``base``, stop it."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 - a pipe nobody reads could fill and stall it
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    try:
        while True:
            if proc.poll() is not None:
                log.seek(0)
                out = log.read().decode(errors="replace")
                pytest.fail(f"{what} exited with {proc.returncode}: {out[-2000:]}")
            try:
                with urllib.request.urlopen(f"{base}/models", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{what} did not answer {base}/models within 60 s")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="session")
def llama_embedding_server() -> Iterator[str]:
    """Base URL (``http://127.0.0.1:<port>/v1``) of ``python -m llama_cpp.server`` serving the
    bundled SmolLM2 GGUF with ``--embedding true``. SmolLM2 declares no pooling, and the
    server then answers one vector per token; ``--kv_overrides llama.pooling_type=int:1``
    makes it mean-pool (its own ``pooling_type`` setting does not exist)."""
    from loom.models.local import bundled_model_path

    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(LLAMA_SERVER.parent)])}
    cmd = [
        sys.executable,
        str(LLAMA_SERVER),
        "--model",
        str(bundled_model_path()),
        "--model_alias",
        "smollm2",
        "--embedding",
        "true",
        "--kv_overrides",
        "llama.pooling_type=int:1",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        "512",
        "--verbose",
        "False",
    ]
    yield from _serve(cmd, f"http://127.0.0.1:{port}/v1", env, "llama_cpp.server")


@pytest.fixture(scope="session")
def fake_embeddings_server() -> Iterator[str]:
    """Base URL of ``fake_embeddings_app`` under uvicorn."""
    pytest.importorskip("uvicorn")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE)])}
    cmd = [
        sys.executable,
        "-m",
        "uvicorn",
        "fake_embeddings_app:app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--timeout-graceful-shutdown",  # the "stall" answer must not hold the shutdown up
        "1",
    ]
    yield from _serve(cmd, f"http://127.0.0.1:{port}/v1", env, "the fake embeddings server")


@pytest.fixture
def closed_port_url() -> str:
    """An API root on a loopback port nothing listens on."""
    return f"http://127.0.0.1:{free_port()}/v1"

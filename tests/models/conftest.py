"""Session fixtures for the provider tests: the embedded model (loaded once) and a real
OpenAI-compatible server (llama-cpp-python's own, with the bundled model) on a loopback port."""

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

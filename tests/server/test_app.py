"""The server process: health, readiness, JSON errors, configuration errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
from tests.server.conftest import SRC, Server


def test_health_and_readiness(server: Server) -> None:
    assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{server.url}/readyz").json()
    assert ready["status"] == "ready" and ready["agents"] == ["calc", "ops"]


def test_unknown_paths_answer_a_json_error(server: Server) -> None:
    r = httpx.get(f"{server.url}/no/such/path")
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "NotFound"


def test_the_openapi_schema_is_served(server: Server) -> None:
    schema = httpx.get(f"{server.url}/openapi.json").json()
    assert "/healthz" in schema["paths"] and "/readyz" in schema["paths"]


def test_serve_without_agents_exits_2_with_a_message(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "loom", "serve", "--port", "1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=SRC),
    )
    assert out.returncode == 2 and "--agents DIR" in out.stderr

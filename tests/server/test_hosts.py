"""DNS-rebinding and cross-site protection (``Host`` / ``Origin``), against a real server.

gRPC is not covered here: a browser cannot speak it, so a rebinding page cannot reach it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.server.conftest import AGENTS, SRC, Server, free_port, start_server, stop_server

EVIL = "evil.example.com"
MCP_INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "rebinding", "version": "0"},
    },
}
MCP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}

# (method, path, json body, extra headers): a turn, MCP, the run API, the console, health
ROUTES: list[tuple[str, str, Any, dict[str, str]]] = [
    (
        "POST",
        "/v1/chat/completions",
        {"model": "calc", "messages": [{"role": "user", "content": "add 1 2"}]},
        {},
    ),
    ("POST", "/mcp", MCP_INIT, MCP_HEADERS),
    ("POST", "/threads", {}, {}),
    ("GET", "/threads/search", None, {}),
    ("GET", "/console", None, {}),
    ("GET", "/v1/models", None, {}),
    ("GET", "/readyz", None, {}),
]


def error_of(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message"}, body
    err: dict[str, Any] = body["error"]
    return err


def send(url: str, route: tuple[str, str, Any, dict[str, str]], **headers: str) -> httpx.Response:
    method, path, body, extra = route
    return httpx.request(method, url + path, json=body, headers={**extra, **headers}, timeout=30)


@pytest.mark.parametrize("route", ROUTES, ids=[f"{m} {p}" for m, p, _, _ in ROUTES])
def test_a_rebinding_host_is_refused_on_every_route(
    server: Server, route: tuple[str, str, Any, dict[str, str]]
) -> None:
    r = send(server.url, route, Host=f"{EVIL}:{server.port}", Origin=f"http://{EVIL}:{server.port}")
    assert r.status_code == 421, r.text
    err = error_of(r)
    assert err["type"] == "MisdirectedRequest" and f"--allowed-host {EVIL}" in err["message"]


@pytest.mark.parametrize("route", ROUTES, ids=[f"{m} {p}" for m, p, _, _ in ROUTES])
def test_a_foreign_origin_is_refused_on_every_route(
    server: Server, route: tuple[str, str, Any, dict[str, str]]
) -> None:
    r = send(server.url, route, Origin=f"http://{EVIL}")
    assert r.status_code == 403, r.text
    err = error_of(r)
    assert err["type"] == "ForbiddenOrigin" and "--allowed-origin" in err["message"]


@pytest.mark.parametrize(
    "host", ["127.0.0.1:{port}", "localhost:{port}", "localhost", "[::1]:{port}", "127.0.0.1"]
)
def test_loopback_hosts_and_origins_are_served(server: Server, host: str) -> None:
    host = host.format(port=server.port)
    origin = f"http://{host}"
    r = send(server.url, ROUTES[0], Host=host, Origin=origin)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "The sum is 3."
    r = send(server.url, ROUTES[1], Host=host, Origin=origin)
    assert r.status_code == 200 and '"serverInfo"' in r.text


def test_a_null_origin_is_refused(server: Server) -> None:
    r = httpx.get(f"{server.url}/v1/models", headers={"Origin": "null"})
    assert r.status_code == 403


@pytest.fixture(scope="module")
def named(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(
        tmp_path_factory.mktemp("named"),
        "--allowed-host",
        "agents.example",
        "--allowed-host",
        "*.corp.example",
        "--allowed-origin",
        "https://app.example",
    )
    yield srv
    stop_server(srv)


@pytest.mark.parametrize(
    ("host", "origin", "status"),
    [
        ("agents.example", None, 200),
        ("agents.example:443", "https://agents.example:443", 200),  # same host
        ("a.corp.example", "https://app.example", 200),
        ("agents.example", "https://other.example", 403),
        ("corp.example", None, 421),
        (EVIL, "https://app.example", 421),
    ],
)
def test_allowed_hosts_and_origins(
    named: Server, host: str, origin: str | None, status: int
) -> None:
    headers = {"Host": host, **({"Origin": origin} if origin else {})}
    r = send(named.url, ROUTES[0], **headers)
    assert r.status_code == status, r.text


def _serve(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp / "server_agents.py").write_text(AGENTS)
    (tmp / "keys.yaml").write_text(
        f"- {{name: a, key_sha256: {hashlib.sha256(b'long-enough-1').hexdigest()}}}\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, str(tmp)]))
    cmd = [sys.executable, "-m", "loom", "serve", "--app", "server_agents:registry"]
    cmd += ["--store", str(tmp / "x.db"), "--port", str(free_port()), "--keys", "keys.yaml"]
    return subprocess.run(
        [*cmd, *args], capture_output=True, text=True, env=env, cwd=tmp, timeout=60
    )


def test_on_every_interface_the_address_a_connection_arrived_on_is_allowed(
    tmp_path: Path,
) -> None:
    """Bound to 0.0.0.0: a client (a health probe) that names the interface's own IP is
    served; a rebinding name is not."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent: it picks the outgoing interface
        ip = s.getsockname()[0]
    if ip.startswith("127."):
        pytest.skip("no interface but loopback")
    key = "long-enough-1"
    srv = start_server(
        tmp_path,
        "--host",
        "0.0.0.0",
        "--allowed-host",
        "agents.example",
        env={"LOOM_API_KEYS": key},
    )
    try:
        url = f"http://{ip}:{srv.port}"
        auth = {"Authorization": f"Bearer {key}"}
        assert httpx.get(f"{url}/v1/models", headers=auth).status_code == 200
        named = httpx.get(f"{url}/v1/models", headers={**auth, "Host": "agents.example"})
        assert named.status_code == 200
        evil = httpx.get(f"{url}/v1/models", headers={**auth, "Host": EVIL})
        assert evil.status_code == 421
    finally:
        stop_server(srv)


def test_binding_every_interface_needs_allowed_hosts(tmp_path: Path) -> None:
    out = _serve(tmp_path, "--host", "0.0.0.0")
    assert out.returncode == 2, out.stderr
    assert "--allowed-host" in out.stderr and "0.0.0.0" in out.stderr

"""API keys, agent and thread scoping, limits, CORS and access logs, against a real server."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.server.conftest import AGENTS, SRC, Server, free_port, start_server, stop_server

ALICE, BOB, ROOT, ENV = "alice-key-0001", "bob-key-0002", "root-key-0003", "env-key-0004"
ORIGIN = "http://allowed.example"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("keyed")
    bob_hash = hashlib.sha256(BOB.encode()).hexdigest()
    (tmp / "keys.yaml").write_text(
        f"- {{name: alice, key: {ALICE}, agents: [calc, slow]}}\n"
        f"- {{name: bob, key_sha256: {bob_hash}}}\n"
        f"- {{name: root, key: {ROOT}, admin: true}}\n"
    )
    srv = start_server(
        tmp,
        "--keys",
        str(tmp / "keys.yaml"),
        "--max-concurrent-runs",
        "2",
        "--cors-origin",
        ORIGIN,
        "--log-format",
        "json",
        app="server_agents:slow_registry",
        env={"LOOM_API_KEYS": ENV},
    )
    yield srv
    stop_server(srv)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def error_of(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message"}, body
    err: dict[str, Any] = body["error"]
    return err


# -- keys -------------------------------------------------------------------------------------
def test_health_needs_no_key_and_names_no_agents(keyed: Server) -> None:
    assert httpx.get(f"{keyed.url}/healthz").status_code == 200
    ready = httpx.get(f"{keyed.url}/readyz")
    assert ready.status_code == 200 and "agents" not in ready.json()


@pytest.mark.parametrize("path", ["/assistants/search", "/v1/models", "/openapi.json"])
def test_missing_key_is_401(keyed: Server, path: str) -> None:
    method = "POST" if path.endswith("search") else "GET"
    r = httpx.request(method, keyed.url + path, json={})
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    assert "Authorization: Bearer" in error_of(r)["message"]


@pytest.mark.parametrize(
    "headers",
    [bearer("wrong-key-000"), {"x-api-key": "wrong-key-000"}, {"Authorization": "Basic abc"}],
)
def test_wrong_key_is_401(keyed: Server, headers: dict[str, str]) -> None:
    r = httpx.get(f"{keyed.url}/v1/models", headers=headers)
    assert r.status_code == 401 and error_of(r)["type"] == "Unauthorized"


@pytest.mark.parametrize("headers", [bearer(BOB), {"x-api-key": BOB}, bearer(ENV)])
def test_right_key_in_either_header(keyed: Server, headers: dict[str, str]) -> None:
    r = httpx.get(f"{keyed.url}/v1/models", headers=headers)
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == ["calc", "ops", "slow"]


def test_official_clients_send_the_key(keyed: Server) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{keyed.url}/v1", api_key=BOB)
    assert [m.id for m in client.models.list().data] == ["calc", "ops", "slow"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{keyed.url}/v1", api_key="nope-nope").models.list()


# -- agents a key may use ---------------------------------------------------------------------
def test_agent_scoped_key_sees_only_its_agents(keyed: Server) -> None:
    h = bearer(ALICE)
    found = httpx.post(f"{keyed.url}/assistants/search", json={}, headers=h).json()
    assert [a["assistant_id"] for a in found] == ["calc", "slow"]
    models = httpx.get(f"{keyed.url}/v1/models", headers=h).json()
    assert [m["id"] for m in models["data"]] == ["calc", "slow"]
    r = httpx.get(f"{keyed.url}/assistants/ops", headers=h)
    assert r.status_code == 404 and error_of(r)
    chat = {"model": "ops", "messages": [{"role": "user", "content": "go"}]}
    r = httpx.post(f"{keyed.url}/v1/chat/completions", json=chat, headers=h)
    assert r.status_code == 404
    r = httpx.post(f"{keyed.url}/v1/weave", json={"agent": "ops", "message": "go"}, headers=h)
    assert r.status_code == 404


# -- threads a key owns -----------------------------------------------------------------------
def test_a_key_never_reads_another_keys_thread(keyed: Server) -> None:
    url = keyed.url
    thread = httpx.post(f"{url}/threads", json={}, headers=bearer(BOB)).json()["thread_id"]
    run = {"assistant_id": "calc", "input": {"messages": [{"role": "user", "content": "add 2 3"}]}}
    done = httpx.post(f"{url}/threads/{thread}/runs/wait", json=run, headers=bearer(BOB))
    assert done.status_code == 200
    run_id = done.headers["content-location"].rsplit("/", 1)[1]
    assert httpx.get(f"{url}/threads/{thread}", headers=bearer(BOB)).status_code == 200

    alice = bearer(ALICE)
    for method, path in [
        ("GET", f"/threads/{thread}"),
        ("GET", f"/threads/{thread}/state"),
        ("GET", f"/threads/{thread}/runs"),
        ("GET", f"/threads/{thread}/runs/{run_id}"),
        ("POST", f"/threads/{thread}/runs/{run_id}/cancel"),
        ("PATCH", f"/threads/{thread}"),
        ("DELETE", f"/threads/{thread}"),
        ("POST", f"/threads/{thread}/runs/wait"),
    ]:
        r = httpx.request(
            method, url + path, json=run if "runs/wait" in path else {}, headers=alice
        )
        assert r.status_code == 404, (method, path, r.text)
        assert thread in error_of(r)["message"]
    # nor by id in a search; as an OpenAI / Weave session or by creating it again, the id
    # names alice's own session (ids are per key, issue #24), never bob's
    ids = httpx.post(f"{url}/threads/search", json={"ids": [thread]}, headers=alice).json()
    assert ids == []
    listed = httpx.post(f"{url}/threads/search", json={"limit": 100}, headers=alice).json()
    assert thread not in [t["thread_id"] for t in listed]
    chat = {"model": "calc", "messages": [{"role": "user", "content": "add 1 1"}]}
    r = httpx.post(
        f"{url}/v1/chat/completions", json=chat, headers={**alice, "X-Loom-Session": thread}
    )
    assert r.status_code == 200 and r.headers["x-loom-session"] == f"alice~{thread}"
    weave = {"agent": "calc", "message": "add 1 1", "session_id": thread}
    r = httpx.post(f"{url}/v1/weave", json=weave, headers=alice)
    assert r.status_code == 200 and r.json()["session_id"] == f"alice~{thread}"
    r = httpx.post(
        f"{url}/threads", json={"thread_id": thread, "if_exists": "do_nothing"}, headers=alice
    )
    assert r.status_code == 200 and r.json()["thread_id"] == f"alice~{thread}"
    # the thread is untouched and still bob's; an admin key sees it
    after = httpx.get(f"{url}/threads/{thread}", headers=bearer(BOB)).json()
    assert len(after["values"]["messages"]) == 4
    assert httpx.get(f"{url}/threads/{thread}", headers=bearer(ROOT)).status_code == 200


def test_a_keys_own_threads_are_listed(keyed: Server) -> None:
    h = bearer(ALICE)
    mine = httpx.post(
        f"{keyed.url}/threads", json={"metadata": {"who": "alice"}}, headers=h
    ).json()["thread_id"]
    listed = httpx.post(f"{keyed.url}/threads/search", json={"limit": 100}, headers=h).json()
    assert mine in [t["thread_id"] for t in listed]
    assert all(t["metadata"].get("who") != "bob" for t in listed)
    others = httpx.post(
        f"{keyed.url}/threads/search", json={"limit": 100}, headers=bearer(BOB)
    ).json()
    assert mine not in [t["thread_id"] for t in others]


# -- limits -----------------------------------------------------------------------------------
def test_body_over_the_limit_is_413(keyed: Server) -> None:
    big = {"assistant_id": "calc", "input": "x" * (1 << 20)}
    r = httpx.post(f"{keyed.url}/threads/t1/runs", json=big, headers=bearer(BOB))
    assert r.status_code == 413 and error_of(r)["type"] == "PayloadTooLarge"

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"model": "calc", "messages": [{"role": "user", "content": "'
        for _ in range(80):
            yield b"y" * 16384
        yield b'"}]}'

    r = httpx.post(
        f"{keyed.url}/v1/chat/completions",
        content=chunks(),
        headers={**bearer(BOB), "Content-Type": "application/json"},
    )
    assert r.status_code == 413 and "--max-body" in error_of(r)["message"]


def test_runs_past_the_per_key_limit_are_429(keyed: Server) -> None:
    url, h = keyed.url, bearer(ALICE)
    body = {
        "assistant_id": "slow",
        "input": {"messages": [{"role": "user", "content": "sleep 5"}]},
        "if_not_exists": "create",
    }
    started = []
    for i in range(2):
        r = httpx.post(f"{url}/threads/limit-{i}/runs", json=body, headers=h)
        assert r.status_code == 200, r.text
        started.append(r.json())
    r = httpx.post(f"{url}/threads/limit-2/runs", json=body, headers=h)
    assert r.status_code == 429 and "--max-concurrent-runs" in error_of(r)["message"]
    chat = {"model": "calc", "messages": [{"role": "user", "content": "add 1 2"}]}
    assert httpx.post(f"{url}/v1/chat/completions", json=chat, headers=h).status_code == 429
    # the limit is per key: bob runs meanwhile
    bobs = httpx.post(f"{url}/v1/chat/completions", json=chat, headers=bearer(BOB))
    assert bobs.status_code == 200
    for run in started:
        path = f"/threads/{run['thread_id']}/runs/{run['run_id']}/cancel?wait=1"
        assert httpx.post(url + path, headers=h).status_code == 204
    assert httpx.post(f"{url}/v1/chat/completions", json=chat, headers=h).status_code == 200


def test_cors_only_for_the_allowed_origin(keyed: Server) -> None:
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    ok = httpx.options(f"{keyed.url}/v1/chat/completions", headers={**preflight, "Origin": ORIGIN})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ORIGIN
    bad = httpx.options(
        f"{keyed.url}/v1/chat/completions", headers={**preflight, "Origin": "http://evil.example"}
    )
    assert "access-control-allow-origin" not in bad.headers


@pytest.mark.parametrize(
    "asked",
    [{"Access-Control-Request-Method": "PUT"}, {"Access-Control-Request-Headers": "x-evil"}],
)
def test_a_refused_preflight_answers_json(keyed: Server, asked: dict[str, str]) -> None:
    headers = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST", **asked}
    r = httpx.options(f"{keyed.url}/v1/chat/completions", headers=headers)
    assert r.status_code == 400
    err = error_of(r)
    assert err["type"] == "CORSRefused" and "Disallowed CORS" in err["message"]


def test_no_cors_by_default(server: Server) -> None:
    r = httpx.get(f"{server.url}/healthz", headers={"Origin": ORIGIN})
    assert "access-control-allow-origin" not in r.headers
    pre = httpx.options(
        f"{server.url}/v1/models",
        headers={"Origin": ORIGIN, "Access-Control-Request-Method": "GET"},
    )
    assert "access-control-allow-origin" not in pre.headers


# -- bad input answers JSON -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path", "content", "status"),
    [
        ("POST", "/threads", b"{not json", 422),
        ("POST", "/v1/chat/completions", b"[1, 2", 422),
        ("GET", "/no/such/path", None, 404),
        ("DELETE", "/v1/models", None, 405),
        ("GET", "/threads/nope", None, 404),
    ],
)
def test_bad_input_answers_json(
    keyed: Server, method: str, path: str, content: bytes | None, status: int
) -> None:
    headers = {**bearer(BOB), "Content-Type": "application/json"}
    r = httpx.request(method, keyed.url + path, content=content, headers=headers)
    assert r.status_code == status and error_of(r)["message"]


# -- access log -------------------------------------------------------------------------------
def test_access_log_lines_are_json(keyed: Server) -> None:
    rid = "req-test-1234"
    r = httpx.get(f"{keyed.url}/v1/models", headers={**bearer(BOB), "X-Request-ID": rid})
    assert r.headers["x-request-id"] == rid
    httpx.get(f"{keyed.url}/v1/models")  # a 401 is logged too
    log = Path(keyed.db).parent / "server.log"
    for _ in range(50):
        lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
        if any(x["request_id"] == rid for x in lines) and any(x["status"] == 401 for x in lines):
            break
        time.sleep(0.05)
    mine = next(x for x in lines if x["request_id"] == rid)
    assert mine["method"] == "GET" and mine["path"] == "/v1/models" and mine["status"] == 200
    assert mine["key"] == "bob" and mine["duration_ms"] >= 0
    assert any(x["status"] == 401 and x["key"] is None for x in lines)
    assert not [x for x in log.read_text().splitlines() if '"GET /v1/models' in x]  # uvicorn's off
    assert BOB not in log.read_text()


# -- binding ----------------------------------------------------------------------------------
def _serve(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp / "server_agents.py").write_text(AGENTS)
    base = {k: v for k, v in os.environ.items() if k != "LOOM_API_KEYS"}
    env = dict(base, PYTHONPATH=os.pathsep.join([SRC, str(tmp)]))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "loom",
            "serve",
            "--app",
            "server_agents:registry",
            "--store",
            str(tmp / "x.db"),
            "--port",
            str(free_port()),
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
        timeout=60,
    )


def test_refuses_a_public_interface_without_keys(tmp_path: Path) -> None:
    out = _serve(tmp_path, "--host", "0.0.0.0")
    assert out.returncode == 2
    assert "0.0.0.0" in out.stderr and "--keys" in out.stderr and "LOOM_API_KEYS" in out.stderr


@pytest.mark.parametrize(
    ("keys", "says"),
    [
        ("- {name: a, key: short}", "8 characters"),
        ("- {name: a, key: long-enough-1, key_sha256: abc}", "exactly one"),
        ("- {name: a, key: long-enough-1}\n- {name: a, key: long-enough-2}", "unique"),
        ("- {name: a, key: long-enough-1, color: red}", "unknown fields"),
        ("- {name: a/b, key: long-enough-1}", "a key name is"),  # part of session ids
        ("not: [a list", "YAML"),
    ],
)
def test_bad_key_files_are_refused(tmp_path: Path, keys: str, says: str) -> None:
    from loom.errors import ConfigurationError
    from loom.server.security import load_keys

    (tmp_path / "keys.yaml").write_text(keys)
    with pytest.raises(ConfigurationError, match=says):
        load_keys(tmp_path / "keys.yaml")


def test_keys_are_held_hashed(tmp_path: Path) -> None:
    from loom.server.security import load_keys

    (tmp_path / "keys.yaml").write_text(f"- {{name: a, key: {ALICE}}}")
    ring = load_keys(tmp_path / "keys.yaml", f" {ENV} ,, ")
    assert [p.name for p in ring.principals] == ["a", "env-1"]
    assert ring.match(ENV) is ring.principals[1] and ring.match("nope-nope") is None
    assert ALICE not in repr(ring.principals) and ALICE.encode() not in ring.principals[0].digest


def test_keys_for_unknown_agents_are_refused() -> None:
    from loom import Agent
    from loom.errors import ConfigurationError
    from loom.server import AgentRegistry, create_app
    from loom.server.app import server_runtime
    from loom.server.security import KeyRing, Principal, SecurityConfig
    from loom.store.memory import MemoryStore
    from loom.testing import FunctionModel

    registry = AgentRegistry([Agent(name="calc", model=FunctionModel(lambda m, t: "hi"))])
    principal = Principal("a", hashlib.sha256(b"k").digest(), frozenset({"nosuch"}))
    config = SecurityConfig(keys=KeyRing([principal]))
    with pytest.raises(ConfigurationError, match="nosuch"):
        create_app(registry, server_runtime(MemoryStore(), config), config)


async def test_thread_stream_websockets_need_the_key_and_the_thread(keyed: Server) -> None:
    """The WebSocket of thread streaming passes the same checks as HTTP: a key, and the
    thread of that key (a refusal is HTTP 403 on the handshake)."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    async with httpx.AsyncClient(base_url=keyed.url) as http:
        thread = (await http.post("/threads", json={}, headers=bearer(BOB))).json()["thread_id"]
    ws = keyed.url.replace("http://", "ws://") + f"/threads/{thread}/stream/events"
    for headers in ({}, bearer("nope"), bearer(ALICE)):  # no key, a wrong one, another's thread
        with pytest.raises(InvalidStatus) as refused:
            async with connect(ws, additional_headers=headers):
                pytest.fail(f"a WebSocket opened with {headers}")
        assert refused.value.response.status_code == 403
    subscribe = {"id": 1, "method": "subscription.subscribe", "params": {"channels": ["values"]}}
    async with connect(ws, additional_headers=bearer(BOB)) as socket:
        await socket.send(json.dumps(subscribe))
        answer = json.loads(await socket.recv())
    assert answer["type"] == "success" and answer["id"] == 1

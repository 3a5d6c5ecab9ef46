"""One owner model (issue #24), against a real ``loom serve`` with four API keys: every record a
client can name is its key's on every surface that names it, and ids are checked where they
enter.

Keys: ``alice`` and ``bob`` (every agent), ``carol`` (limited to ``calc``), ``root`` (admin).
Alice makes one record of each kind; bob and carol get 404 for each on every surface and
action, exactly as for an id that does not exist; root sees them all.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import httpx
import pytest
from tests.server.conftest import AGENTS, Server, start_server, stop_server

ALICE, BOB, CAROL, ROOT = "alice-key-0001", "bob-key-0002", "carol-key-0003", "root-key-0004"
MCP_ACCEPT = {"Accept": "application/json, text/event-stream"}
A2A = {"A2A-Version": "1.0"}

pytestmark = pytest.mark.timeout(180)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


@dataclass
class Records:
    """One record of each kind, all alice's."""

    thread: str
    run: str
    approval_thread: str
    approval_call: str
    stateless_run: str
    running_run: str
    running_thread: str
    cron: str
    monitor: str
    mcp_session: str
    error: str
    a2a_task: str


def _mcp_post(url: str, key: str, body: dict[str, Any], session: str | None) -> httpx.Response:
    headers = {**bearer(key), **MCP_ACCEPT}
    if session is not None:
        headers["Mcp-Session-Id"] = session
    return httpx.post(f"{url}/mcp", json=body, headers=headers, timeout=30)


def _mcp_result(r: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC message of an MCP answer (JSON, or the data of its SSE event)."""
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in r.text.splitlines() if line.startswith("data:")]
        found: dict[str, Any] = json.loads(data[-1])
        return found
    out: dict[str, Any] = r.json()
    return out


def _mcp_session(url: str, key: str) -> str:
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "ownership-test", "version": "1"},
        },
    }
    r = _mcp_post(url, key, init, None)
    assert r.status_code == 200, r.text
    sid = r.headers["mcp-session-id"]
    done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert _mcp_post(url, key, done, sid).status_code == 202
    return sid


def _tools_list(url: str, key: str, session: str) -> httpx.Response:
    return _mcp_post(url, key, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, session)


# an agent whose tool fails, so a run stores an error (its id: Error ID in the tool result)
BROKEN = r'''

@tool
def explode(target: str) -> str:
    """Always fails."""
    raise RuntimeError(f"cannot reach {target}")


def breaker(messages, tools):
    if messages[-1].role == "tool":
        return "it failed"
    return ModelResponse(tool_calls=[ToolCall(name="explode", arguments={"target": "db"})])


owned_registry = AgentRegistry([*slow_registry.values(),
                                Agent(name="broken", model=FunctionModel(breaker),
                                      tools=[explode])])
'''


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("owners")
    (tmp / "keys.yaml").write_text(
        f"- {{name: alice, key: {ALICE}}}\n"
        f"- {{name: bob, key: {BOB}}}\n"
        f"- {{name: carol, key: {CAROL}, agents: [calc]}}\n"
        f"- {{name: root, key: {ROOT}, admin: true}}\n"
    )
    srv = start_server(
        tmp,
        "--keys",
        str(tmp / "keys.yaml"),
        app="server_agents:owned_registry",
        source=AGENTS + BROKEN,
        env={"LOOM_SCHEDULE_POLL": "0.1"},
    )
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def records(keyed: Server) -> Iterator[Records]:
    url, a = keyed.url, bearer(ALICE)
    thread = httpx.post(f"{url}/threads", json={}, headers=a).json()["thread_id"]
    done = httpx.post(
        f"{url}/threads/{thread}/runs/wait",
        json={"assistant_id": "calc", "input": human("add 2 3")},
        headers=a,
    )
    assert done.status_code == 200, done.text
    run = done.headers["content-location"].rsplit("/", 1)[1]

    parked_thread = httpx.post(f"{url}/threads", json={}, headers=a).json()["thread_id"]
    parked = httpx.post(
        f"{url}/threads/{parked_thread}/runs/wait",
        json={"assistant_id": "ops", "input": human("ship")},
        headers=a,
    )
    assert parked.status_code == 200, parked.text
    pending = httpx.get(f"{url}/threads/{parked_thread}/approvals", headers=a).json()
    call = pending[0]["tool_call_id"]

    stateless = httpx.post(
        f"{url}/runs/wait",
        json={"agent_id": "calc", "messages": [{"role": "user", "content": "add 1 1"}]},
        headers=a,
    )
    assert stateless.status_code == 200, stateless.text
    stateless_run = stateless.json()["run"]["run_id"]

    running_thread = httpx.post(f"{url}/threads", json={}, headers=a).json()["thread_id"]
    started = httpx.post(
        f"{url}/threads/{running_thread}/runs",
        json={"assistant_id": "slow", "input": human("sleep 120")},
        headers=a,
    )
    assert started.status_code == 200, started.text
    running_run = started.json()["run_id"]

    cron = httpx.post(
        f"{url}/runs/crons",
        json={"assistant_id": "calc", "schedule": "0 0 1 1 *", "input": human("add 1 2")},
        headers=a,
    )
    assert cron.status_code == 200, cron.text
    monitor = httpx.post(f"{url}/monitors", json={"name": "nightly", "interval": 3600}, headers=a)
    assert monitor.status_code == 200, monitor.text
    broken = httpx.post(
        f"{url}/threads/{thread}/runs/wait",
        json={"assistant_id": "broken", "input": human("go")},
        headers=a,
    )
    assert broken.status_code == 200, broken.text
    with sqlite3.connect(keyed.db) as db:
        [(error,)] = db.execute("SELECT id FROM errors WHERE session_id = ?", (thread,)).fetchall()
    send = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {
            "message": {"messageId": "a1", "role": "ROLE_USER", "parts": [{"text": "add 2 3"}]}
        },
    }
    sent = httpx.post(f"{url}/agents/calc/a2a", json=send, headers={**a, **A2A}, timeout=30)
    assert "result" in sent.json(), sent.text
    yield Records(
        a2a_task=sent.json()["result"]["task"]["id"],
        error=error,
        thread=thread,
        run=run,
        approval_thread=parked_thread,
        approval_call=call,
        stateless_run=stateless_run,
        running_run=running_run,
        running_thread=running_thread,
        cron=cron.json()["cron_id"],
        monitor=monitor.json()["id"],
        mcp_session=_mcp_session(url, ALICE),
    )
    httpx.post(f"{url}/runs/{running_run}/cancel", headers=a)


# every surface that names a record of alice's, and every action on it: (kind, method, path,
# body). Paths name the record with {field} of Records.
SURFACES: list[tuple[str, str, str, dict[str, Any] | None]] = [
    ("thread", "GET", "/threads/{thread}", None),
    ("thread", "GET", "/threads/{thread}/state", None),
    ("thread", "POST", "/threads/{thread}/history", {}),
    ("thread", "GET", "/threads/{thread}/runs", None),
    ("thread", "PATCH", "/threads/{thread}", {"metadata": {"x": 1}}),
    ("thread", "DELETE", "/threads/{thread}", None),
    ("thread", "GET", "/v1/sessions/{thread}/events", None),
    ("thread", "GET", "/console/sessions/{thread}", None),
    ("thread", "GET", "/console/sessions/{thread}/live", None),
    ("error", "GET", "/errors/{error}", None),
    ("error", "GET", "/console/errors/{error}", None),
    ("run", "GET", "/threads/{thread}/runs/{run}", None),
    ("run", "GET", "/runs/{run}", None),
    ("run", "GET", "/runs/{run}/wait", None),
    ("run", "GET", "/runs/{run}/stream", None),
    ("run", "DELETE", "/runs/{run}", None),
    ("run", "GET", "/runs/{stateless_run}", None),
    ("run", "GET", "/runs/{stateless_run}/stream", None),
    ("run", "DELETE", "/runs/{stateless_run}", None),
    ("run", "POST", "/runs/{running_run}/cancel", None),
    ("run", "POST", "/threads/{running_thread}/runs/{running_run}/cancel", None),
    ("approval", "GET", "/threads/{approval_thread}/approvals", None),
    (
        "approval",
        "POST",
        "/threads/{approval_thread}/approvals/{approval_call}",
        {"decision": "approve"},
    ),
    (
        "approval",
        "POST",
        "/v1/weave:answer",
        {"session_id": "{approval_thread}", "call_id": "{approval_call}", "decision": "approve"},
    ),
    ("schedule", "PATCH", "/runs/crons/{cron}", {"enabled": False}),
    ("schedule", "DELETE", "/runs/crons/{cron}", None),
    ("schedule", "GET", "/runs/crons/{cron}/runs", None),
    ("schedule", "POST", "/monitors", {"name": "spy", "schedule_id": "{cron}"}),
    ("monitor", "GET", "/monitors/{monitor}", None),
    ("monitor", "POST", "/monitors/{monitor}/checkins", {"status": "error"}),
]


def _fill(value: Any, r: Records) -> Any:
    if isinstance(value, str):
        return value.format(**vars(r))
    if isinstance(value, dict):
        return {k: _fill(v, r) for k, v in value.items()}
    return value


@pytest.mark.parametrize("who", [BOB, CAROL], ids=["other-key", "agent-scoped-key"])
@pytest.mark.parametrize(
    ("kind", "method", "path", "body"), SURFACES, ids=[f"{m} {p}" for _, m, p, _ in SURFACES]
)
def test_another_keys_record_does_not_exist(
    keyed: Server,
    records: Records,
    who: str,
    kind: str,
    method: str,
    path: str,
    body: dict[str, Any] | None,
) -> None:
    r = httpx.request(
        method,
        keyed.url + _fill(path, records),
        json=_fill(body, records),
        headers=bearer(who),
        timeout=30,
    )
    assert r.status_code == 404, (kind, method, path, r.status_code, r.text)
    if path.startswith("/console"):  # the console answers a page, the APIs JSON
        return
    assert set(r.json()) == {"error"}
    # word for word the answer for ids nobody has: no key learns that another has one
    ghost = Records(**{name: f"ghost-{name}" for name in vars(records)})
    never = httpx.request(
        method,
        keyed.url + _fill(path, ghost),
        json=_fill(body, ghost),
        headers=bearer(who),
        timeout=30,
    )
    said = r.json()["error"]["message"]
    for name, value in vars(records).items():
        said = said.replace(value, getattr(ghost, name))
    assert (never.status_code, never.json()["error"]["type"]) == (404, r.json()["error"]["type"])
    assert said == never.json()["error"]["message"]


def test_the_owner_and_an_admin_still_see_every_record(keyed: Server, records: Records) -> None:
    """After every refusal above, alice's records are untouched and root reads them all."""
    for key in (ALICE, ROOT):
        h = bearer(key)
        for path in [
            f"/threads/{records.thread}",
            f"/threads/{records.thread}/runs/{records.run}",
            f"/runs/{records.run}",
            f"/runs/{records.stateless_run}",
            f"/runs/{records.running_run}",
            f"/threads/{records.approval_thread}/approvals",
            f"/runs/crons/{records.cron}/runs",
            f"/monitors/{records.monitor}",
            f"/console/sessions/{records.thread}",
            f"/console/errors/{records.error}",
            f"/errors/{records.error}",
        ]:
            r = httpx.get(keyed.url + path, headers=h, timeout=30)
            assert r.status_code == 200, (key, path, r.text)
        running = httpx.get(f"{keyed.url}/runs/{records.running_run}", headers=h).json()
        assert running["status"] in ("pending", "running")  # nobody else cancelled it
        monitor = httpx.get(f"{keyed.url}/monitors/{records.monitor}", headers=h).json()
        assert monitor["health"] == "new" and monitor["checkins"] == []
        crons = httpx.post(f"{keyed.url}/runs/crons/search", json={}, headers=h).json()
        assert [c["cron_id"] for c in crons if c["cron_id"] == records.cron] == [records.cron]
        assert [c["enabled"] for c in crons if c["cron_id"] == records.cron] == [True]
        pending = httpx.get(
            f"{keyed.url}/threads/{records.approval_thread}/approvals", headers=h
        ).json()
        assert [p["tool_call_id"] for p in pending] == [records.approval_call]
    assert _tools_list(keyed.url, ALICE, records.mcp_session).status_code == 200


@pytest.mark.parametrize("who", [BOB, CAROL], ids=["other-key", "agent-scoped-key"])
def test_listings_hold_only_the_keys_own_records(keyed: Server, records: Records, who: str) -> None:
    h, url = bearer(who), keyed.url
    runs = httpx.post(f"{url}/runs/search", json={"limit": 1000}, headers=h).json()
    assert {r["run_id"] for r in runs}.isdisjoint(
        {records.run, records.stateless_run, records.running_run}
    )
    by_thread = httpx.post(
        f"{url}/runs/search", json={"thread_id": records.thread}, headers=h
    ).json()
    assert by_thread == []
    crons = httpx.post(f"{url}/runs/crons/search", json={"limit": 1000}, headers=h).json()
    assert records.cron not in [c["cron_id"] for c in crons]
    assert httpx.post(f"{url}/runs/crons/count", json={}, headers=h).json() == len(crons)
    monitors = httpx.get(f"{url}/monitors", headers=h).json()
    assert records.monitor not in [m["id"] for m in monitors]
    errors = httpx.get(f"{url}/console/errors", headers=h)
    assert errors.status_code == 200 and records.error not in errors.text
    assert records.error in httpx.get(f"{url}/console/errors", headers=bearer(ROOT)).text
    admin_runs = httpx.post(f"{url}/runs/search", json={"limit": 1000}, headers=bearer(ROOT))
    assert {records.run, records.stateless_run} <= {r["run_id"] for r in admin_runs.json()}


def test_a_keys_own_schedule_and_monitor_are_its_own(keyed: Server) -> None:
    """Bob's own cron and monitor work for bob (and say whose they are); alice cannot see them."""
    url, h = keyed.url, bearer(BOB)
    cron = httpx.post(
        f"{url}/runs/crons",
        json={"assistant_id": "calc", "schedule": "0 0 1 1 *", "input": human("x")},
        headers=h,
    ).json()
    assert cron["user_id"] == "bob"
    r = httpx.patch(f"{url}/runs/crons/{cron['cron_id']}", json={"enabled": False}, headers=h)
    assert r.status_code == 200 and r.json()["enabled"] is False
    mon = httpx.post(
        f"{url}/monitors", json={"name": "mine", "schedule_id": cron["cron_id"]}, headers=h
    )
    assert mon.status_code == 200, mon.text
    checked = httpx.post(
        f"{url}/monitors/{mon.json()['id']}/checkins", json={"status": "ok"}, headers=h
    )
    assert checked.status_code == 200
    assert httpx.get(f"{url}/monitors/{mon.json()['id']}", headers=bearer(ALICE)).status_code == 404
    assert httpx.delete(f"{url}/runs/crons/{cron['cron_id']}", headers=h).status_code == 204


def test_an_mcp_session_is_the_key_that_made_it(keyed: Server, records: Records) -> None:
    url, sid = keyed.url, records.mcp_session
    unknown = _tools_list(url, BOB, "no-such-session")
    for who in (BOB, CAROL):
        used = _tools_list(url, who, sid)
        assert used.status_code == unknown.status_code == 404, used.text
        assert used.json() == unknown.json()  # the same answer as for a session never made
        deleted = httpx.delete(f"{url}/mcp", headers={**bearer(who), "Mcp-Session-Id": sid})
        assert deleted.status_code == 404
    assert _tools_list(url, ALICE, sid).status_code == 200  # still alice's, still open


def test_a_schedules_runs_write_sessions_its_key_reads(keyed: Server) -> None:
    """A tick of alice's schedule runs on a session that is alice's: she reads it, bob and
    carol do not (it used to be nobody's: only admin keys could read a schedule's runs)."""
    from loom.schedule import Schedule, ScheduleStore
    from loom.store import SQLiteStore

    async def add_and_wait() -> str:
        store = SQLiteStore(keyed.db)
        schedules = ScheduleStore(store)
        fast = Schedule(
            agent="calc",
            message="add 2 3",
            interval=0.5,
            id="alice-fast",
            session="per_run",
            principal="alice",
        )
        await schedules.add(fast)
        for _ in range(400):
            runs = await schedules.schedule_runs("alice-fast")
            if any(r.status == "finished" for r in runs):
                break
            await asyncio.sleep(0.05)
        await schedules.pause("alice-fast")
        await store.close()
        return next(str(r.session_id) for r in runs if r.status == "finished")

    session = asyncio.run(add_and_wait())
    path = f"{keyed.url}/threads/{quote(session, safe='')}/state"
    mine = httpx.get(path, headers=bearer(ALICE))
    assert mine.status_code == 200, mine.text
    assert mine.json()["values"]["messages"][-1]["content"] == "The sum is 5."
    for other in (BOB, CAROL):
        assert httpx.get(path, headers=bearer(other)).status_code == 404
    runs = httpx.get(f"{keyed.url}/runs/crons/alice-fast/runs", headers=bearer(ALICE))
    assert runs.status_code == 200 and runs.json()
    assert (
        httpx.get(f"{keyed.url}/runs/crons/alice-fast/runs", headers=bearer(BOB)).status_code == 404
    )


@pytest.mark.parametrize("method", ["GetTask", "CancelTask", "SubscribeToTask"])
def test_an_a2a_task_is_the_key_that_made_it(keyed: Server, records: Records, method: str) -> None:
    def call(key: str, task_id: str) -> dict[str, Any]:
        body = {"jsonrpc": "2.0", "id": 9, "method": method, "params": {"id": task_id}}
        r = httpx.post(
            f"{keyed.url}/agents/calc/a2a", json=body, headers={**bearer(key), **A2A}, timeout=30
        )
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            return _mcp_result(r)  # the first SSE message is as good as JSON here
        out: dict[str, Any] = r.json()
        return out

    never = call(BOB, "no-such-task")
    for who in (BOB, CAROL):
        answer = call(who, records.a2a_task)
        assert answer["error"]["code"] == never["error"]["code"] == -32001, answer
    if method == "GetTask":
        for who in (ALICE, ROOT):
            assert call(who, records.a2a_task)["result"]["id"] == records.a2a_task


def test_schedule_owner_column_is_migrated(keyed: Server) -> None:
    with sqlite3.connect(keyed.db) as db:
        names = [r[0] for r in db.execute("SELECT name FROM loom_migrations ORDER BY version")]
        cols = {r[1] for r in db.execute("PRAGMA table_info(schedules)")}
        owners = dict(db.execute("SELECT id, principal FROM schedules").fetchall())
    assert "0007_schedule_principals" in names and "principal" in cols
    assert set(owners.values()) >= {"alice"}


# -- session ids are per key -------------------------------------------------------------------
def _take(url: str, key: str, surface: str, sid: str) -> tuple[int, str]:
    """Run one turn on session ``sid`` over ``surface`` as ``key``: (status, stored id)."""
    h = bearer(key)
    msg = [{"role": "user", "content": f"hello from {key[:5]}"}]
    if surface == "threads":
        made = httpx.post(f"{url}/threads", json={"thread_id": sid}, headers=h)
        if made.status_code != 200:
            return made.status_code, ""
        r = httpx.post(
            f"{url}/threads/{quote(sid, safe='')}/runs/wait",
            json={"assistant_id": "calc", "input": {"messages": msg}},
            headers=h,
        )
        return r.status_code, made.json()["thread_id"]
    if surface == "chat":
        body = {"model": "calc", "messages": msg, "user": sid}
        r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=h)
    elif surface == "weave":
        body = {"agent": "calc", "message": msg[0]["content"], "session_id": sid}
        r = httpx.post(f"{url}/v1/weave", json=body, headers=h)
    else:  # mcp
        session = _mcp_session(url, key)
        call = {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "calc", "arguments": {"message": "hi", "session_id": sid}},
        }
        answer = _mcp_result(_mcp_post(url, key, call, session))
        stored = answer.get("result", {}).get("structuredContent", {}).get("session_id", "")
        return (200 if stored else 404), stored
    return r.status_code, unquote(r.headers.get("x-loom-session", ""))


@pytest.mark.parametrize("surface", ["threads", "chat", "weave", "mcp"])
def test_a_session_id_cannot_be_squatted_nor_probed(keyed: Server, surface: str) -> None:
    """Bob takes ``customer-43`` first; alice still gets a ``customer-43`` of her own, and
    neither learns that the other has one (it used to be 404 for alice, for ever)."""
    url, sid = keyed.url, f"customer-43-{surface}"
    status, bobs = _take(url, BOB, surface, sid)
    assert status == 200 and bobs, (status, bobs)
    status, alices = _take(url, ALICE, surface, sid)
    assert status == 200 and alices and alices != bobs, (status, alices, bobs)
    for key, mine, theirs in ((ALICE, alices, bobs), (BOB, bobs, alices)):
        h = bearer(key)
        # the client's own id and the stored one both name the key's own session
        for name in (sid, mine):
            r = httpx.get(f"{url}/threads/{quote(name, safe='')}/state", headers=h)
            texts = [m["content"] for m in r.json()["values"]["messages"]]
            assert texts[0] == f"hello from {key[:5]}" or texts[0] == "hi", texts
            assert len(texts) == 2, texts  # one turn: the other key's never landed here
        # the other key's stored id is answered exactly as an id nobody has
        probe = httpx.get(f"{url}/threads/{quote(theirs, safe='')}", headers=h)
        never = httpx.get(f"{url}/threads/never-made-{surface}", headers=h)
        assert probe.status_code == never.status_code == 404
        assert probe.json()["error"]["type"] == never.json()["error"]["type"]
    admin = httpx.post(f"{url}/threads/search", json={"limit": 100_000}, headers=bearer(ROOT))
    assert {bobs, alices} <= {t["thread_id"] for t in admin.json()}


def test_a_thread_cron_on_another_keys_thread_id_is_on_the_keys_own(
    keyed: Server, records: Records
) -> None:
    r = httpx.post(
        f"{keyed.url}/threads/{records.thread}/runs/crons",
        json={"assistant_id": "calc", "schedule": "0 0 1 1 *", "input": human("x")},
        headers=bearer(BOB),
    )
    assert r.status_code == 200 and r.json()["thread_id"] == f"bob~{records.thread}"
    alices = httpx.post(f"{keyed.url}/runs/crons/search", json={}, headers=bearer(ALICE)).json()
    assert r.json()["cron_id"] not in [c["cron_id"] for c in alices]


# -- ids where they enter -----------------------------------------------------------------------
BAD_IDS = {
    "empty": "",
    "control": "cust\x00omer",
    "escape": "\x1b[31mred",
    "newline": "a\nb",
    "10KB": "x" * 10_240,
}


def _thread_count(url: str) -> int:
    found = httpx.post(f"{url}/threads/search", json={"limit": 100_000}, headers=bearer(ROOT))
    return len(found.json())


def _fuzz_requests(bad: str) -> list[tuple[str, str, dict[str, Any]]]:
    msg = [{"role": "user", "content": "add 2 3"}]
    return [
        ("LangGraph POST /threads", "/threads", {"thread_id": bad}),
        (
            "LangGraph POST /runs/wait",
            "/runs/wait",
            {"assistant_id": "calc", "thread_id": bad, "input": human("add 2 3")},
        ),
        (
            "Agent Protocol POST /runs/wait",
            "/runs/wait",
            {"agent_id": "calc", "thread_id": bad, "messages": msg},
        ),
        (
            "OpenAI chat user",
            "/v1/chat/completions",
            {"model": "calc", "messages": msg, "user": bad},
        ),
        (
            "OpenAI chat metadata.session_id",
            "/v1/chat/completions",
            {"model": "calc", "messages": msg, "metadata": {"session_id": bad}},
        ),
        (
            "OpenAI responses user",
            "/v1/responses",
            {"model": "calc", "input": "add 2 3", "user": bad},
        ),
        ("Weave", "/v1/weave", {"agent": "calc", "message": "add 2 3", "session_id": bad}),
        (
            "Weave stream",
            "/v1/weave:stream",
            {"agent": "calc", "message": "add 2 3", "session_id": bad},
        ),
        (
            "Weave answer",
            "/v1/weave:answer",
            {"session_id": bad, "call_id": "c", "decision": "approve"},
        ),
    ]


@pytest.mark.parametrize("bad", list(BAD_IDS.values()), ids=list(BAD_IDS))
def test_a_bad_session_id_is_422_before_anything_runs(keyed: Server, bad: str) -> None:
    url, h = keyed.url, bearer(ALICE)
    before = _thread_count(url)
    for surface, path, body in _fuzz_requests(bad):
        r = httpx.post(url + path, json=body, headers=h, timeout=30)
        assert r.status_code == 422, (surface, r.status_code, r.text[:300])
        assert "session id" in r.text or "thread_id" in r.text, (surface, r.text[:300])
    if bad:  # an id in the path (an empty one names no thread: the route is another)
        named = quote(bad, safe="")
        run = {"assistant_id": "calc", "input": human("hi")}
        r = httpx.post(f"{url}/threads/{named}/runs/wait", json=run, headers=h)
        assert r.status_code == 422, (r.status_code, r.text[:300])
        r = httpx.get(f"{url}/v1/sessions/{named}/events", headers=h)
        assert r.status_code == 422, (r.status_code, r.text[:300])
    assert _thread_count(url) == before  # no session, no turn


@pytest.mark.parametrize("bad", list(BAD_IDS.values()), ids=list(BAD_IDS))
def test_a_bad_mcp_session_id_argument_is_refused_before_the_run(keyed: Server, bad: str) -> None:
    url = keyed.url
    before = _thread_count(url)
    sid = _mcp_session(url, ALICE)
    call = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/call",
        "params": {"name": "calc", "arguments": {"message": "add 2 3", "session_id": bad}},
    }
    answer = _mcp_result(_mcp_post(url, ALICE, call, sid))
    assert answer.get("error", {}).get("code") == -32602, answer
    assert "session_id" in answer["error"]["message"]
    assert _thread_count(url) == before


@pytest.mark.parametrize("bad", list(BAD_IDS.values()), ids=list(BAD_IDS))
def test_a_bad_agui_thread_or_a2a_context_id_is_refused_before_the_run(
    keyed: Server, bad: str
) -> None:
    url, h = keyed.url, bearer(ALICE)
    before = _thread_count(url)
    msg = {"id": "u1", "role": "user", "content": "add 2 3"}
    agui = {"threadId": bad, "runId": "r1", "messages": [msg], "state": {}, "tools": []}
    agui.update({"context": [], "forwardedProps": {}})
    r = httpx.post(f"{url}/agui/calc", json=agui, headers=h)
    assert r.status_code == 422 and "threadId" in r.text, (r.status_code, r.text[:300])
    send = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {
            "message": {
                "messageId": "m1",
                "role": "ROLE_USER",
                "contextId": bad,
                "parts": [{"text": "add 2 3"}],
            }
        },
    }
    a2a = httpx.post(
        f"{url}/agents/calc/a2a", json=send, headers={**h, "A2A-Version": "1.0"}, timeout=30
    )
    if bad:  # an empty contextId is no contextId: A2A starts a new context
        error = a2a.json().get("error", {})
        assert error.get("code") == -32602 and "contextId" in error["message"], a2a.text
        assert _thread_count(url) == before


def _turns_in(db: Path, session_end: str) -> list[tuple[str, int]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "SELECT session_id, COUNT(*) FROM messages WHERE session_id LIKE ? "
            "AND role = 'user' GROUP BY session_id",
            ("%" + session_end,),
        ).fetchall()


@pytest.mark.parametrize("surface", ["chat", "responses", "weave"])
def test_a_non_latin1_session_id_runs_once_and_answers(keyed: Server, surface: str) -> None:
    """``田中`` is a valid id: the turn runs once and the header carries it percent-encoded
    (it used to commit the turn, then fail with 500; the OpenAI SDK retried it twice)."""
    sid = f"田中-{surface}"
    if surface == "weave":
        r = httpx.post(
            f"{keyed.url}/v1/weave",
            json={"agent": "calc", "message": "add 2 3", "session_id": sid},
            headers=bearer(ALICE),
        )
        assert r.status_code == 200, r.text
        header = r.headers["x-loom-session"]
    else:
        openai = pytest.importorskip("openai")
        client = openai.OpenAI(base_url=f"{keyed.url}/v1", api_key=ALICE)
        if surface == "chat":
            raw = client.chat.completions.with_raw_response.create(
                model="calc", messages=[{"role": "user", "content": "add 2 3"}], user=sid
            )
            assert raw.parse().choices[0].message.content == "The sum is 5."
        else:
            raw = client.responses.with_raw_response.create(model="calc", input="add 2 3", user=sid)
            assert raw.parse().output_text == "The sum is 5."
        header = raw.headers["x-loom-session"]
    assert header.isascii() and unquote(header).endswith(sid)
    turns = _turns_in(keyed.db, sid)
    assert [n for _, n in turns] == [1], turns  # one turn, not three

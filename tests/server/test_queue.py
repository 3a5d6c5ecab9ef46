"""``loom serve --queue``: background runs executed by a `loom worker`, read, streamed, rejoined
and cancelled through any server.

Real processes on the private PostgreSQL cluster: two servers (A and B) and one worker, all
on one database; the client is ``langgraph-sdk``. The ``gate`` agent's tool waits for a file
the test creates, so the test orders the run by what it has seen, not by time.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from tests.server.conftest import SRC, Server, start_server, stop_server

pytest.importorskip("langgraph_sdk")
pytest.importorskip("procrastinate", reason="the postgres extra is not installed")
from langgraph_sdk import get_client
from langgraph_sdk.errors import ConflictError

AGENTS = '''
"""The queue tests' agent: "wait NAME" calls a tool that waits for the file GATE/NAME."""

import asyncio
import os

from loom import Agent, ModelResponse, ToolCall, tool
from loom.server import AgentRegistry
from loom.testing import FunctionModel

GATE = os.environ["LOOM_GATE_DIR"]


@tool(effect="idempotent")
async def wait_gate(name: str) -> str:
    """Wait until the test opens the gate NAME."""
    mark = os.path.join(GATE, f"ran-{name}")
    with open(mark + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(mark + ".tmp", mark)  # whole when it appears: the test reads it at once
    while not os.path.exists(os.path.join(GATE, name)):  # the test's condition, not a timer
        await asyncio.sleep(0.02)
    with open(os.path.join(GATE, f"done-{name}"), "w") as f:
        f.write(str(os.getpid()))
    return f"{name} open"


def gate(messages, tools):
    last = messages[-1]
    if last.role == "tool":
        return f"passed: {last.content}"
    words = last.content.split()
    if words[:1] == ["wait"]:
        return ModelResponse(tool_calls=[ToolCall(name="wait_gate", arguments={"name": words[1]})])
    return f"echo: {last.content}"


registry = AgentRegistry([Agent(name="gate", model=FunctionModel(gate), tools=[wait_gate])])
'''

MODES = ["values", "updates", "events"]


@dataclass
class Deployment:
    a: Server
    b: Server
    worker: subprocess.Popen[bytes]
    gate: Path
    start_worker: Callable[[], subprocess.Popen[bytes]]
    store: str = ""  # the servers' --store URL


def pg_url(dsn: str) -> str:
    """A key=value DSN of the test cluster as the postgres:// URL ``--store`` takes."""
    from psycopg.conninfo import conninfo_to_dict

    d = conninfo_to_dict(dsn)
    url = f"postgresql://{d['user']}@{d['host']}:{d['port']}/{d['dbname']}"
    return url + (f"?options={quote(str(d['options']))}" if d.get("options") else "")


@pytest.fixture(scope="module")
def deployment(postgres_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    import secrets

    import psycopg

    schema = f"q_{secrets.token_hex(6)}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    url = pg_url(f"{postgres_dsn} options='-c search_path={schema}'")
    root = tmp_path_factory.mktemp("queue")
    gate = root / "gate"
    gate.mkdir()
    env = {"LOOM_GATE_DIR": str(gate)}
    dirs = [root / n for n in ("a", "b", "w")]
    for d in dirs:
        d.mkdir()
    a = start_server(
        dirs[0], "--queue", app="queue_agents:registry", source=AGENTS, env=env, store=url
    )
    b = start_server(
        dirs[1], "--queue", app="queue_agents:registry", source=AGENTS, env=env, store=url
    )
    (dirs[2] / "queue_agents.py").write_text(AGENTS)
    workers: list[subprocess.Popen[bytes]] = []

    def start_worker() -> subprocess.Popen[bytes]:
        log = (dirs[2] / f"worker{len(workers)}.log").open("wb")
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "loom",
                "worker",
                "--store",
                url,
                "--app",
                "queue_agents:registry",
                "--concurrency",
                "2",
                "--heartbeat",
                "0.5",
                "--stalled-after",
                "2",
                "--lease-ttl",
                "2",
            ],
            env={**os.environ, **env, "PYTHONPATH": os.pathsep.join([SRC, str(dirs[2])])},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=dirs[2],
        )
        log.close()
        workers.append(worker)
        return worker

    try:
        yield Deployment(a, b, start_worker(), gate, start_worker, url)
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            try:
                worker.wait(15)
            except subprocess.TimeoutExpired:
                worker.kill()
        stop_server(a)
        stop_server(b)


def ask(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def last_text(values: dict[str, Any]) -> str:
    return str(values["messages"][-1]["content"])


async def until(path: Path, within: float = 30) -> None:
    """Until ``path`` exists (the worker's tool reached a point), at most ``within`` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while not await asyncio.to_thread(path.exists):
        if loop.time() > end:
            raise AssertionError(f"{path.name} did not appear in {within} s")
        await asyncio.sleep(0.02)


async def test_a_background_run_made_on_a_runs_on_the_worker_and_reads_from_b(
    deployment: Deployment,
) -> None:
    a, b = get_client(url=deployment.a.url), get_client(url=deployment.b.url)
    tid = (await a.threads.create())["thread_id"]
    (deployment.gate / "g1").touch()  # open already: the run goes straight through
    run = await a.runs.create(tid, "gate", input=ask("wait g1"))
    assert run["status"] == "pending"
    values = await asyncio.wait_for(b.runs.join(tid, run["run_id"]), 60)
    assert last_text(values) == "passed: g1 open"
    for client in (a, b):
        got = await client.runs.get(tid, run["run_id"])
        assert got["status"] == "success" and got["stop_reason"] == "completed"
    # the worker ran the tool, neither server did
    assert (deployment.gate / "ran-g1").read_text() == str(deployment.worker.pid)
    assert deployment.worker.pid not in (deployment.a.process.pid, deployment.b.process.pid)
    # the run's journal id is the one the client was given
    runs = await b.runs.list(tid)
    assert [r["run_id"] for r in runs] == [run["run_id"]]


async def test_stream_the_workers_run_live_from_a_then_rejoin_on_b(
    deployment: Deployment,
) -> None:
    a, b = get_client(url=deployment.a.url), get_client(url=deployment.b.url)
    tid = (await a.threads.create())["thread_id"]
    run = await a.runs.create(tid, "gate", input=ask("wait g2"), stream_mode=MODES)
    run_id = run["run_id"]
    seen = []
    stream = a.runs.join_stream(tid, run_id, stream_mode=MODES)
    async for part in stream:
        seen.append(part)
        if part.event == "events" and part.data["type"] == "tool_execution_start":
            break
    await stream.aclose()  # the client drops, mid-run
    # live: these frames came while the tool still waits for the gate
    assert not (deployment.gate / "done-g2").exists()
    assert (await b.runs.get(tid, run_id))["status"] == "running"
    (deployment.gate / "g2").touch()
    rest = [
        p
        async for p in b.runs.join_stream(tid, run_id, stream_mode=MODES, last_event_id=seen[-1].id)
    ]
    assert rest[-1].event == "end" and rest[-1].data["status"] == "success"
    whole = [p async for p in a.runs.join_stream(tid, run_id, stream_mode=MODES)]
    ids = [p.id for p in seen[1:]] + [p.id for p in rest[:-1]]
    assert ids == [p.id for p in whole[1:-1]]  # no gap, no duplicate, same order
    # frames without an id (deltas, lifecycle events) keep the last id (SSE's last event id)
    steps = [i for n, i in enumerate(ids) if n == 0 or i != ids[n - 1]]
    assert len(set(steps)) == len(steps)  # each journaled frame once
    assert [p.data for p in seen[1:] + rest] == [p.data for p in whole[1:]]
    assert last_text([p.data for p in rest if p.event == "values"][-1]) == "passed: g2 open"


async def test_cancel_on_b_aborts_the_run_on_the_worker(deployment: Deployment) -> None:
    a, b = get_client(url=deployment.a.url), get_client(url=deployment.b.url)
    tid = (await a.threads.create())["thread_id"]
    run = await a.runs.create(tid, "gate", input=ask("wait g3"))
    await until(deployment.gate / "ran-g3")  # the tool runs on the worker
    await asyncio.wait_for(b.runs.cancel(tid, run["run_id"], wait=True), 60)
    for client in (b, a):
        got = await client.runs.get(tid, run["run_id"])
        assert got["status"] == "interrupted" and got["stop_reason"] == "cancelled"
        assert got["error"].startswith("aborted through the queue (job ")
    assert not (deployment.gate / "done-g3").exists()
    state = await b.threads.get_state(tid)
    assert not last_text(state["values"]).startswith("passed")
    # the session is free again: the next run goes through
    (deployment.gate / "g3b").touch()
    nxt = await b.runs.create(tid, "gate", input=ask("wait g3b"))
    assert last_text(await a.runs.join(tid, nxt["run_id"])) == "passed: g3b open"


async def test_a_client_that_goes_with_cancel_on_disconnect_aborts_the_job(
    deployment: Deployment,
) -> None:
    a, b = get_client(url=deployment.a.url), get_client(url=deployment.b.url)
    tid = (await a.threads.create())["thread_id"]
    run = await a.runs.create(tid, "gate", input=ask("wait g5"))
    stream = b.runs.join_stream(tid, run["run_id"], stream_mode="events", cancel_on_disconnect=True)
    async for part in stream:
        if part.event == "events" and part.data["type"] == "tool_execution_start":
            break
    await stream.aclose()
    await asyncio.wait_for(a.runs.join(tid, run["run_id"]), 60)
    got = await a.runs.get(tid, run["run_id"])
    assert got["status"] == "interrupted" and got["stop_reason"] == "cancelled"
    assert not (deployment.gate / "done-g5").exists()


async def test_reject_refuses_a_second_run_while_the_worker_runs_one(
    deployment: Deployment,
) -> None:
    a, b = get_client(url=deployment.a.url), get_client(url=deployment.b.url)
    tid = (await a.threads.create())["thread_id"]
    run = await a.runs.create(tid, "gate", input=ask("wait g4"))
    await until(deployment.gate / "ran-g4")
    with pytest.raises(ConflictError):
        await b.runs.create(tid, "gate", input=ask("hi"), multitask_strategy="reject")
    queued = await b.runs.create(tid, "gate", input=ask("after"), multitask_strategy="enqueue")
    (deployment.gate / "g4").touch()
    assert last_text(await a.runs.join(tid, queued["run_id"])) == "echo: after"
    first = await b.runs.get(tid, run["run_id"])
    assert first["status"] == "success"  # the enqueued one waited for it


async def test_a_run_whose_worker_dies_is_retried_and_streams_on_without_reused_ids(
    deployment: Deployment,
) -> None:
    a, b = get_client(url=deployment.a.url), get_client(url=deployment.b.url)
    tid = (await a.threads.create())["thread_id"]
    run = await a.runs.create(tid, "gate", input=ask("wait g6"), stream_mode=MODES)
    run_id = run["run_id"]
    seen = []
    stream = a.runs.join_stream(tid, run_id, stream_mode=MODES)
    async for part in stream:
        seen.append(part)
        if part.event == "events" and part.data["type"] == "tool_execution_start":
            break
    await stream.aclose()
    first = deployment.worker
    # TOOL_EXECUTION_START is committed before the tool runs: wait for the tool itself
    await until(deployment.gate / "ran-g6")
    assert (deployment.gate / "ran-g6").read_text() == str(first.pid)
    first.send_signal(signal.SIGKILL)  # the worker dies mid-tool
    first.wait(10)
    second = deployment.start_worker()
    deployment.worker = second
    (deployment.gate / "g6").touch()
    rest = [
        p
        async for p in b.runs.join_stream(tid, run_id, stream_mode=MODES, last_event_id=seen[-1].id)
    ]
    assert rest[-1].event == "end" and rest[-1].data["status"] == "success"
    assert (deployment.gate / "done-g6").read_text() == str(second.pid)  # re-run: idempotent
    runs = {e.data["run_id"] for e in rest if e.event == "events"}
    assert runs == {f"{run_id}-a2"}  # the retry's run, named after the client's
    whole = [p async for p in a.runs.join_stream(tid, run_id, stream_mode=MODES)]
    ids = [p.id for p in seen[1:]] + [p.id for p in rest[:-1]]
    assert ids == [p.id for p in whole[1:-1]]
    steps = [i for n, i in enumerate(ids) if n == 0 or i != ids[n - 1]]  # id-less: last id kept
    assert len(set(steps)) == len(steps)  # no id of the dead attempt reused by the retry
    assert (await b.runs.get(tid, run_id))["status"] == "success"


def test_queue_without_a_postgres_store_is_refused(tmp_path: Path) -> None:
    (tmp_path / "queue_agents.py").write_text(AGENTS)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "loom",
            "serve",
            "--app",
            "queue_agents:registry",
            "--queue",
            "--store",
            str(tmp_path / "x.db"),
        ],
        env={
            **os.environ,
            "LOOM_GATE_DIR": str(tmp_path),
            "PYTHONPATH": os.pathsep.join([SRC, str(tmp_path)]),
        },
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert "--queue needs a PostgreSQL store" in done.stderr + done.stdout


async def test_a_commit_wakes_a_tail_by_notify_not_by_poll(pg_schema_dsn: str) -> None:
    from loom.events import AgentStart
    from loom.server.queued import RunQueue
    from loom.store.postgres import PostgresStore

    queue = RunQueue(pg_url(pg_schema_dsn), mode="notify", poll=120)
    store = PostgresStore(pg_schema_dsn)
    await queue.open()
    try:
        await asyncio.wait_for(queue.listening.wait(), 10)
        await store.create_session("s-notify")
        with queue.watch("s-notify") as wake, queue.watch("s-other") as other:
            await store.append("s-notify", events=[AgentStart(run_id="r1", session_id="s-notify")])
            await asyncio.wait_for(wake.wait(), 10)  # the poll would take 120 s
            assert not other.is_set()  # only the session's watchers wake
    finally:
        await queue.close()
        await store.close()


async def test_queued_runs_acknowledged_survive_a_kill_9_of_their_server_right_after(
    deployment: Deployment, tmp_path: Path
) -> None:
    """A ``--queue`` server SIGKILLed 0 ms after acknowledging background runs: each
    acknowledged run is a job already, a worker runs it once, any server answers for it."""
    import httpx

    env = {"LOOM_GATE_DIR": str(deployment.gate)}
    c = start_server(
        tmp_path,
        "--queue",
        app="queue_agents:registry",
        source=AGENTS,
        env=env,
        store=deployment.store,
    )
    acked: list[tuple[str, str, str]] = []
    try:
        async with httpx.AsyncClient(base_url=c.url, timeout=10) as http:
            tids = [(await http.post("/threads", json={})).json()["thread_id"] for _ in range(4)]

            async def send(tid: str, name: str) -> None:
                try:
                    r = await http.post(
                        f"/threads/{tid}/runs",
                        json={"assistant_id": "gate", "input": ask(f"wait {name}")},
                    )
                except httpx.HTTPError:
                    return
                if r.status_code == 200 and c.process.poll() is None:
                    acked.append((tid, r.json()["run_id"], name))
                    c.process.send_signal(signal.SIGKILL)  # 0 ms after this acknowledgement

            await asyncio.gather(*(send(t, f"k{i}") for i, t in enumerate(tids)))
    finally:
        c.process.send_signal(signal.SIGKILL)
        c.process.wait(10)
    assert acked
    for _, _, name in acked:
        (deployment.gate / name).touch()
    b = get_client(url=deployment.b.url)
    for tid, run_id, name in acked:
        values = await asyncio.wait_for(b.runs.join(tid, run_id), 60)
        assert last_text(values) == f"passed: {name} open"
        assert (await b.runs.get(tid, run_id))["status"] == "success"
        humans = [m for m in values["messages"] if m["type"] == "human"]
        assert [m["content"] for m in humans] == [f"wait {name}"]  # sent once

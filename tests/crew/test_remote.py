"""Remote (A2A) crew members against one real ``loom serve`` (FunctionModel agents served over
A2A): the crew runs locally with scripted members and sends the remote member's message over
A2A — sequential local -> remote, parallel local + remote, a loop continuing the remote
conversation, a manager delegating to a remote worker that stops at input-required, a timeout
and a cancel that cancel the remote task, an unreachable URL and a bad card as recorded
failures, the budget rules, and the crew file form."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.server.conftest import Server, free_port, start_server, stop_server

pytest.importorskip("a2a.client")

from a2a.client import ClientConfig, create_client
from a2a.types.a2a_pb2 import ListTasksRequest, TaskState

from loom import Agent, ModelResponse, ToolCall
from loom.crew import (
    Budget,
    Crew,
    Loop,
    Manager,
    Parallel,
    RemoteAgent,
    Sequential,
    Step,
    a2a_member,
)
from loom.errors import CrewDefinitionError, RemoteMemberError
from loom.events import CrewMemberFinish, CrewMemberStart
from loom.messages import Message, ToolSpec
from loom.testing import FunctionModel, ScriptedModel

KEY = "crew-remote-key-01"
AUTH = {"Authorization": f"Bearer {KEY}"}

REMOTE_AGENTS = '''
import asyncio
from pathlib import Path

from loom import Agent, ModelResponse, ToolCall, tool
from loom.server import AgentRegistry
from loom.testing import FunctionModel


def echo(messages, tools):
    heard = sum(1 for m in messages if m.role == "user")  # the remote conversation so far
    return f"remote heard {heard}: {messages[-1].content}"


@tool
def deploy(target: str) -> str:
    """Deploy to a target (needs approval)."""
    return f"deployed {target}"


def ops(messages, tools):
    last = messages[-1]
    if last.role == "tool":
        return f"done: {last.content}"
    return ModelResponse(tool_calls=[ToolCall(name="deploy", arguments={"target": "prod"})])


@tool
async def wait_for(name: str) -> str:
    """Wait until the file NAME exists in the server's directory."""
    path = Path(name)
    while not path.exists():
        await asyncio.sleep(0.02)
    return path.read_text()


def waiter(messages, tools):
    last = messages[-1]
    if last.role == "tool":
        return f"released: {last.content}"
    return ModelResponse(
        tool_calls=[ToolCall(name="wait_for", arguments={"name": last.content.split()[-1]})]
    )


registry = AgentRegistry([
    Agent(name="echo", instructions="Echo.", model=FunctionModel(echo)),
    Agent(name="ops", instructions="Deploy.", model=FunctionModel(ops), tools=[deploy],
          permissions={"ask": ["deploy"]}),
    Agent(name="waiter", instructions="Wait.", model=FunctionModel(waiter), tools=[wait_for]),
])
'''


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    where = tmp_path_factory.mktemp("crew_remote")
    server = start_server(
        where, app="remote_agents:registry", source=REMOTE_AGENTS, env={"LOOM_API_KEYS": KEY}
    )
    yield server, where
    stop_server(server)


async def remote_tasks(server: Server, agent: str) -> list[Any]:
    async with httpx.AsyncClient(headers=AUTH, timeout=30) as http:
        client = await create_client(
            f"{server.url}/agents/{agent}",
            ClientConfig(httpx_client=http),
            resolver_http_kwargs={"headers": AUTH},
        )
        return list((await client.list_tasks(ListTasksRequest())).tasks)


def member(server: Server, agent: str, **kw: Any) -> RemoteAgent:
    return RemoteAgent(f"{server.url}/agents/{agent}", headers=AUTH, **kw)


def scripted(name: str, *answers: str | ModelResponse) -> Agent:
    return Agent(name=name, model=ScriptedModel(list(answers)))


async def crew_events(crew: Crew, session_id: str) -> list[Any]:
    return list(await crew.runtime.store.load_events(session_id))


# -- modes ---------------------------------------------------------------------------------------
async def test_sequential_local_then_remote_records_the_remote_task(
    remote: tuple[Server, Path], tmp_path: Path
) -> None:
    server, _ = remote
    crew = Crew(
        "blog",
        members={
            "researcher": scripted("researcher", "facts: tides"),
            "writer": member(server, "echo"),
        },
        plan=Sequential("researcher", Step("writer", task="Write from: {input}")),
        store=str(tmp_path / "crew.db"),
    )

    res = await crew.run("tide pools", session_id="s1")

    assert res.stop_reason == "completed", res.error
    assert res.output == "remote heard 1: Write from: facts: tides"
    writer = res.members[1]
    assert writer.path == "blog/writer" and writer.stop_reason == "completed"
    assert writer.usage.total_tokens == 0  # unknown for a remote member
    [task] = [t for t in await remote_tasks(server, "echo") if t.id == writer.remote["task_id"]]
    assert task.context_id == writer.remote["context_id"]
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    # the journal (read back from SQLite) says what was sent and which remote task answered
    events = await crew_events(crew, "s1")
    start = [e for e in events if isinstance(e, CrewMemberStart) and e.path == "blog/writer"]
    finish = [e for e in events if isinstance(e, CrewMemberFinish) and e.path == "blog/writer"]
    assert start[0].context == "Write from: facts: tides"
    assert start[0].extra["a2a"]["url"] == f"{server.url}/agents/echo"
    assert finish[0].stop_reason == "completed"
    assert finish[0].child_run_id == task.id
    assert finish[0].extra["a2a"] == {
        "url": f"{server.url}/agents/echo",
        "task_id": task.id,
        "context_id": task.context_id,
        "state": "completed",
    }


async def test_parallel_local_and_remote_in_declared_order(remote: tuple[Server, Path]) -> None:
    server, _ = remote
    crew = Crew(
        "p",
        members={
            "local": scripted("local", "local says hi"),
            "far": a2a_member(f"{server.url}/agents/echo", headers=AUTH),
        },
        plan=Parallel("local", "far"),
    )

    res = await crew.run("hello")

    assert res.stop_reason == "completed", res.error
    assert res.output == "## local\nlocal says hi\n\n## far\nremote heard 1: hello"


async def test_a_loop_continues_one_remote_conversation(remote: tuple[Server, Path]) -> None:
    server, _ = remote
    crew = Crew(
        "l", members={"far": member(server, "echo")}, plan=Loop(Step("far"), max_iterations=2)
    )

    res = await crew.run("draft")

    assert res.stop_reason == "completed", res.error
    first, second = res.members
    assert first.output == "remote heard 1: draft"
    assert second.output == "remote heard 2: remote heard 1: draft"  # the remote remembers
    assert first.remote["context_id"] == second.remote["context_id"] != ""
    assert first.remote["task_id"] != second.remote["task_id"]


async def test_a_manager_delegates_to_a_remote_worker_and_answers_its_question(
    remote: tuple[Server, Path],
) -> None:
    """The remote ``ops`` stops at input-required (its deploy needs approval): the manager reads
    that as the delegation's result, and its next delegation answers the waiting remote task."""
    server, _ = remote
    enums: list[list[str]] = []

    def manage(messages: list[Message], tools: list[ToolSpec]) -> str | ModelResponse:
        enums.append(tools[0].parameters["properties"]["member"]["enum"])
        last = messages[-1]
        if last.role != "tool":
            task = "deploy prod"
        elif "did not finish (awaiting_input)" in last.content:
            task = "approve"
        else:
            return f"manager: {last.content}"
        return ModelResponse(
            tool_calls=[ToolCall(name="delegate", arguments={"member": "ops", "task": task})]
        )

    lead = Agent(name="lead", model=FunctionModel(manage))
    crew = Crew(
        "team",
        members={"lead": lead, "ops": member(server, "ops")},
        plan=Manager("lead", workers=["ops"]),
    )

    res = await crew.run("ship it")

    assert res.stop_reason == "completed", res.error
    assert res.output == "manager: done: deployed prod"
    assert enums[0] == ["ops"]
    asked, answered = [m for m in res.members if m.member == "ops"]
    assert asked.stop_reason == "awaiting_input" and asked.remote["state"] == "input_required"
    assert "waiting for approval of deploy" in asked.output
    assert answered.stop_reason == "completed"
    assert answered.remote["task_id"] == asked.remote["task_id"]  # the same remote task resumed


# -- deadlines and cancellation ------------------------------------------------------------------
async def test_a_remote_member_past_its_timeout_is_a_timeout_and_its_task_is_cancelled(
    remote: tuple[Server, Path],
) -> None:
    server, where = remote
    crew = Crew("t", members={"slow": member(server, "waiter", timeout=1.0)}, plan="slow")

    res = await asyncio.wait_for(crew.run("wait for never-timeout.txt"), 30)

    assert res.stop_reason == "error"
    [slow] = res.members
    assert slow.stop_reason == "timeout" and "timeout=1 s" in (slow.error or "")
    [task] = [t for t in await remote_tasks(server, "waiter") if t.id == slow.remote["task_id"]]
    assert task.status.state == TaskState.TASK_STATE_CANCELED
    (where / "never-timeout.txt").write_text("late")


async def test_cancelling_the_crew_cancels_the_remote_task(remote: tuple[Server, Path]) -> None:
    server, where = remote
    plan = Sequential("local", Step("slow", task="wait for never-cancel.txt"))
    crew = Crew(
        "c",
        members={"local": scripted("local", "ready"), "slow": member(server, "waiter")},
        plan=plan,
    )
    before = {t.id for t in await remote_tasks(server, "waiter")}
    turn = await crew.runtime.start(crew, "go", session_id="cancel-1")
    job = asyncio.ensure_future(turn.run(lambda ev: None))
    # the condition: the remote task exists and is working (its tool waits for the file)
    deadline = time.monotonic() + 20
    while True:
        fresh = [t for t in await remote_tasks(server, "waiter") if t.id not in before]
        if fresh and fresh[0].status.state == TaskState.TASK_STATE_WORKING:
            break
        assert time.monotonic() < deadline, "the remote task never started"
        await asyncio.sleep(0.05)

    turn.cancel("stop")
    await asyncio.wait_for(job, 30)

    assert turn.result is not None and turn.result.stop_reason == "cancelled"
    [task] = [t for t in await remote_tasks(server, "waiter") if t.id == fresh[0].id]
    assert task.status.state == TaskState.TASK_STATE_CANCELED
    finish = [
        e
        for e in await crew_events(crew, "cancel-1")
        if isinstance(e, CrewMemberFinish) and e.path == "c/slow"
    ]
    assert finish[0].stop_reason == "cancelled"
    assert finish[0].extra["a2a"]["task_id"] == task.id
    (where / "never-cancel.txt").write_text("late")


# -- bad input -----------------------------------------------------------------------------------
async def test_an_unreachable_member_is_a_typed_error_and_a_recorded_failure() -> None:
    url = f"http://127.0.0.1:{free_port()}/agents/writer"  # nothing listens there
    with pytest.raises(RemoteMemberError, match="crew member 'writer'") as info:
        await RemoteAgent(url, connect_timeout=2).connect("writer")
    assert info.value.member == "writer" and info.value.url == url

    crew = Crew(
        "blog",
        members={
            "researcher": scripted("researcher", "facts"),
            "writer": RemoteAgent(url, connect_timeout=2),
        },
        plan=Sequential("researcher", "writer"),
    )
    res = await asyncio.wait_for(crew.run("go", session_id="down"), 30)

    assert res.stop_reason == "error"
    assert "blog/writer stopped with error" in (res.error or "")
    writer = res.members[1]
    assert writer.stop_reason == "error"
    assert "RemoteMemberError: crew member 'writer'" in (writer.error or "")
    finish = [e for e in await crew_events(crew, "down") if isinstance(e, CrewMemberFinish)]
    assert [f.stop_reason for f in finish] == ["completed", "error"]


async def test_a_url_without_an_agent_card_is_a_recorded_failure(
    remote: tuple[Server, Path],
) -> None:
    server, _ = remote
    crew = Crew("x", members={"ghost": member(server, "nosuch")}, plan="ghost")

    res = await crew.run("hello")

    assert res.stop_reason == "error"
    assert "RemoteMemberError: crew member 'ghost'" in (res.members[0].error or "")
    assert "cannot read its agent card" in (res.members[0].error or "")


def test_a_remote_member_cannot_be_a_manager() -> None:
    lead = RemoteAgent("http://127.0.0.1:1/agents/lead")
    with pytest.raises(CrewDefinitionError, match="remote") as info:
        Crew(
            "t",
            members={"lead": lead, "w": scripted("w", "x")},
            plan=Manager("lead", workers=["w"]),
        )
    assert info.value.field == "plan.manager.manager"


# -- budgets -------------------------------------------------------------------------------------
async def test_remote_members_count_as_spawns_and_fan_out_and_a_cost_budget_refuses_them(
    remote: tuple[Server, Path],
) -> None:
    server, _ = remote
    before = len(await remote_tasks(server, "echo"))

    def crew(plan: Any, budget: Budget) -> Crew:
        return Crew(
            "b",
            members={"local": scripted("local", "l1", "l2"), "far": member(server, "echo")},
            plan=plan,
            budget=budget,
        )

    spawns = await crew(Sequential("local", "far"), Budget(max_spawns=1)).run("go")
    fan = await crew(Parallel("local", "far"), Budget(max_fan_out=1)).run("go")
    cost = await crew(
        Sequential("local", "far"), Budget(cost_usd=5.0, prices={"*": (1.0, 1.0)})
    ).run("go")

    assert (spawns.stop_reason, spawns.budget) == ("budget", "spawns")
    assert (fan.stop_reason, fan.budget) == ("budget", "fan_out")
    assert (cost.stop_reason, cost.budget) == ("budget", "cost_usd")
    assert "cannot report its cost" in (cost.error or "")
    assert len(await remote_tasks(server, "echo")) == before  # the remote was never asked

    tokens = await crew(Sequential("local", "far"), Budget(tokens=10_000)).run("go")
    assert tokens.stop_reason == "completed", tokens.error
    assert any("tokens are unknown and not counted" in w for w in tokens.warnings)


# -- crew files ----------------------------------------------------------------------------------
async def test_a_crew_file_with_a_remote_member(
    remote: tuple[Server, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, _ = remote
    file = tmp_path / "crew.yaml"
    file.write_text(f"""
name: filed
members:
  far:
    a2a: {server.url}/agents/echo
    headers: {{Authorization: "Bearer ${{CREW_REMOTE_KEY}}"}}
    timeout: 30
plan: far
""")
    with pytest.raises(CrewDefinitionError) as info:
        Crew.from_file(file)  # the key is not in the environment yet
    assert info.value.field == "members.far.headers.Authorization"

    monkeypatch.setenv("CREW_REMOTE_KEY", KEY)
    crew = Crew.from_file(file)
    assert isinstance(crew.members["far"], RemoteAgent)
    res = await crew.run("from a file")
    assert res.stop_reason == "completed", res.error
    assert res.output == "remote heard 1: from a file"

    file.write_text("name: bad\nmembers: {far: {a2a: 'ftp://x'}}\nplan: far\n")
    with pytest.raises(CrewDefinitionError) as info:
        Crew.from_file(file)
    assert info.value.field == "members.far.a2a"

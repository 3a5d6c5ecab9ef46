"""A crew served by a real ``loom serve`` (``--app`` registry with a crew), driven by the real
``langgraph-sdk`` client and the OpenAI client: streams tagged with member paths, a thread that
is the crew session, approvals inside a member surfacing as interrupts that resume that member."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.server.conftest import Server, start_server, stop_server

pytest.importorskip("langgraph_sdk")
from langgraph_sdk import get_client

CREWS = r'''
"""A registry with two crews of test-model members."""

from loom import Agent, ModelResponse, ToolCall, tool
from loom.crew import Crew, Parallel, Sequential, Step
from loom.server import AgentRegistry
from loom.testing import FunctionModel


@tool
def deploy(target: str) -> str:
    """Deploy to a target (needs approval)."""
    return f"deployed {target}"


def researcher(messages, tools):
    return "notes on " + messages[-1].content


def writer(messages, tools):
    return "post from " + messages[-1].content


def shipper(messages, tools):
    last = messages[-1]
    if last.role == "tool":
        return f"shipped: {last.content}"
    return ModelResponse(tool_calls=[ToolCall(name="deploy", arguments={"target": "prod"})])


def echo(messages, tools):
    return "echo " + messages[-1].content


BLOG = Crew("blog", members={
    "researcher": Agent(name="researcher", model=FunctionModel(researcher)),
    "writer": Agent(name="writer", model=FunctionModel(writer)),
}, plan=Sequential("researcher", Step("writer", task="Write: {input}")))

RELEASE = Crew("release", members={
    "checker": Agent(name="checker", model=FunctionModel(echo)),
    "shipper": Agent(name="shipper", model=FunctionModel(shipper), tools=[deploy],
                     permissions={"ask": ["deploy"]}),
}, plan=Sequential("checker", Parallel("shipper", name="ship")))

registry = AgentRegistry([Agent(name="solo", model=FunctionModel(echo)), BLOG, RELEASE])
'''


@pytest.fixture(scope="module")
def crew_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("crews"), app="server_crews:registry", source=CREWS)
    yield srv
    stop_server(srv)


def _text(m: dict[str, Any]) -> str:
    return str(m["content"])


async def test_a_crew_is_an_assistant_and_streams_its_members_tagged_with_their_paths(
    crew_server: Server,
) -> None:
    client = get_client(url=crew_server.url)
    found = {a["assistant_id"]: a for a in await client.assistants.search(limit=10)}
    assert set(found) == {"solo", "blog", "release"}
    assert found["blog"]["metadata"]["crew"] is True
    assert found["blog"]["metadata"]["members"] == ["researcher", "writer"]

    thread = await client.threads.create()
    chunks = [
        c
        async for c in client.runs.stream(
            thread["thread_id"],
            "blog",
            input={"messages": [{"role": "user", "content": "tide pools"}]},
            stream_mode=["values", "updates", "messages-tuple", "events"],
        )
    ]

    by = lambda kind: [c.data for c in chunks if c.event == kind]  # noqa: E731
    updates = by("updates")
    members = [next(iter(u)) for u in updates if next(iter(u)).startswith("blog/")]
    assert members[0] == "blog/researcher" and members[-1] == "blog/writer"
    member_msgs = [
        u[k]["messages"][0]
        for u in updates
        for k in u
        if k.startswith("blog/") and "messages" in u[k]
    ]
    assert ("ai", "notes on tide pools") in [(m["type"], _text(m)) for m in member_msgs]
    finished = {k: v for u in updates for k, v in u.items() if "stop_reason" in v}
    answer = "post from Write: notes on tide pools"
    assert finished["blog/writer"] == {
        "stop_reason": "completed",
        "reused": False,
        "error": None,
        "output": answer,
    }
    tuples = by("messages")
    ai = [(msg, meta) for msg, meta in tuples if msg["type"] in ("ai", "AIMessageChunk")]
    said: dict[str, str] = {}  # member path -> its text, streamed chunk by chunk or whole
    for msg, meta in ai:
        said[meta["loom_member_path"]] = said.get(meta["loom_member_path"], "") + _text(msg)
        member = meta["loom_member_path"] != "blog"
        assert meta["langgraph_node"] == (meta["loom_member_path"] if member else "agent")
    assert said == {
        "blog/researcher": "notes on tide pools",
        "blog/writer": "post from Write: notes on tide pools",
        "blog": "post from Write: notes on tide pools",
    }
    events = by("events")
    paths = {e["data"].get("member_path") for e in events}
    assert paths == {"blog", "blog/researcher", "blog/writer"}
    member_events = [e for e in events if e["data"]["member_path"] != "blog"]
    crew_run = next(e["run_id"] for e in events if e["data"]["member_path"] == "blog")
    assert all(e["parent_run_id"] == crew_run for e in member_events)
    # the thread is the crew session: its values are the task and the crew's answer only
    final = by("values")[-1]["messages"]
    assert [(m["type"], _text(m)) for m in final] == [
        ("human", "tide pools"),
        ("ai", "post from Write: notes on tide pools"),
    ]
    state = await client.threads.get_state(thread["thread_id"])
    assert [_text(m) for m in state["values"]["messages"]] == [_text(m) for m in final]
    run = (await client.runs.list(thread["thread_id"]))[0]
    assert run["run_id"] == crew_run and run["status"] == "success"
    # frame ids are unique, so a client that reconnects with Last-Event-ID reads on
    # (an SSE client keeps the last id for a frame sent without one: the closing "end")
    ids = [c.id for c in chunks if getattr(c, "id", None) and c.event != "end"]
    assert len(ids) == len(set(ids))


async def test_wait_runs_a_crew_to_its_answer(crew_server: Server) -> None:
    client = get_client(url=crew_server.url)
    thread = await client.threads.create()
    task = {"messages": [{"role": "user", "content": "kelp"}]}
    values = await client.runs.wait(thread["thread_id"], "blog", input=task)
    assert isinstance(values, dict)
    assert _text(values["messages"][-1]) == "post from Write: notes on kelp"


async def test_a_members_approval_is_an_interrupt_with_its_path_and_resumes_that_member(
    crew_server: Server,
) -> None:
    client = get_client(url=crew_server.url)
    tid = (await client.threads.create())["thread_id"]
    task = {"messages": [{"role": "user", "content": "v1.2"}]}
    values = await client.runs.wait(tid, "release", input=task)
    assert isinstance(values, dict)
    [interrupt] = values["__interrupt__"]
    value = interrupt["value"]
    assert value["type"] == "approval_required" and value["tool_name"] == "deploy"
    assert value["member_path"] == "release/ship/shipper"
    assert value["approve_with"] == f"POST /threads/{tid}/approvals/{interrupt['id']}"
    thread = await client.threads.get(tid)
    assert thread["status"] == "interrupted"

    chunks = [
        c
        async for c in client.runs.stream(
            tid,
            "release",
            command={"resume": {interrupt["id"]: {"decision": "approve"}}},
            stream_mode=["values", "events"],
        )
    ]
    events = [c.data for c in chunks if c.event == "events"]
    reused = [e["data"] for e in events if e["type"] == "crew_member_finish"]
    assert [(r["path"], r["reused"]) for r in reused] == [
        ("release/checker", True),  # finished before the approval: not run again
        ("release/ship/shipper", False),
    ]
    tool_results = [e for e in events if e["type"] == "tool_result"]
    assert [e["data"]["member_path"] for e in tool_results] == ["release/ship/shipper"]
    final = [c.data for c in chunks if c.event == "values"][-1]
    assert "__interrupt__" not in final
    assert _text(final["messages"][-1]) == "## shipper\nshipped: deployed prod"
    assert (await client.threads.get(tid))["status"] == "idle"


async def test_an_unknown_call_id_is_refused_and_the_crew_stays_parked(crew_server: Server) -> None:
    import httpx

    client = get_client(url=crew_server.url)
    tid = (await client.threads.create())["thread_id"]
    await client.runs.wait(tid, "release", input={"messages": [{"role": "user", "content": "v2"}]})
    async with httpx.AsyncClient(base_url=crew_server.url) as http:
        resume = {"resume": {"nope": {"decision": "approve"}}}
        body = {"assistant_id": "release", "command": resume}
        r = await http.post(f"/threads/{tid}/runs/wait", json=body)
        assert r.status_code == 422 and "no pending call 'nope'" in r.json()["error"]["message"]
        pending = (await http.get(f"/threads/{tid}/approvals")).json()
    assert [p["member_path"] for p in pending] == ["release/ship/shipper"]


def test_openai_client_runs_a_crew_as_a_model(crew_server: Server) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{crew_server.url}/v1", api_key="none")
    assert {"solo", "blog", "release"} <= {m.id for m in client.models.list()}
    reply = client.chat.completions.create(
        model="blog", messages=[{"role": "user", "content": "reefs"}]
    )
    assert reply.choices[0].message.content == "post from Write: notes on reefs"
    stream = client.chat.completions.create(
        model="blog", messages=[{"role": "user", "content": "dunes"}], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "post from Write: notes on dunes"  # the crew's answer, not its members'


def test_agents_dir_serves_crew_files(tmp_path: Path) -> None:
    from loom.crew import Crew
    from loom.server import AgentRegistry

    (tmp_path / "helper.md").write_text("---\nname: helper\n---\nYou help.\n")
    (tmp_path / "team.yaml").write_text("name: team\nmembers:\n  helper: helper.md\nplan: helper\n")
    (tmp_path / "duo.crew.yaml").write_text(
        "name: duo\nmembers:\n  helper: helper.md\nplan: {sequential: [helper, helper]}\n"
    )
    reg = AgentRegistry.from_dir(tmp_path)
    assert list(reg) == ["helper"]
    assert sorted(reg.crews) == ["duo", "team"] and isinstance(reg.served("team"), Crew)
    assert reg.names() == ["helper", "duo", "team"]


async def test_a_crew_runs_over_thread_streaming(crew_server: Server) -> None:
    """``client.threads.stream(assistant_id=<a crew>)``: the crew run's events and its end."""
    client = get_client(url=crew_server.url)
    async with client.threads.stream(assistant_id="blog") as thread:
        await thread.run.start(input={"messages": [{"role": "user", "content": "tide pools"}]})
        output = await thread.output
    assert _text(output["messages"][-1]).startswith("post from")

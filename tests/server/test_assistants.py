"""Assistants with versions (issue #28 item 4), driven by ``langgraph-sdk`` against a real
``loom serve`` with API keys: create, update (a new version), list versions, set the latest
back (rollback), runs on the version that is latest when they start (the instructions a
``FunctionModel`` echoes show which), delete; another key neither sees nor changes them; bad
input is typed. Every run records its agent's revision (and the assistant version it ran)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.server.conftest import AGENTS, Server, start_server, stop_server

langgraph_sdk = pytest.importorskip("langgraph_sdk")
from langgraph_sdk import get_client  # noqa: E402
from langgraph_sdk.errors import (  # noqa: E402
    ConflictError,
    NotFoundError,
    UnprocessableEntityError,
)

ALICE, BOB, ROOT = "alice-key-0001", "bob-key-0002", "root-key-0004"

pytestmark = pytest.mark.timeout(180)

ECHO = r"""

def echo_instructions(messages, tools):
    system = next((m.content for m in messages if m.role == "system"), "")
    return f"[{system}] {messages[-1].content}"


ECHO = Agent(name="echo", instructions="You are plain.", model=FunctionModel(echo_instructions))
assistant_registry = AgentRegistry([CALC, ECHO])
"""


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("assistants")
    (tmp / "keys.yaml").write_text(
        f"- {{name: alice, key: {ALICE}}}\n"
        f"- {{name: bob, key: {BOB}}}\n"
        f"- {{name: root, key: {ROOT}, admin: true}}\n"
    )
    srv = start_server(
        tmp,
        "--keys",
        str(tmp / "keys.yaml"),
        app="server_agents:assistant_registry",
        source=AGENTS + ECHO,
    )
    yield srv
    stop_server(srv)


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def answer(values: Any) -> str:
    assert isinstance(values, dict)
    return str(values["messages"][-1]["content"])


async def test_versions_rollback_and_runs_on_the_latest(keyed: Server) -> None:
    alice = get_client(url=keyed.url, api_key=ALICE)
    made = await alice.assistants.create(
        "echo",
        config={"configurable": {"instructions": "Speak like a pirate."}},
        metadata={"team": "blue"},
        name="pirate",
    )
    aid = made["assistant_id"]
    assert made["version"] == 1 and made["graph_id"] == "echo" and made["name"] == "pirate"
    assert made["config"] == {"configurable": {"instructions": "Speak like a pirate."}}

    thread = (await alice.threads.create())["thread_id"]
    first = await alice.runs.wait(thread, aid, input=human("hello"))
    assert answer(first) == "[Speak like a pirate.] hello"
    meta = (await alice.threads.get(thread))["metadata"]  # as on LangGraph: the graph is the agent
    assert meta["assistant_id"] == aid and meta["graph_id"] == "echo"

    updated = await alice.assistants.update(
        aid, context={"instructions": "Speak like a robot."}, metadata={"stage": "qa"}
    )
    assert updated["version"] == 2 and updated["name"] == "pirate"
    assert updated["metadata"] == {"team": "blue", "stage": "qa"}
    assert (await alice.assistants.get(aid))["version"] == 2
    second = await alice.runs.wait(thread, aid, input=human("again"))
    assert answer(second) == "[Speak like a robot.] again"

    versions = await alice.assistants.get_versions(aid)
    assert [v["version"] for v in versions] == [2, 1]
    assert versions[1]["metadata"] == {"team": "blue"}
    only_qa = await alice.assistants.get_versions(aid, metadata={"stage": "qa"})
    assert [v["version"] for v in only_qa] == [2]

    back = await alice.assistants.set_latest(aid, 1)
    assert back["version"] == 1 and back["context"] == {}
    third = await alice.runs.wait(thread, aid, input=human("once more"))
    assert answer(third) == "[Speak like a pirate.] once more"
    # a new version after a rollback is numbered after the highest one, not the latest
    assert (await alice.assistants.update(aid, name="pirate v3"))["version"] == 3

    # the served agent is untouched: it still runs with its own instructions
    plain = await alice.runs.wait(thread, "echo", input=human("plain"))
    assert answer(plain) == "[You are plain.] plain"

    runs = {r["run_id"]: r for r in await alice.runs.list(thread, limit=10)}
    assert len(runs) == 4

    listed = await alice.assistants.search(graph_id="echo")
    assert [a["assistant_id"] for a in listed] == ["echo", aid]
    assert await alice.assistants.count(graph_id="echo") == 2

    await alice.assistants.delete(aid)
    with pytest.raises(NotFoundError):
        await alice.assistants.get(aid)
    with pytest.raises(NotFoundError):
        await alice.assistants.get_versions(aid)
    with pytest.raises(httpx.HTTPStatusError) as gone:  # runs.wait raises httpx's own error
        await alice.runs.wait(thread, aid, input=human("gone"))
    assert gone.value.response.status_code == 404


async def test_every_run_records_its_revision_and_assistant_version(keyed: Server) -> None:
    alice = get_client(url=keyed.url, api_key=ALICE)
    served = await alice.assistants.get("echo")
    revision = served["metadata"]["revision"]
    assert revision.startswith("sha256:") and len(revision) == len("sha256:") + 64
    made = await alice.assistants.create(
        "echo", context={"instructions": "Be brief."}, assistant_id="brief"
    )
    await alice.assistants.update("brief", context={"instructions": "Be briefer."})
    thread = (await alice.threads.create())["thread_id"]
    plain = await alice.runs.create(thread, "echo", input=human("a"))
    await alice.runs.join(thread, plain["run_id"])
    pinned = await alice.runs.create(thread, made["assistant_id"], input=human("b"))
    await alice.runs.join(thread, pinned["run_id"])

    got_plain = await alice.runs.get(thread, plain["run_id"])
    assert got_plain["revision"] == revision and got_plain["assistant_version"] is None
    got = await alice.runs.get(thread, pinned["run_id"])
    assert got["assistant_id"] == "brief"
    assert got["revision"] == revision and got["assistant_version"] == 2

    # a raw client may pin a run to an older version by number
    async with httpx.AsyncClient(base_url=keyed.url, headers={"x-api-key": ALICE}) as http:
        raw = await http.post(
            f"/threads/{thread}/runs/wait",
            json={"assistant_id": "brief", "assistant_version": 1, "input": human("c")},
            timeout=30,
        )
    assert raw.status_code == 200, raw.text
    assert answer(raw.json()) == "[Be brief.] c"
    await alice.assistants.delete("brief")


async def test_runs_keep_their_revision_across_a_restart(keyed: Server, tmp_path: Path) -> None:
    """The revision is in the run's stored record: a server that did not run it (a restart on
    the same database) still shows it."""
    alice = get_client(url=keyed.url, api_key=ALICE)
    made = await alice.assistants.create("echo", context={"instructions": "Stay."})
    thread = (await alice.threads.create())["thread_id"]
    run = await alice.runs.create(thread, made["assistant_id"], input=human("x"))
    await alice.runs.join(thread, run["run_id"])
    again = start_server(
        tmp_path,
        "--keys",
        str(keyed.db.parent / "keys.yaml"),
        app="server_agents:assistant_registry",
        source=AGENTS + ECHO,
        db=keyed.db,
    )
    try:
        other = get_client(url=again.url, api_key=ALICE)
        got = await other.runs.get(thread, run["run_id"])
        assert got["assistant_version"] == 1 and str(got["revision"]).startswith("sha256:")
        # the assistant itself is stored: the other server has it, version and all
        assert (await other.assistants.get(made["assistant_id"]))["context"] == {
            "instructions": "Stay."
        }
    finally:
        stop_server(again)


async def test_another_key_neither_sees_nor_changes_them(keyed: Server) -> None:
    alice = get_client(url=keyed.url, api_key=ALICE)
    bob = get_client(url=keyed.url, api_key=BOB)
    root = get_client(url=keyed.url, api_key=ROOT)
    made = await alice.assistants.create("echo", context={"instructions": "Secret."})
    aid = made["assistant_id"]
    with pytest.raises(NotFoundError):
        await bob.assistants.get(aid)
    with pytest.raises(NotFoundError):
        await bob.assistants.update(aid, context={"instructions": "Mine now."})
    with pytest.raises(NotFoundError):
        await bob.assistants.get_versions(aid)
    with pytest.raises(NotFoundError):
        await bob.assistants.set_latest(aid, 1)
    with pytest.raises(NotFoundError):
        await bob.assistants.delete(aid)
    bob_thread = (await bob.threads.create())["thread_id"]
    with pytest.raises(httpx.HTTPStatusError) as hidden:
        await bob.runs.wait(bob_thread, aid, input=human("hi"))
    assert hidden.value.response.status_code == 404
    assert aid not in [a["assistant_id"] for a in await bob.assistants.search(limit=100)]
    for if_exists in ("raise", "do_nothing"):  # a taken id is taken, whoever holds it
        with pytest.raises(ConflictError):
            await bob.assistants.create("echo", assistant_id=aid, if_exists=if_exists)
    # bob's attempts changed nothing
    assert [v["version"] for v in await alice.assistants.get_versions(aid)] == [1]
    # an admin key sees every key's
    assert (await root.assistants.get(aid))["assistant_id"] == aid
    await alice.assistants.delete(aid)


async def test_bad_input_is_typed(keyed: Server) -> None:
    alice = get_client(url=keyed.url, api_key=ALICE)
    with pytest.raises(UnprocessableEntityError, match="not an agent this server serves"):
        await alice.assistants.create("nobody")
    with pytest.raises(UnprocessableEntityError, match="cannot set 'colour'"):
        await alice.assistants.create("echo", config={"configurable": {"colour": "red"}})
    with pytest.raises(UnprocessableEntityError, match="max_iterations"):
        await alice.assistants.create("echo", context={"max_iterations": "many"})
    with pytest.raises(UnprocessableEntityError, match="unknown model setting"):
        await alice.assistants.create("echo", context={"model_settings": {"warmth": 1}})
    made = await alice.assistants.create("echo", assistant_id="typed")
    with pytest.raises(ConflictError):
        await alice.assistants.create("echo", assistant_id="typed")
    same = await alice.assistants.create("echo", assistant_id="typed", if_exists="do_nothing")
    assert same["version"] == made["version"] == 1
    with pytest.raises(NotFoundError, match="no version 7"):
        await alice.assistants.set_latest("typed", 7)
    with pytest.raises(UnprocessableEntityError, match="not an agent this server serves"):
        await alice.assistants.update("typed", graph_id="nobody")
    with pytest.raises(UnprocessableEntityError, match="cannot set 'colour'"):
        await alice.assistants.update("typed", context={"colour": "red"})
    assert [v["version"] for v in await alice.assistants.get_versions("typed")] == [1]
    # a served agent is read-only: one version, no updates, no deletion
    with pytest.raises(ConflictError, match="read-only"):
        await alice.assistants.update("echo", context={"instructions": "x"})
    with pytest.raises(ConflictError, match="read-only"):
        await alice.assistants.delete("echo")
    assert [v["version"] for v in await alice.assistants.get_versions("echo")] == [1]
    with pytest.raises(NotFoundError):
        await alice.assistants.set_latest("echo", 2)
    with pytest.raises(ConflictError):  # a served agent's name is taken
        await alice.assistants.create("echo", assistant_id="calc")
    await alice.assistants.delete("typed")


def test_an_agent_files_revision_is_its_content_hash(tmp_path: Path) -> None:
    from loom import Agent
    from loom.definition import revision_of
    from loom.server.registry import AgentRegistry

    text = "---\nname: filed\nmodel: local\n---\nYou file things.\n"
    path = tmp_path / "AGENT.md"
    path.write_text(text)
    expected = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    assert revision_of(Agent.from_file(path)) == expected
    assert AgentRegistry.from_dir(tmp_path).revision("filed") == expected
    path.write_text(text.replace("file things", "file everything"))
    assert revision_of(Agent.from_file(path)) != expected
    # a Python agent's revision is its definition's: the same fields, the same revision
    one = Agent(name="py", instructions="a", model="local")
    assert revision_of(one) == revision_of(Agent(name="py", instructions="a", model="local"))
    assert revision_of(one) != revision_of(one.replace(instructions="b"))


HOLDER = r"""
import asyncio
from pathlib import Path
from loom import Agent, ModelResponse, ToolCall, tool
from loom.server import AgentRegistry
from loom.testing import FunctionModel


@tool(effect="pure")
async def hold() -> str:
    '''Wait while the file "hold" exists (the test removes it before the restart).'''
    while Path("hold").exists():
        await asyncio.sleep(0.02)
    return "held"


def holder(messages, tools):
    system = next((m.content for m in messages if m.role == "system"), "")
    if messages[-1].role == "tool":
        return f"[{system}] after {messages[-1].content}"
    return ModelResponse(tool_calls=[ToolCall(name="hold", arguments={})])


registry = AgentRegistry([Agent(name="holder", instructions="Plain.",
                                model=FunctionModel(holder), tools=[hold])])
"""


async def test_a_killed_background_run_is_carried_on_with_its_version(tmp_path: Path) -> None:
    """SIGKILL while an assistant's background run holds in a tool: the next start carries the
    run on with the assistant's version (its instructions), not the served agent's."""
    import signal

    (tmp_path / "hold").touch()
    db = tmp_path / "carry.db"
    first = start_server(tmp_path, app="holder_agents:registry", source=HOLDER, db=db)
    try:
        client = get_client(url=first.url)
        made = await client.assistants.create("holder", context={"instructions": "Carried."})
        await client.assistants.update(made["assistant_id"], name="v2 is latest")
        thread = (await client.threads.create())["thread_id"]
        run = await client.runs.create(
            thread, made["assistant_id"], input=human("go"), stream_mode=["events"]
        )
        async for part in client.runs.join_stream(thread, run["run_id"], stream_mode="events"):
            if part.event == "events" and part.data["type"] == "tool_execution_start":
                break  # the tool holds: the run is mid-step
    finally:
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=10)
    (tmp_path / "hold").unlink()
    second = start_server(tmp_path, app="holder_agents:registry", source=HOLDER, db=db)
    try:
        client = get_client(url=second.url)
        values = await client.runs.join(thread, run["run_id"])
        assert answer(values) == "[Carried.] after held"
        got = await client.runs.get(thread, run["run_id"])
        assert got["assistant_version"] == 2 and str(got["revision"]).startswith("sha256:")
    finally:
        stop_server(second)


async def test_two_servers_on_one_postgresql_store_share_assistants(
    pg_schema_dsn: str, tmp_path: Path
) -> None:
    """Assistants live in the store: what one server of a fleet makes, another serves, with
    its versions, and a run there runs the version that is latest."""
    from urllib.parse import quote

    from psycopg.conninfo import conninfo_to_dict

    d = conninfo_to_dict(pg_schema_dsn)
    url = f"postgresql://{d['user']}@{d['host']}:{d['port']}/{d['dbname']}"
    url += f"?options={quote(str(d['options']))}"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    source = AGENTS + ECHO
    a = start_server(
        tmp_path / "a", app="server_agents:assistant_registry", source=source, store=url
    )
    try:
        b = start_server(
            tmp_path / "b", app="server_agents:assistant_registry", source=source, store=url
        )
        try:
            on_a, on_b = get_client(url=a.url), get_client(url=b.url)
            made = await on_a.assistants.create("echo", context={"instructions": "One."})
            aid = made["assistant_id"]
            await on_b.assistants.update(aid, context={"instructions": "Two."})
            assert [v["version"] for v in await on_a.assistants.get_versions(aid)] == [2, 1]
            await on_a.assistants.set_latest(aid, 1)
            thread = (await on_b.threads.create())["thread_id"]
            assert answer(await on_b.runs.wait(thread, aid, input=human("hi"))) == "[One.] hi"
            await on_b.assistants.delete(aid)
            with pytest.raises(NotFoundError):
                await on_a.assistants.get(aid)
        finally:
            stop_server(b)
    finally:
        stop_server(a)

"""The runtime: session gates (queue, drop, interrupt), leases, per-turn state, bounded reads."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from loom import Agent, ModelResponse, ToolCall, tool
from loom.engine.runtime import Runtime
from loom.errors import QueueFull, SessionBusy
from loom.messages import Message, RunResult
from loom.policy.approval import Approve, PendingApproval, Reject
from loom.store import MemoryStore, SQLiteStore
from loom.testing import FunctionModel, ScriptedModel


def slow_model(delay: float) -> FunctionModel:
    async def answer(messages: list[Message], tools: object) -> ModelResponse:
        await asyncio.sleep(delay)
        return ModelResponse(text=f"answer to {messages[-1].content}")

    return FunctionModel(answer)


async def test_queue_runs_turns_one_after_another_in_order() -> None:
    agent = Agent(model=slow_model(0.05))
    results = await asyncio.gather(*(agent.run(f"m{i}", session_id="q") for i in range(5)))
    assert [r.stop_reason for r in results] == ["completed"] * 5
    history = await agent.store.load_messages("q")
    assert [m.content for m in history if m.role == "user"] == [f"m{i}" for i in range(5)]
    for user, answer in zip(history[::2], history[1::2], strict=True):
        assert answer.content == f"answer to {user.content}"


async def test_drop_refuses_while_busy() -> None:
    agent = Agent(model=slow_model(0.2))
    first = asyncio.create_task(agent.run("first", session_id="d"))
    await asyncio.sleep(0.05)
    with pytest.raises(SessionBusy, match="running another turn"):
        await agent.run("second", session_id="d", on_busy="drop")
    assert (await first).stop_reason == "completed"


async def test_interrupt_cancels_the_running_turn() -> None:
    agent = Agent(model=slow_model(0.3))
    first = asyncio.create_task(agent.run("first", session_id="i"))
    await asyncio.sleep(0.05)
    second = await agent.run("second", session_id="i", on_busy="interrupt")
    result = await first
    assert result.stop_reason == "cancelled" and "interrupted" in (result.error or "")
    assert second.stop_reason == "completed"


async def test_queue_depth_is_bounded() -> None:
    agent = Agent(model=slow_model(0.2), max_queue_depth=2)
    tasks = [asyncio.create_task(agent.run(f"m{i}", session_id="full")) for i in range(3)]
    await asyncio.sleep(0.05)
    with pytest.raises(QueueFull, match="max 2"):
        await agent.run("one too many", session_id="full")
    await asyncio.gather(*tasks)


async def test_different_sessions_run_in_parallel() -> None:
    agent = Agent(model=slow_model(0.2))
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.gather(*(agent.run("x", session_id=f"p{i}") for i in range(5)))
    assert loop.time() - started < 0.6


# -- the runtime owns the state; the agent is a shared, frozen definition ----------------------


class FlakyServer:
    """A toolset (as an MCP server is): each runtime gets its own ``fresh()`` copy, and a copy
    whose ``fail`` is set cannot list its tools, as a server that did not start."""

    name = "flaky"

    def __init__(self) -> None:
        self.fail = False
        self.label = ""
        self.closed = False

    def fresh(self) -> FlakyServer:
        return FlakyServer()

    async def load_tools(self) -> list[Any]:
        if self.fail:
            raise ConnectionError(f"server for {self.label} did not start")
        label = self.label

        @tool(name="whoami")
        def whoami() -> str:
            """Say which runtime's server answered."""
            return label

        return [whoami]

    async def aclose(self) -> None:
        self.closed = True


@tool
def gated(n: int) -> str:
    """A tool every call of which needs a human's approval (see the permissions below)."""
    return f"gated {n}"


async def test_one_agent_shared_by_200_sessions_leaks_nothing(tmp_path: Path) -> None:
    asked: list[str] = []

    def handler(p: PendingApproval) -> Approve | Reject:
        asked.append(p.session_id)
        index = int(p.session_id.split("-")[1])  # even sessions say "always", odd "never"
        return Approve(remember="tool") if index % 2 == 0 else Reject("no", remember="tool")

    def model(messages: list[Message], tools: list[Any]) -> ModelResponse | str:
        names = sorted(t.name for t in tools)
        turn = sum(1 for m in messages if m.role == "user")
        last = messages[-1]
        if last.role == "user":
            calls = [ToolCall(name="gated", arguments={"n": turn})]
            if "whoami" in names:
                calls.append(ToolCall(name="whoami"))
            return ModelResponse(tool_calls=calls)
        results = [m.content for m in messages if m.role == "tool"][-2:]
        return f"tools={names} results={results}"

    server = FlakyServer()
    agent = Agent(
        model=FunctionModel(model),
        tools=[gated, server],
        approval_handler=handler,
        permissions={"ask": ["gated"], "default": "allow"},
    )
    runtimes: list[Runtime] = []
    for i in range(200):  # every tenth runtime on its own SQLite file, the rest in memory
        store = SQLiteStore(tmp_path / f"{i}.db") if i % 10 == 0 else MemoryStore()
        rt = Runtime(store)
        live = rt.toolset(server)
        live.label, live.fail = f"s-{i}", i % 3 == 0
        runtimes.append(rt)

    async def session(i: int) -> list[RunResult]:
        rt, sid = runtimes[i], f"s-{i}"
        return [await rt.run(agent, f"turn {k}", session_id=sid) for k in (1, 2)]

    results = await asyncio.gather(*(session(i) for i in range(200)))
    for i, (first, second) in enumerate(results):
        sid = f"s-{i}"
        assert first.stop_reason == second.stop_reason == "completed", (i, first.error)
        failing = i % 3 == 0
        # this runtime's server state only: its own label answers, or its own failure shows
        assert ("whoami" in first.output) is not failing
        if failing:
            assert any(f"server for {sid} did not start" in w for w in first.warnings)
        else:
            assert f"'{sid}'" in first.output.replace('"', "'") and not first.warnings
        # the remembered decision is this session's own: asked once, then applied
        expected = "gated 2" if i % 2 == 0 else "rejected by the user"
        tool_texts = [m.content for m in second.messages if m.role == "tool"]
        assert any(expected in t or (i % 2 and "denied" in t) for t in tool_texts), tool_texts
        store_sessions = [s.id for s in await runtimes[i].store.list_sessions()]
        assert store_sessions == [sid]  # nothing of another session in this store
    assert sorted(asked) == sorted(f"s-{i}" for i in range(200))  # each session asked once
    assert server.label == "" and not server.fail  # the agent's own toolset never touched
    assert agent.tools.keys() == {"gated"}  # no toolset tool written back onto the agent
    for rt in runtimes:
        await rt.aclose()
        await rt.store.close()


async def test_agent_is_frozen() -> None:
    agent = Agent(model=FunctionModel(lambda m, t: "x"), max_iterations=3)
    with pytest.raises(AttributeError, match="frozen"):
        agent.max_iterations = 5  # type: ignore[misc]
    assert agent.replace(max_iterations=5).max_iterations == 5 and agent.max_iterations == 3


class CountingStore(MemoryStore):
    """Records how many messages and events each call read."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[str, int]] = []

    async def load_messages(self, session_id: str, start: int = 0) -> list[Message]:
        out = await super().load_messages(session_id, start)
        self.reads.append(("messages", len(out)))
        return out

    async def load_events(self, session_id: str, run_id: str | None = None) -> list[Any]:
        out = await super().load_events(session_id, run_id)
        self.reads.append(("events", len(out)))
        return out


async def test_intake_reads_are_bounded_by_what_changed_not_by_session_length() -> None:
    store = CountingStore()
    agent = Agent(model=FunctionModel(lambda m, t: "ok"))
    runtime = Runtime(store)
    for i in range(60):
        store.reads.clear()
        await runtime.run(agent, f"m{i}", session_id="long")
        if i > 0:  # the transcript is cached: nothing was read, however long the session
            assert store.reads == [], (i, store.reads)
    # another process (a new runtime) appended: the next turn reads only the messages it added
    # (and that session's approval decisions, through the store's index on them)
    await Runtime(store).run(agent, "elsewhere", session_id="long")
    store.reads.clear()
    await runtime.run(agent, "back", session_id="long")
    assert [r for r in store.reads if r[0] == "messages"] == [("messages", 2)]


class SQLiteNoJournalReads(SQLiteStore):
    """Refuses to read a session's whole journal (what INTAKE must no longer do)."""

    async def load_events(self, session_id: str, run_id: str | None = None) -> list[Any]:
        raise AssertionError("INTAKE read the whole journal")


async def test_remembered_decisions_are_found_by_a_new_process_without_the_journal(
    tmp_path: Path,
) -> None:
    """An "always" decided in one process holds in the next one, which reads the session's
    approval decisions through the index and never its whole journal."""
    turns = iter(range(100))

    def model(messages: list[Message], tools: list[Any]) -> ModelResponse | str:
        if messages[-1].role == "user":
            return ModelResponse(tool_calls=[ToolCall(name="gated", arguments={"n": next(turns)})])
        return "done"

    perms = {"ask": ["gated"], "default": "allow"}
    first = Agent(
        model=FunctionModel(model),
        tools=[gated],
        permissions=perms,
        approval_handler=lambda p: Approve(remember="tool"),
    )
    store = SQLiteStore(tmp_path / "l.db")
    assert (await Runtime(store).run(first, "go", session_id="s")).stop_reason == "completed"
    await store.close()
    # no handler now: a call that needed asking would be parked (awaiting_approval)
    later = first.replace(approval_handler=None)
    other = SQLiteNoJournalReads(tmp_path / "l.db")
    result = await Runtime(other).run(later, "again", session_id="s")
    assert result.stop_reason == "completed", result.error
    assert any(m.role == "tool" and m.content == "gated 1" for m in result.messages)
    await other.close()


async def test_a_long_turn_keeps_its_lease(tmp_path: Path) -> None:
    """A turn longer than the lease's ttl renews it: another runtime cannot take the session."""
    entered, leave = asyncio.Event(), asyncio.Event()

    @tool
    async def slow() -> str:
        """Wait."""
        entered.set()
        await leave.wait()
        return "done"

    model = ScriptedModel([ModelResponse(tool_calls=[ToolCall(name="slow")]), "ok"])
    agent = Agent(model=model, tools=[slow])
    store = SQLiteStore(tmp_path / "l.db")
    turn = asyncio.create_task(Runtime(store, lease_ttl=0.3).run(agent, "go", session_id="s"))
    await entered.wait()
    other = Runtime(SQLiteStore(tmp_path / "l.db"))  # as another process would
    for _ in range(4):  # well past the ttl: renewed every 0.1 s
        await asyncio.sleep(0.3)
        with pytest.raises(SessionBusy):
            await other.run(
                Agent(model=FunctionModel(lambda m, t: "x")), "x", session_id="s", on_busy="drop"
            )
    leave.set()
    assert (await turn).stop_reason == "completed"


SRC = str(Path(__file__).resolve().parents[2] / "src")  # this checkout, for the child process
HOLDER = r"""
import asyncio, sys
from loom import Agent, ModelResponse, ToolCall, tool
from loom.engine.runtime import Runtime
from loom.store import SQLiteStore
from loom.testing import ScriptedModel

@tool
async def wait_for_parent() -> str:
    '''Blocks until the parent writes a line.'''
    print("in-tool", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    return "from A"

async def main() -> None:
    model = ScriptedModel([ModelResponse(tool_calls=[ToolCall(name="wait_for_parent")]), "A done"])
    runtime = Runtime(SQLiteStore(sys.argv[1]), lease_ttl=float(sys.argv[2]))
    agent = Agent(model=model, tools=[wait_for_parent], tool_timeout=120)
    try:
        result = await runtime.run(agent, "from A", session_id="s")
        print("finished", result.stop_reason, result.error, flush=True)
    except Exception as exc:
        print("raised", type(exc).__name__, flush=True)

asyncio.run(main())
"""


@pytest.mark.slow
async def test_a_process_whose_lease_was_taken_over_cannot_write(tmp_path: Path) -> None:
    """A stalls (SIGSTOP) mid-tool past its lease; B takes the session over and recovers A's
    call; A wakes up, finishes its tool, and none of what it does then reaches the database."""
    import os
    import signal
    import subprocess
    import sys

    db = tmp_path / "f.db"
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    a = subprocess.Popen(  # noqa: ASYNC220
        [sys.executable, str(script), str(db), "0.5"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=SRC),
    )
    assert a.stdin is not None and a.stdout is not None
    try:
        assert a.stdout.readline().strip() == "in-tool"
        a.send_signal(signal.SIGSTOP)  # A stalls holding the lease
        store = SQLiteStore(db)
        b = Runtime(store)
        quick = Agent(model=FunctionModel(lambda m, t: "B done"))
        with pytest.raises(SessionBusy):  # a stopped process is alive: its lease holds
            await b.run(quick, "too early", session_id="s", on_busy="drop")
        await asyncio.sleep(0.6)  # A's lease runs out (the one wait this test is about)
        result = await b.run(quick, "from B", session_id="s", on_busy="drop")
        assert result.stop_reason == "completed"
        a.send_signal(signal.SIGCONT)
        a.stdin.write("go\n")
        a.stdin.flush()
        outcome = a.stdout.readline().split()
        assert outcome[:2] == ["raised", "LeaseLost"], outcome
        a.wait(timeout=60)
    finally:
        if a.poll() is None:
            a.kill()
    messages = await store.load_messages("s")
    contents = [m.content for m in messages]
    assert "from A" not in [m.content for m in messages if m.role == "tool"]  # A's result lost
    assert "A done" not in contents
    assert contents[-2:] == ["from B", "B done"]
    tool_msgs = [m for m in messages if m.role == "tool"]
    assert [m.metadata.get("error_code") for m in tool_msgs] == ["interrupted"]  # B recovered it


async def test_a_turns_tool_specs_are_one_list_while_its_tools_stay_the_same(
    tmp_path: Path,
) -> None:
    # With SQLiteStore the built-in tools join the agent's: the context builder caches the
    # tools' token count by the specs' identity, so rebuilding the list every turn made it
    # recount every schema every iteration.
    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    agent = Agent(name="a", model=ScriptedModel(["x"]), tools=[add])
    store = SQLiteStore(tmp_path / "s.db")
    rt = Runtime(store)
    view = await rt.session_view("s")
    first = await rt.deps_for(agent, "s", view, None)
    second = await rt.deps_for(agent, "s", view, None)
    assert set(first.tools) > {"add"}  # the built-ins are there
    assert second.tool_specs is first.tool_specs
    assert [s.name for s in first.tool_specs] == list(first.tools)

    @tool
    def sub(a: int, b: int) -> int:
        """Subtract."""
        return a - b

    third = await rt.deps_for(agent.replace(tools=[add, sub]), "s", view, None)
    assert [s.name for s in third.tool_specs] == list(third.tools)
    assert "sub" in third.tools and third.tool_specs is not first.tool_specs
    await store.close()


@pytest.mark.parametrize("store", [None, "sqlite"])
async def test_a_session_never_sees_another_sessions_messages(
    store: str | None, tmp_path: Path
) -> None:
    # one runtime, one transcript cache, sessions of equal and unequal length taking turns:
    # what the model is sent for a session is that session's conversation and nothing else
    seen: dict[str, list[str]] = {}

    def model(messages: list[Message], tools: Any) -> str:
        texts = [m.content for m in messages if m.role in ("user", "assistant")]
        tag = texts[-1].split(":")[0]
        seen[tag] = texts
        return f"{tag}: ok"

    rt = Runtime(store=SQLiteStore(tmp_path / "s.db") if store else MemoryStore())
    agent = Agent(name="a", model=FunctionModel(model))
    for turn in range(3):
        for sid in ("A", "B", "C"):
            if sid == "C" and turn == 0:
                continue  # C is shorter than A and B: the cache holds sessions of both lengths
            result = await rt.run(agent, f"{sid}: turn {turn}", session_id=sid)
            assert result.stop_reason == "completed"
            assert all(t.startswith(f"{sid}:") for t in seen[sid]), (sid, seen[sid])
    assert len(seen["A"]) == 5 and len(seen["C"]) == 3  # its own turns, all of them

"""The repeat gate (``loom.engine.branching``): a call that repeats, with the same arguments,
an ``at_most_once`` call of a turn a branch undid waits for a human's approval, unless the
agent's ``branch_effects`` is ``"allow"``; approved, it runs once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loom import Agent, tool
from loom.engine.run_inputs import Resume, Rewind
from loom.engine.runtime import Runtime
from loom.events import EventType
from loom.messages import Message, ModelResponse, ToolCall, ToolSpec
from loom.policy.approval import Approve
from loom.store.memory import MemoryStore
from loom.testing import FunctionModel

SENT: list[str] = []


@tool(effect="at_most_once")
def send(to: str) -> str:
    """Send a message to someone."""
    SENT.append(to)
    return f"sent to {to}"


def answer(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> str | ModelResponse:
    """``mail NAME`` sends to NAME; a tool result is answered with ``done``."""
    last = messages[-1]
    if last.role == "tool":
        return f"done: {last.content}"
    words = last.content.split()
    if last.role == "user" and words[:1] == ["mail"]:
        return ModelResponse(tool_calls=[ToolCall(name="send", arguments={"to": words[1]})])
    return f"echo {last.content}"


def agent(**kw: object) -> Agent:
    return Agent(name="gated", model=FunctionModel(answer), tools=[send], **kw)  # type: ignore[arg-type]


async def rewound(rt: Runtime, a: Agent) -> str:
    """A session that mailed bob, rewound to before it."""
    await rt.run(a, "hello", session_id="s")
    await rt.run(a, "mail bob", session_id="s")
    result = await rt.run(a, Rewind(1), session_id="s")
    assert result.stop_reason == "rewound"
    return "s"


async def test_the_same_call_again_waits_for_approval_naming_the_undone_call() -> None:
    SENT.clear()
    rt, a = Runtime(store=MemoryStore()), agent()
    sid = await rewound(rt, a)
    assert SENT == ["bob"]
    result = await rt.run(a, "mail bob", session_id=sid)
    assert result.stop_reason == "awaiting_approval"
    assert SENT == ["bob"]  # not sent twice
    [pending] = result.pending_approvals
    assert pending["tool_name"] == "send" and pending["arguments"] == {"to": "bob"}
    reason = pending["reason"]
    assert "repeats an at_most_once call of an undone turn" in reason
    assert "undone by a rewind at 20" in reason and "sent to bob" in reason
    events = await rt.store.load_events(sid)
    assert any(e.type is EventType.APPROVAL_REQUIRED for e in events)
    # approved, it runs once
    decisions = {pending["tool_call_id"]: Approve()}
    resumed = await rt.run(a, Resume(decisions), session_id=sid)
    assert resumed.stop_reason == "completed" and resumed.text == "done: sent to bob"
    assert SENT == ["bob", "bob"]


async def test_other_arguments_run() -> None:
    SENT.clear()
    rt, a = Runtime(store=MemoryStore()), agent()
    sid = await rewound(rt, a)
    result = await rt.run(a, "mail carol", session_id=sid)
    assert result.stop_reason == "completed" and SENT == ["bob", "carol"]


async def test_allow_runs_it_again() -> None:
    SENT.clear()
    rt, a = Runtime(store=MemoryStore()), agent(branch_effects="allow")
    sid = await rewound(rt, a)
    result = await rt.run(a, "mail bob", session_id=sid)
    assert result.stop_reason == "completed" and SENT == ["bob", "bob"]


async def test_a_fork_gates_the_source_s_later_calls_too() -> None:
    SENT.clear()
    rt, a = Runtime(store=MemoryStore()), agent()
    await rt.run(a, "hello", session_id="src")
    await rt.run(a, "mail bob", session_id="src")
    fork = await rt.fork(a, "src", 1)
    result = await rt.run(a, "mail bob", session_id=fork)
    assert result.stop_reason == "awaiting_approval" and SENT == ["bob"]
    assert "undone by a fork" in result.pending_approvals[0]["reason"]


class CountingStore(MemoryStore):
    """Counts the reads of the session's SESSION_BRANCH events."""

    branch_reads = 0

    async def load_events_of_type(self, session_id: str, types: Sequence[EventType]) -> list[Any]:
        if EventType.SESSION_BRANCH in types:
            self.branch_reads += 1
        return await super().load_events_of_type(session_id, types)


def multi(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> str | ModelResponse:
    """``mail A B ...`` sends to each, in one answer; ``twice`` does it over two answers."""
    last = messages[-1]
    words = last.content.split()
    if last.role == "user" and words[:1] == ["mail"]:
        calls = [ToolCall(name="send", arguments={"to": w}) for w in words[1:]]
        return ModelResponse(tool_calls=calls)
    if last.role == "user" and words == ["twice"]:
        return ModelResponse(tool_calls=[ToolCall(name="send", arguments={"to": "x"})])
    if last.role == "tool" and last.content == "sent to x":
        return ModelResponse(tool_calls=[ToolCall(name="send", arguments={"to": "y"})])
    return "ok" if last.role == "tool" else "hi"


async def test_the_branch_events_are_read_once_per_turn_and_only_for_at_most_once_calls() -> None:
    store = CountingStore()
    rt = Runtime(store=store)
    a = Agent(name="multi", model=FunctionModel(multi), tools=[send])
    await rt.run(a, "hello", session_id="s")
    assert store.branch_reads == 0  # no call: nothing read
    await rt.run(a, "mail a b c", session_id="s")
    assert store.branch_reads == 1  # three calls, one read
    await rt.run(a, "twice", session_id="s")
    assert store.branch_reads == 2  # two model answers with calls, one read
    await rt.run(
        Agent(name="multi", model=FunctionModel(multi), tools=[send], branch_effects="allow"),
        "mail d",
        session_id="s",
    )
    assert store.branch_reads == 2  # the gate is off: nothing read

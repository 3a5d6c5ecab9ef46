"""Human approval: pause with APPROVAL_REQUIRED, handler decisions, resume from the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loom import Agent, EventType, ModelResponse, ToolCall, tool
from loom.engine.journal import transcript
from loom.errors import InputError
from loom.policy.approval import Approve, Edit, PendingApproval, Reject, pending_approvals
from loom.store.memory import MemoryStore
from loom.testing import ScriptedModel

LOG: list[str] = []


@tool
def record(note: str) -> str:
    """Write a note to the log (a side effect that must happen at most once).

    Args:
        note: The note.
    """
    LOG.append(note)
    return f"recorded {note}"


@tool(effect="pure")
def peek() -> str:
    """Look without changing anything."""
    LOG.append("peek")
    return "peeked"


@pytest.fixture(autouse=True)
def clear_log() -> None:
    LOG.clear()


def call(note: str, id: str | None = None) -> ToolCall:
    return ToolCall(id=id or f"call_{note}", name="record", arguments={"note": note})


def agent(store: MemoryStore, *responses: ModelResponse, **kw: Any) -> Agent:
    return Agent(
        model=ScriptedModel(list(responses)),
        tools=[record, peek],
        store=store,
        permissions={"allow": ["peek"], "ask": ["record"]},
        **kw,
    )


def every_call_answered(messages: list[Any]) -> bool:
    answered = {m.tool_call_id for m in messages if m.role == "tool"}
    return all(c.id in answered for m in messages for c in m.tool_calls)


async def test_pause_then_resume_in_another_agent_on_the_same_store() -> None:
    store = MemoryStore()
    first = agent(
        store, ModelResponse(tool_calls=[ToolCall(id="call_peek", name="peek"), call("a")])
    )
    events = [e async for e in first.stream("do it", session_id="s1")]
    finish = events[-1]
    assert finish.type is EventType.AGENT_FINISH
    assert finish.data["stop_reason"] == "awaiting_approval"
    required = [e for e in events if e.type is EventType.APPROVAL_REQUIRED]
    assert [e.data["tool_call_id"] for e in required] == ["call_a"]
    assert (
        required[0].data["arguments"] == {"note": "a"} and "approval" in required[0].data["reason"]
    )
    assert LOG == ["peek"]  # the allowed call ran, the other waits
    assert [p.tool_call_id for p in await pending_approvals(store, "s1")] == ["call_a"]
    assert await store.open_tool_calls("s1") == []  # recovery has nothing to close

    second = agent(store, ModelResponse(text="all done"))
    result = await second.resume("s1", {"call_a": Approve()})
    assert result.stop_reason == "completed" and result.output == "all done"
    assert LOG == ["peek", "a"]  # nothing ran twice
    history = await store.load_messages("s1")
    assert every_call_answered(history)
    assert [m.tool_call_id for m in history if m.role == "tool"] == ["call_peek", "call_a"]
    seen = second.model.calls[0].messages  # type: ignore[attr-defined]
    assert [m.content for m in seen if m.role == "tool"] == ["peeked", "recorded a"]
    assert await pending_approvals(store, "s1") == []


async def test_run_result_carries_the_pending_calls() -> None:
    store = MemoryStore()
    result = await agent(store, ModelResponse(tool_calls=[call("x")])).run("go", session_id="s")
    assert result.stop_reason == "awaiting_approval"
    assert result.pending_approvals == [
        PendingApproval(
            "s",
            result.run_id,
            "call_x",
            "record",
            {"note": "x"},
            result.pending_approvals[0]["reason"],
        ).to_dict()
    ]


async def test_reject_and_edit_at_resume() -> None:
    store = MemoryStore()
    a = agent(store, ModelResponse(tool_calls=[call("a"), call("b")]), ModelResponse(text="ok"))
    assert (await a.run("go", session_id="s")).stop_reason == "awaiting_approval"
    result = await a.resume(
        "s", {"call_a": Reject("not today"), "call_b": Edit({"note": "b-edited"})}
    )
    assert result.stop_reason == "completed"
    assert LOG == ["b-edited"]
    tool_msgs = {m.tool_call_id: m for m in result.messages if m.role == "tool"}
    assert tool_msgs["call_a"].metadata["error_code"] == "denied"
    assert "not today" in tool_msgs["call_a"].content
    # the model's call (committed before the edit) still says note=b; its result says what ran
    assert tool_msgs["call_b"].content == (
        '(run with the arguments the user edited them to: {"note": "b-edited"})\nrecorded b-edited'
    )
    assert tool_msgs["call_b"].metadata["edited_arguments"] == {"note": "b-edited"}
    assert "edited" not in tool_msgs["call_a"].content
    assert (await store.load_messages("s")) == transcript(await store.load_events("s"))


async def test_resume_errors_are_clear() -> None:
    store = MemoryStore()
    a = agent(store, ModelResponse(tool_calls=[call("a"), call("b")]))
    with pytest.raises(InputError, match="no tool calls waiting"):
        await a.resume("nothing-here", True)
    await a.run("go", session_id="s")
    with pytest.raises(InputError, match="no decision for pending call 'call_b'"):
        await a.resume("s", {"call_a": "approve"})
    with pytest.raises(InputError, match="no pending call 'call_zzz'"):
        await a.resume("s", {"call_a": True, "call_b": True, "call_zzz": True})
    with pytest.raises(InputError, match="cannot use"):
        await a.resume("s", "perhaps")
    assert LOG == []


async def test_handler_approves_rejects_and_edits() -> None:
    seen: list[PendingApproval] = []

    async def handler(p: PendingApproval) -> Any:
        seen.append(p)
        return {"a": Approve(), "b": Reject("no b"), "c": Edit({"note": "c2"})}[p.arguments["note"]]

    store = MemoryStore()
    a = agent(
        store,
        ModelResponse(tool_calls=[call("a"), call("b"), call("c")]),
        ModelResponse(text="fine"),
        approval_handler=handler,
    )
    events = [e async for e in a.stream("go", session_id="s")]
    assert events[-1].data["stop_reason"] == "completed"
    assert [p.tool_call_id for p in seen] == ["call_a", "call_b", "call_c"]
    assert sorted(LOG) == ["a", "c2"]
    decisions = [e.data["decision"] for e in events if e.type is EventType.APPROVAL_DECISION]
    assert decisions == ["approve", "reject", "edit"]
    results = {
        e.data["tool_call_id"]: e.data["content"] for e in events if e.type.name == "TOOL_RESULT"
    }
    assert results["call_c"].startswith(
        '(run with the arguments the user edited them to: {"note": "c2"})'
    )
    assert not results["call_a"].startswith("(run with")
    types = [e.type for e in events]
    assert types.index(EventType.APPROVAL_REQUIRED) < types.index(EventType.APPROVAL_DECISION)


async def test_remembered_approval_lasts_for_the_session_and_across_agents() -> None:
    asked: list[str] = []

    def handler(p: PendingApproval) -> Approve:
        asked.append(p.tool_call_id)
        return Approve(remember="tool")

    store = MemoryStore()
    a = agent(
        store,
        ModelResponse(tool_calls=[call("a", "c1")]),
        ModelResponse(tool_calls=[call("b", "c2")]),
        ModelResponse(text="done"),
        approval_handler=handler,
    )
    assert (await a.run("go", session_id="s")).stop_reason == "completed"
    assert asked == ["c1"] and LOG == ["a", "b"]
    # A new agent object (as after a restart) reads the remembered rule from the journal.
    b = agent(store, ModelResponse(tool_calls=[call("c", "c3")]), ModelResponse(text="done"))
    assert (await b.run("again", session_id="s")).stop_reason == "completed"
    assert LOG == ["a", "b", "c"]
    # ... but only in that session.
    c = agent(store, ModelResponse(tool_calls=[call("d", "c4")]))
    assert (await c.run("other", session_id="s2")).stop_reason == "awaiting_approval"


async def test_exact_remember_covers_only_the_same_arguments() -> None:
    asked: list[str] = []

    def handler(p: PendingApproval) -> Approve:
        asked.append(p.tool_call_id)
        return Approve(remember=True)

    store = MemoryStore()
    a = agent(
        store,
        ModelResponse(tool_calls=[call("a", "c1")]),
        ModelResponse(tool_calls=[call("a", "c2"), call("b", "c3")]),
        ModelResponse(text="done"),
        approval_handler=handler,
    )
    await a.run("go", session_id="s")
    assert asked == ["c1", "c3"]


async def test_a_new_message_closes_pending_calls_as_not_approved() -> None:
    store = MemoryStore()
    a = agent(store, ModelResponse(tool_calls=[call("a")]), ModelResponse(text="moved on"))
    await a.run("go", session_id="s")
    result = await a.run("never mind", session_id="s")
    assert result.output == "moved on" and LOG == []
    history = await store.load_messages("s")
    assert every_call_answered(history)
    closed = next(m for m in history if m.role == "tool")
    assert closed.metadata["error_code"] == "denied" and "not approved" in closed.content
    assert await pending_approvals(store, "s") == []
    with pytest.raises(InputError):
        await a.resume("s", True)


async def test_single_decision_applies_to_all_and_resume_sync_works(tmp_path: Path) -> None:
    store = MemoryStore()
    a = agent(store, ModelResponse(tool_calls=[call("a"), call("b")]), ModelResponse(text="ok"))
    await a.run("go", session_id="s")
    result = await a.resume("s", "approve")
    assert result.stop_reason == "completed" and sorted(LOG) == ["a", "b"]


async def test_deny_rules_still_apply_after_approval() -> None:
    store = MemoryStore()
    a = agent(store, ModelResponse(tool_calls=[call("a")]), ModelResponse(text="ok"))
    await a.run("go", session_id="s")
    strict = Agent(
        model=ScriptedModel([ModelResponse(text="ok")]),
        tools=[record],
        store=store,
        permissions={"deny": ["record"]},
    )
    result = await strict.resume("s", Edit({"note": "x"}))
    tool_msg = next(m for m in result.messages if m.role == "tool")
    assert tool_msg.metadata["error_code"] == "denied" and LOG == []

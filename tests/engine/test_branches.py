"""Session branches (``loom.engine.branching``): rewind, regenerate, edit and fork keep the
journal append-only, keep ``load_messages == transcript(load_events)``, tell the new branch
what the dropped turns did in the world, and refuse what they must, changing nothing."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from loom import Agent, tool
from loom.engine.journal import transcript
from loom.engine.run_inputs import AtEvent, AtTurn, Edit, Regenerate, Rewind
from loom.engine.runtime import Runtime
from loom.errors import BranchError, BranchRefused, InputError
from loom.events import EventType
from loom.messages import Message, ModelResponse, ToolCall, ToolSpec
from loom.store.memory import MemoryStore
from loom.testing import FunctionModel

SENT: list[str] = []


@tool(effect="at_most_once")
def send(to: str) -> str:
    """Send a message to someone."""
    SENT.append(to)
    return f"sent to {to}"


@tool(effect="pure")
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def answer(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> str | ModelResponse:
    """``mail NAME`` sends; ``add A B`` adds; anything else is echoed with what was seen."""
    last = messages[-1]
    if last.role == "tool":
        return f"done: {last.content}"
    words = last.content.split()
    if last.role == "user" and words[:1] == ["mail"]:
        return ModelResponse(tool_calls=[ToolCall(name="send", arguments={"to": words[1]})])
    if last.role == "user" and words[:1] == ["add"]:
        a, b = int(words[1]), int(words[2])
        return ModelResponse(tool_calls=[ToolCall(name="add", arguments={"a": a, "b": b})])
    return f"echo {last.content} (saw {len(messages)})"


def agent(**kw: object) -> Agent:
    return Agent(name="brancher", model=FunctionModel(answer), tools=[send, add], **kw)  # type: ignore[arg-type]


async def session(store: MemoryStore, *messages: str) -> tuple[Runtime, str]:
    rt = Runtime(store=store)
    for m in messages:
        await rt.run(agent(), m, session_id="s")
    return rt, "s"


def shown(messages: Sequence[Message]) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in messages]


async def consistent(store: MemoryStore, sid: str) -> list[Message]:
    """The session's transcript, checked against its journal."""
    stored = await store.load_messages(sid)
    assert stored == transcript(await store.load_events(sid))
    return stored


async def test_rewind_keeps_turns_and_the_journal_keeps_the_rest() -> None:
    store = MemoryStore()
    rt, sid = await session(store, "one", "add 1 2", "three")
    before = len(await store.load_events(sid))
    result = await rt.run(agent(), Rewind(AtTurn(1)), session_id=sid)
    assert result.stop_reason == "rewound"
    assert shown(await consistent(store, sid)) == [
        ("user", "one"),
        ("assistant", "echo one (saw 1)"),
    ]
    events = await store.load_events(sid)
    assert len(events) > before  # appended, nothing removed
    branch = next(e for e in events if e.type is EventType.SESSION_BRANCH)
    assert branch.data["reason"] == "rewind" and branch.data["abandoned"] == 6
    assert branch.data["effects"] == []  # add is pure: nothing to tell
    # the session goes on from there
    again = await rt.run(agent(), "next", session_id=sid)
    assert again.text == "echo next (saw 3)"


async def test_dropped_effects_are_noted_and_the_note_survives_later_branches() -> None:
    store = MemoryStore()
    rt, sid = await session(store, "one", "mail bob", "three")
    await rt.run(agent(), Rewind(1), session_id=sid)
    note = (await consistent(store, sid))[-1]
    assert note.role == "system" and note.metadata == {"branch_note": True}
    assert 'send({"to": "bob"}) -> sent to bob [at_most_once]' in note.content
    # regenerating the first answer cuts before the note: it is carried, not lost
    result = await rt.run(agent(), Regenerate(), session_id=sid)
    after = await consistent(store, sid)
    assert shown(after)[0] == ("user", "one") and after[1].metadata == {"branch_note": True}
    assert result.text.startswith("echo Note:")  # the model saw the note last


async def test_refuse_fails_the_operation_naming_the_calls_and_changes_nothing() -> None:
    store = MemoryStore()
    rt, sid = await session(store, "one", "mail bob")
    before_messages, before_events = await store.load_messages(sid), await store.load_events(sid)
    with pytest.raises(BranchRefused, match=r"send \(call_") as caught:
        await rt.run(agent(branch_effects="refuse"), Rewind(1), session_id=sid)
    assert caught.value.calls == [{"tool": "send", "arguments": {"to": "bob"}}]
    assert await store.load_messages(sid) == before_messages
    assert len(await store.load_events(sid)) == len(before_events)
    # allow: no note
    await rt.run(agent(branch_effects="allow"), Rewind(1), session_id=sid)
    assert [m.role for m in await consistent(store, sid)] == ["user", "assistant"]


async def test_regenerate_and_edit_answer_anew() -> None:
    store = MemoryStore()
    rt, sid = await session(store, "one", "two")
    regenerated = await rt.run(agent(), Regenerate(), session_id=sid)
    assert regenerated.text == "echo two (saw 3)"
    assert len(await consistent(store, sid)) == 4
    edited = await rt.run(agent(), Edit(0, "uno"), session_id=sid)
    assert edited.text == "echo uno (saw 1)"
    assert shown(await consistent(store, sid)) == [("user", "uno"), ("assistant", edited.text)]


async def test_an_event_point_of_an_abandoned_branch_brings_it_back() -> None:
    store = MemoryStore()
    rt, sid = await session(store, "one", "two")
    second = (await store.load_events(sid))[-1]  # the second run's last event
    await rt.run(agent(), Rewind(0), session_id=sid)
    assert await consistent(store, sid) == []
    await rt.run(agent(), Rewind(AtEvent(second.run_id, second.sequence)), session_id=sid)
    assert [m.content for m in await consistent(store, sid)] == [
        "one",
        "echo one (saw 1)",
        "two",
        "echo two (saw 3)",
    ]


async def test_bad_points_are_typed_errors_before_anything_changes() -> None:
    store = MemoryStore()
    rt, sid = await session(store, "one", "add 1 2")
    events = await store.load_events(sid)
    before = len(events)
    cases: list[tuple[object, str]] = [
        (Rewind(5), "turn 5 does not exist"),
        (Rewind(-1), "turn number >= 0"),
        (Rewind(2), "already at that point"),
        (Rewind(AtEvent("run_nope", 3)), "no stored event 3"),
        (Edit(7, "x"), "turn 7 does not exist"),
    ]
    llm_complete = next(
        e for e in events if e.type is EventType.LLM_COMPLETE and e.data["tool_calls"]
    )
    cases.append((Rewind(AtEvent(llm_complete.run_id, llm_complete.sequence)), "inside a step"))
    for inp, says in cases:
        with pytest.raises(BranchError, match=says):
            await rt.run(agent(), inp, session_id=sid)  # type: ignore[arg-type]
    assert len(await store.load_events(sid)) == before
    with pytest.raises(InputError, match="continues a session"):
        await rt.run(agent(), Regenerate())


async def test_fork_shares_a_prefix_and_leaves_the_source_alone() -> None:
    store = MemoryStore()
    rt, sid = await session(store, "one", "mail bob", "three")
    source = await consistent(store, sid)
    fork = await rt.fork(agent(), sid, AtTurn(1))
    forked = await consistent(store, fork)
    assert forked[:2] == source[:2]
    assert "this conversation continues from an earlier point" in forked[2].content
    assert 'send({"to": "bob"})' in forked[2].content
    await rt.run(agent(), "in the fork", session_id=fork)
    assert await consistent(store, sid) == source  # the source is unchanged
    copy = await rt.fork(agent(), sid)
    assert await consistent(store, copy) == source
    with pytest.raises(InputError, match="exists"):
        await rt.fork(agent(), sid, new_session_id=copy)
    with pytest.raises(BranchRefused):
        await rt.fork(agent(branch_effects="refuse"), sid, AtTurn(1))


async def test_agent_methods_are_the_front_door_s_branch_inputs() -> None:
    a = agent()
    first = await a.run("one")
    sid = first.session_id
    await a.run("two", session_id=sid)
    assert (await a.regenerate(sid)).text == "echo two (saw 3)"
    assert (await a.edit(sid, 1, "deux")).text == "echo deux (saw 3)"
    fork = await a.fork(sid, 1)
    assert [m.content for m in await a.runtime.store.load_messages(fork)] == [
        "one",
        "echo one (saw 1)",
    ]
    assert (await a.rewind(sid, 1)).stop_reason == "rewound"
    assert len(await a.runtime.store.load_messages(sid)) == 2


async def test_a_branch_is_announced_only_after_it_is_stored() -> None:
    class FailingRewind(MemoryStore):
        async def rewind(self, *args: object, **kwargs: object) -> None:
            raise OSError("disk full")

    store = FailingRewind()
    rt, sid = await session(store, "one", "two")
    seen: list[EventType] = []
    with pytest.raises(OSError, match="disk full"):
        async for event in rt.stream(agent(), Rewind(1), session_id=sid):
            seen.append(event.type)
    assert EventType.AGENT_START in seen  # the run did start and stream
    assert EventType.SESSION_BRANCH not in seen  # persist before you announce
    assert len(await consistent(store, sid)) == 4  # and nothing of it was stored

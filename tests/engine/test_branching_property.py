"""A property of session branches (``loom.engine.branching``) over random sessions and random
operations: random turns of pure, idempotent and at_most_once tool calls (a ``FunctionModel``
scripted from the draw), then rewinds to random turns or stored events, regenerations, edits
and forks, under a random ``branch_effects``. After each operation:

- the stored transcript is the one its journal derives (``load_messages == transcript``);
- it is the source's kept prefix plus the new branch (notes of dropped effects, then the new
  turn for a regenerate or an edit);
- a fork's source is unchanged;
- every tool call is answered at most once, and exactly once unless the run waits on a human;
- ``refuse`` blocks exactly when calls with effects would be dropped, and changes nothing.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loom import Agent, tool
from loom.engine.journal import transcript
from loom.engine.run_inputs import AtEvent, AtTurn, Edit, Regenerate, Rewind
from loom.engine.runtime import Runtime
from loom.errors import BranchError, BranchRefused
from loom.messages import Message, ModelResponse, ToolCall, ToolSpec
from loom.store.memory import MemoryStore
from loom.testing import FunctionModel


@tool(effect="pure")
def look(x: int) -> str:
    """Read something."""
    return f"look{x}"


@tool(effect="idempotent")
def put(x: int) -> str:
    """Set something (again is harmless)."""
    return f"put{x}"


@tool(effect="at_most_once")
def send(x: int) -> str:
    """Send something (once)."""
    return f"send{x}"


EFFECTS = {"look": "pure", "put": "idempotent", "send": "at_most_once"}
SCRIPTS: dict[str, list[tuple[str, int]]] = {}  # a user message's text -> the calls it makes


def answer(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> str | ModelResponse:
    """The calls the last user message's script names, then a plain answer."""
    if messages and messages[-1].role == "tool":
        return f"answered {messages[-1].content}"
    said = next((m.content for m in reversed(messages) if m.role == "user"), "")
    calls = SCRIPTS.get(said, [])
    if not calls:
        return f"answer to {said}"
    return ModelResponse(tool_calls=[ToolCall(name=n, arguments={"x": x}) for n, x in calls])


calls_of = st.lists(st.tuples(st.sampled_from(sorted(EFFECTS)), st.integers(0, 2)), max_size=3)


def check_answered(messages: Sequence[Message], waiting: bool) -> None:
    """Each call has at most one result, and exactly one unless the run waits on a human."""
    results: dict[str, int] = {}
    for m in messages:
        if m.role == "tool" and m.tool_call_id:
            results[m.tool_call_id] = results.get(m.tool_call_id, 0) + 1
    asked = [c.id for m in messages for c in m.tool_calls]
    assert len(asked) == len(set(asked))
    assert all(n == 1 for n in results.values()), results
    assert set(results) <= set(asked)
    if not waiting:
        assert set(results) == set(asked), "a call without its result"


def dropped_effects(dropped: Sequence[Message], kept: Sequence[Message]) -> list[str]:
    """The dropped calls that ran and had effects (what a branch must note or refuse)."""
    names = {c.id: c.name for m in dropped for c in m.tool_calls}
    back = {m.tool_call_id for m in kept if m.role == "tool"}
    return [
        m.tool_call_id
        for m in dropped
        if m.role == "tool"
        and m.tool_call_id
        and m.tool_call_id not in back
        and EFFECTS.get(names.get(m.tool_call_id, "look")) != "pure"
        and m.content.startswith(("put", "send"))  # it ran (a denied call's says why not)
    ]


def carried(messages: Sequence[Message]) -> list[Message]:
    return [m for m in messages if m.metadata.get("branch_note")]


class World:
    def __init__(self, policy: str) -> None:
        self.store = MemoryStore()
        self.rt = Runtime(store=self.store)
        self.agent = Agent(
            name="prop",
            model=FunctionModel(answer),
            tools=[look, put, send],
            branch_effects=policy,  # type: ignore[arg-type]
        )
        self.policy = policy
        self.waiting: dict[str, bool] = {}
        self.said = 0

    def text(self, calls: list[tuple[str, int]]) -> str:
        self.said += 1
        text = f"u{self.said}"
        SCRIPTS[text] = calls
        return text

    async def consistent(self, sid: str) -> list[Message]:
        stored = await self.store.load_messages(sid)
        assert stored == transcript(await self.store.load_events(sid))
        check_answered(stored, self.waiting.get(sid, False))
        return stored

    async def run(self, sid: str, inp: Any) -> None:
        result = await self.rt.run(self.agent, inp, session_id=sid)
        self.waiting[sid] = result.stop_reason == "awaiting_approval"


def expect_branch(
    old: list[Message], new: list[Message], target: list[Message], policy: str
) -> None:
    """``new`` is ``target`` (the kept prefix, or an event point's state), then the notes the
    dropped part carried, then a note of its effects (under ``note``), then (for a regenerate
    or an edit) the new turn."""
    at = 0
    for mine, theirs in zip(old, target, strict=False):
        if mine != theirs:
            break
        at += 1
    assert new[: len(target)] == target
    effects = dropped_effects(old[at:], target[at:])
    notes = [m for m in carried(old[at:]) if m not in target[at:]]
    rest = new[len(target) :]
    assert rest[: len(notes)] == notes
    fresh = rest[len(notes) :]
    noted = bool(fresh) and fresh[0].role == "system" and fresh[0].metadata.get("branch_note")
    assert bool(noted) == (bool(effects) and policy == "note"), (effects, fresh[:1])


@settings(
    max_examples=int(os.environ.get("LOOM_PROPERTY_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    policy=st.sampled_from(["note", "refuse", "allow"]),
    first=st.lists(calls_of, min_size=1, max_size=4),
    data=st.data(),
)
def test_branches_keep_the_transcript_the_journal_derives(
    policy: str, first: list[list[tuple[str, int]]], data: st.DataObject
) -> None:
    asyncio.run(_scenario(policy, first, data))


async def _scenario(policy: str, first: list[list[tuple[str, int]]], data: st.DataObject) -> None:
    w = World(policy)
    sid = "s"
    for calls in first:
        await w.run(sid, w.text(calls))
    await w.consistent(sid)
    forks: dict[str, list[Message]] = {}
    for _ in range(data.draw(st.integers(1, 5), label="operations")):
        old = await w.consistent(sid)
        events = await w.store.load_events(sid)
        starts = [i for i, m in enumerate(old) if m.role == "user"]
        op = data.draw(st.sampled_from(["rewind", "event", "regenerate", "edit", "fork", "say"]))
        target: list[Message]
        if op == "say":
            await w.run(sid, w.text(data.draw(calls_of)))
            assert (await w.consistent(sid))[: len(old)] == old
            continue
        if op == "rewind":
            n = data.draw(st.integers(0, len(starts)), label="turn")
            inp: Any = Rewind(AtTurn(n))
            target = old[: starts[n]] if n < len(starts) else list(old)
        elif op == "event":
            i = data.draw(st.integers(0, len(events) - 1), label="event")
            inp = Rewind(AtEvent(events[i].run_id, events[i].sequence))
            target = transcript(events[: i + 1])
        elif op == "regenerate":
            if not starts:
                continue
            inp = Regenerate()
            target = old[: starts[-1] + 1]
        elif op == "edit":
            if not starts:
                continue
            n = data.draw(st.integers(0, len(starts) - 1), label="edited turn")
            inp = Edit(n, w.text(data.draw(calls_of)))
            target = old[: starts[n]]
        else:
            n = data.draw(st.integers(0, len(starts)), label="fork turn")
            target = old[: starts[n]] if n < len(starts) else list(old)
            at: AtTurn | None = AtTurn(n) if n < len(starts) else None
            kept_at = len(target)
            effects = dropped_effects(old[kept_at:], [])
            try:
                fork = await w.rt.fork(w.agent, sid, at)
            except BranchRefused:
                assert policy == "refuse" and effects
                assert await w.consistent(sid) == old
                continue
            assert not (policy == "refuse" and effects)
            # a copy of a session waiting on a human waits too (the parked call comes along,
            # with its APPROVAL_REQUIRED in the shared journal)
            w.waiting[fork] = at is None and w.waiting.get(sid, False)
            forked = await w.consistent(fork)
            expect_branch(old, forked, target, policy)
            assert await w.consistent(sid) == old  # the source is unchanged
            forks[fork] = forked
            continue
        whole = not any(
            c.id not in {m.tool_call_id for m in target} for m in target for c in m.tool_calls
        )
        try:
            await w.run(sid, inp)
        except BranchRefused:
            assert policy == "refuse"
            assert dropped_effects(
                old[len(_common(old, target)) :], target[len(_common(old, target)) :]
            )
            assert await w.consistent(sid) == old and len(await w.store.load_events(sid)) == len(
                events
            )
            continue
        except BranchError as exc:
            said = str(exc)
            assert ("inside a step" in said and not whole) or (
                "already at that point" in said and target == old
            ), said
            assert await w.consistent(sid) == old and len(await w.store.load_events(sid)) == len(
                events
            )
            continue
        assert whole and (target != old or not isinstance(inp, Rewind))
        if policy == "refuse":  # it went through: nothing with effects was dropped
            common = _common(old, target)
            assert not dropped_effects(old[len(common) :], target[len(common) :])
        new = await w.consistent(sid)
        expect_branch(old, new, target, policy)
        if isinstance(inp, Edit):
            added = [m for m in new[len(target) :] if m.role == "user"]
            assert added and added[0].content == inp.text
    for fork, forked in forks.items():  # later operations on the source left forks alone
        assert await w.consistent(fork) == forked


def _common(old: list[Message], target: list[Message]) -> list[Message]:
    out = []
    for mine, theirs in zip(old, target, strict=False):
        if mine != theirs:
            break
        out.append(mine)
    return out

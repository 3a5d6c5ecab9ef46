"""The journal: the transcript derives from it; nothing is announced before it is committed."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loom import Agent, RunContext, ToolError, tool
from loom.engine.journal import transcript
from loom.engine.runtime import Runtime
from loom.errors import StoreError
from loom.events import AgentEvent, EventType
from loom.judge import FunctionJudge, JudgePanel
from loom.loop_detection import LOOP_WARNING
from loom.memory import MemoryConfig
from loom.messages import Message, ModelResponse, ToolCall
from loom.store import MemoryStore, SQLiteStore
from loom.testing import FunctionModel, ScriptedModel


def _key(m: Message) -> tuple[Any, ...]:
    return (
        m.role,
        m.content,
        [(c.id, c.name, c.arguments) for c in m.tool_calls],
        m.tool_call_id,
        m.name,
        m.metadata,
    )


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_replay_rebuilds_the_transcript(kind: str, tmp_path: Path) -> None:
    store: Any = MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "l.db")

    @tool(effect="pure")
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    @tool
    def fail() -> str:
        """Fail."""
        raise ToolError("nope\nmore detail", code="BAD")

    model = ScriptedModel(
        [
            ModelResponse(
                text="let me add",
                tool_calls=[
                    ToolCall(name="add", arguments={"a": 1, "b": 2}),
                    ToolCall(name="fail"),
                ],
            ),
            "three",
            ModelResponse(tool_calls=[ToolCall(name="add", arguments={"a": 2, "b": 2})]),
            "four",
        ]
    )
    agent = Agent(model=model, tools=[add, fail], store=store, max_iterations=5)
    await agent.run("1+2?", session_id="s")
    await agent.run("2+2?", session_id="s")
    stored = await store.load_messages("s")
    rebuilt = transcript(await store.load_events("s"))
    assert len(stored) == 9
    assert [_key(m) for m in rebuilt] == [_key(m) for m in stored]
    await store.close()


# -- persist before you announce (DESIGN principle 5) -------------------------------------------

# Event types that are steps: committed by ``Journal.commit`` before they go out. The others are
# announcements, emitted at once and journaled with the next commit.
STEP_TYPES = {
    EventType.AGENT_START,
    EventType.USER_MESSAGE,
    EventType.LLM_COMPLETE,
    EventType.TOOL_EXECUTION_START,
    EventType.TOOL_RESULT,
    EventType.TOOL_ERROR,
    EventType.APPROVAL_REQUIRED,
    EventType.APPROVAL_DECISION,
    EventType.JUDGE_RESULT,
    EventType.JUDGE_RETRY,
    EventType.OUTPUT_RETRY,
    EventType.MEMORY_RECORD,
    EventType.RUN_RECOVERED,
    EventType.AGENT_FINISH,
}


class FailingStore(MemoryStore):
    """Commits like MemoryStore, except that its ``fail_at``-th append raises ``StoreError``.
    ``committed`` holds (run_id, sequence) of every event of every successful append."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at, self.appends = fail_at, 0
        self.committed: set[tuple[str, int]] = set()
        self.steps: list[list[EventType]] = []  # the step events of each successful append

    async def append(self, session_id: str, **kw: Any) -> None:
        self.appends += 1
        if self.appends == self.fail_at:
            raise StoreError(f"disk full at append {self.fail_at}")
        await super().append(session_id, **kw)
        self.committed.update((e.run_id, e.sequence) for e in kw.get("events", ()))
        self.steps.append([e.type for e in kw.get("events", ()) if e.type in STEP_TYPES])


def _two_step_agent() -> Agent:
    @tool(effect="pure")
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    model = ScriptedModel(
        [
            ModelResponse(
                tool_calls=[
                    ToolCall(name="add", arguments={"a": 1, "b": 2}),
                    ToolCall(name="add", arguments={"a": 3, "b": 4}),
                ]
            ),
            "3 and 7",
        ]
    )
    return Agent(model=model, tools=[add])


@pytest.mark.parametrize("fail_at", range(1, 8))  # the run commits 7 times
async def test_no_step_event_leaves_before_its_commit(fail_at: int) -> None:
    store = FailingStore(fail_at)
    seen: list[AgentEvent] = []
    early: list[AgentEvent] = []

    def observe(event: AgentEvent) -> None:  # called at the instant the event goes out
        seen.append(event)
        if event.type in STEP_TYPES and (event.run_id, event.sequence) not in store.committed:
            early.append(event)

    runtime = Runtime(store, observers=[observe])
    with contextlib.suppress(StoreError):
        await runtime.run(_two_step_agent(), "go", session_id="s")
    assert store.appends >= fail_at  # the failure was reached
    assert early == [], f"announced before committed: {[e.type for e in early]}"
    assert any(e.type in STEP_TYPES for e in seen) or fail_at == 1


async def test_a_model_answer_with_calls_is_committed_with_their_start() -> None:
    """One commit (one fsync) for the answer and its calls' ``started`` rows; the answer is
    emitted only after it, and in journal order before the start events."""
    store = FailingStore(0)
    seen: list[EventType] = []
    await Runtime(store, observers=[lambda e: seen.append(e.type)]).run(
        _two_step_agent(), "go", session_id="s"
    )
    E = EventType
    assert store.steps[2] == [E.LLM_COMPLETE, E.TOOL_EXECUTION_START, E.TOOL_EXECUTION_START]
    assert len(store.steps) == 7
    stored = [e.type for e in await store.load_events("s")]
    assert stored.index(E.LLM_COMPLETE) < stored.index(E.TOOL_EXECUTION_START)
    assert seen.index(E.LLM_COMPLETE) < seen.index(E.TOOL_EXECUTION_START)
    # every event, held or sent while held, goes out in sequence order
    order = [e.sequence for e in await store.load_events("s") if e.type is not E.LLM_DELTA]
    assert order == sorted(order)


async def test_a_user_hook_between_answer_and_calls_gets_the_answer_committed_first() -> None:
    """A hook at ``after_llm_response`` or ``before_tool_execution`` may look at the
    transcript or act outside: the answer is committed (and emitted) before it runs."""
    store = FailingStore(0)
    committed_when_hook_ran: list[bool] = []

    class Peek:
        async def before_tool_execution(self, ctx: Any, call: ToolCall) -> None:
            committed_when_hook_ran.append(EventType.LLM_COMPLETE in store.steps[-1])

    agent = _two_step_agent().replace(hooks=[Peek()])
    await Runtime(store).run(agent, "go", session_id="s")
    assert committed_when_hook_ran == [True, True]
    assert store.steps[2] == [EventType.LLM_COMPLETE]


async def test_every_event_a_stream_consumer_saw_is_in_the_journal() -> None:
    store = MemoryStore()
    agent = _two_step_agent()
    seen = [e async for e in Runtime(store).stream(agent, "go", session_id="s")]
    stored = {(e.run_id, e.sequence) for e in await store.load_events("s")}
    missing = [
        e.type
        for e in seen
        if e.type is not EventType.LLM_DELTA and (e.run_id, e.sequence) not in stored
    ]
    assert missing == []


# -- journal ⇄ transcript, over random runs ----------------------------------------------------

TOOL_KINDS = ["ok", "fail", "slow", "ask", "hang"]


class Dying(MemoryStore):
    """A view of another store that a process can die in front of: once ``dead``, every write
    fails, as nothing reaches the disk after a SIGKILL."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner, self.dead = inner, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def append(self, session_id: str, **kw: Any) -> None:
        if self.dead:
            raise StoreError("the process is dead")
        await self.inner.append(session_id, **kw)

    async def renew_lease(self, lease: Any, ttl: float) -> Any:
        if self.dead:
            raise StoreError("the process is dead")
        return await self.inner.renew_lease(lease, ttl)

    async def release_lease(self, lease: Any) -> None:
        if self.dead:
            raise StoreError("the process is dead")
        await self.inner.release_lease(lease)


def _plan_model(plans: list[list[list[str]]]) -> FunctionModel:
    """Turn t (its user message says "turn t") answers with the batches of tool calls of
    ``plans[t]`` one model call after another, then with text."""

    def fn(messages: list[Message], tools: list[Any]) -> ModelResponse | str:
        start = max(
            i
            for i, m in enumerate(messages)
            if m.role == "user" and not m.metadata.get("judge_correction")
        )
        turn = int(messages[start].content.split()[1])
        done = sum(1 for m in messages[start:] if m.role == "assistant" and m.tool_calls)
        if messages[-1].role == "user" and messages[-1].metadata.get("judge_correction"):
            return f"turn {turn}, corrected"
        plan = plans[turn] if turn < len(plans) else []
        if done < len(plan):
            return ModelResponse(
                tool_calls=[ToolCall(name=k, arguments={"n": turn}) for k in plan[done]]
            )
        return f"turn {turn}, answered"

    return FunctionModel(fn)


def _key(m: Message) -> tuple[Any, ...]:
    return (m.role, m.content, [(c.id, c.name) for c in m.tool_calls], m.tool_call_id)


async def _scenario(
    plans: list[list[list[str]]], decisions: list[str], judge: list[bool], tight: bool = False
) -> Counter[EventType]:
    """Run the scenario; check the journal ⇄ transcript properties; return the event counts."""
    inner = MemoryStore()
    hang_started = asyncio.Event()

    @tool(effect="pure")
    def ok(n: int) -> str:
        """Works (with a long output when the window is tight, so that it fills)."""
        return f"{n} " + ("lorem ipsum dolor sit amet " * 30 if tight else "")

    @tool
    def fail(n: int) -> str:
        """Fails."""
        raise ToolError(f"failed {n}", code="BROKEN")

    @tool(timeout=0.01)
    async def slow(n: int) -> str:
        """Times out."""
        await asyncio.sleep(5)
        return "late"

    @tool
    def ask(n: int) -> str:
        """Needs approval."""
        return f"approved {n}"

    attempts: set[str] = set()

    @tool(effect="idempotent")
    async def hang(ctx: RunContext, n: int) -> str:
        """Its process dies while it runs; recovery re-runs it with the same key."""
        if ctx.idempotency_key in attempts:
            return "recovered"
        attempts.add(ctx.idempotency_key)
        hang_started.set()
        await asyncio.Event().wait()
        return "never"

    verdicts = iter(judge)

    def judge_fn(question: str, answer: str, ctx: Any) -> tuple[bool, str]:
        return (("corrected" in answer) or not next(verdicts, False), "add more detail")

    model = _plan_model(plans)
    summary = "Summary: the user asked for numbered turns; tools ran and answered. " * 3
    window: dict[str, Any] = (
        {
            "context_window": 1400,
            "reserved_output_tokens": 100,
            "memory": MemoryConfig(summarizer=FunctionModel(lambda m, t: summary)),
        }
        if tight
        else {}
    )
    agent = Agent(
        model=model,
        tools=[ok, fail, slow, ask, hang],
        max_iterations=12,
        permissions={"ask": ["ask"], "default": "allow"},
        judges=JudgePanel([FunctionJudge(judge_fn)], max_retries=2),
        **window,
    )

    async def step(call: Any) -> Any:
        """Run ``call(runtime)`` as a new process would; the process dies if hang starts."""
        dying = Dying(inner)
        hang_started.clear()
        task = asyncio.ensure_future(call(Runtime(dying, lease_ttl=0.05)))
        started = asyncio.ensure_future(hang_started.wait())
        await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
        started.cancel()
        if task.done():
            return task.result()
        dying.dead = True  # SIGKILL: nothing more reaches the store
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        await asyncio.sleep(0.06)  # the dead process's lease runs out
        return None

    for t in range(len(plans)):
        result = await step(lambda rt, t=t: rt.run(agent, f"turn {t}", session_id="s"))
        while result is not None and result.stop_reason == "awaiting_approval":
            how = decisions[t % len(decisions)]
            if how == "expire":  # the user sends the next message instead; it decides
                break
            result = await step(lambda rt, how=how: rt.resume(agent, "s", how == "approve"))
    final = await step(lambda rt: rt.run(agent, f"turn {len(plans)}", session_id="s"))
    assert final.stop_reason in ("completed", "max_iterations"), final.error

    events = await inner.load_events("s")
    stored = await inner.load_messages("s")
    assert [_key(m) for m in transcript(events)] == [_key(m) for m in stored]
    # one message per step that makes one, of the right kind
    kinds = Counter(e.type for e in events)
    roles = Counter(m.role for m in stored)
    corrections = sum(1 for m in stored if m.metadata.get("judge_correction"))
    assert roles["assistant"] == kinds[EventType.LLM_COMPLETE]
    assert roles["tool"] == kinds[EventType.TOOL_RESULT] + kinds[EventType.TOOL_ERROR]
    assert corrections == kinds[EventType.JUDGE_RETRY]
    assert roles["user"] - corrections == kinds[EventType.USER_MESSAGE] == len(plans) + 1
    asked = [c.id for m in stored if m.role == "assistant" for c in m.tool_calls]
    answered = [m.tool_call_id for m in stored if m.role == "tool"]
    assert sorted(asked) == sorted(answered), "every tool call answered exactly once"
    assert len(set(answered)) == len(answered)
    if tight:  # the builder may mask old outputs and summarise: the model saw a compiled view
        records = [m for m in stored if m.role == "system"]
        assert len(records) == kinds[EventType.MEMORY_RECORD]
        # summaries, flush markers and loop warnings (a call repeated too often) are records
        assert all(
            m.metadata.get("loom") in ("summary", "memory_flush") or LOOP_WARNING in m.metadata
            for m in records
        )
        return kinds
    # what the model was sent, call by call, is the transcript as it stood
    conversation = [_key(m) for m in stored if m.role != "system"]
    for call in model.calls:
        sent = [_key(m) for m in call.messages if m.role != "system"]
        assert sent == conversation[: len(sent)]
    return kinds


batches = st.lists(st.lists(st.sampled_from(TOOL_KINDS), min_size=1, max_size=3), max_size=3)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    plans=st.lists(batches, min_size=1, max_size=4),
    decisions=st.lists(st.sampled_from(["approve", "reject", "expire"]), min_size=1, max_size=3),
    judge=st.lists(st.booleans(), max_size=4),
    tight=st.booleans(),
)
def test_the_transcript_is_derived_from_the_journal_and_is_what_the_model_saw(
    plans: list[list[list[str]]], decisions: list[str], judge: list[bool], tight: bool
) -> None:
    asyncio.run(_scenario(plans, decisions, judge, tight))


def test_a_compressed_session_keeps_its_summaries_in_the_journal() -> None:
    # a fixed run long enough to compress (the property above compresses only sometimes)
    plans = [[["ok", "ok"], ["ok"]] for _ in range(6)]
    kinds = asyncio.run(_scenario(plans, ["approve"], [], tight=True))
    assert kinds[EventType.MEMORY_RECORD] >= 1 and kinds[EventType.COMPRESSION_COMPLETE] >= 1


KILL_CHILD = r"""
import asyncio, json, sys
from loom import Agent, ModelResponse, ToolCall, tool
from loom.engine.runtime import Runtime
from loom.store import SQLiteStore
from loom.testing import ScriptedModel

@tool(effect="pure")
def add(a: int, b: int) -> int:
    '''Add.'''
    return a + b

async def main() -> None:
    calls = [ToolCall(name="add", arguments={"a": i, "b": 1}) for i in range(3)]
    model = ScriptedModel([ModelResponse(tool_calls=calls[:2]), ModelResponse(tool_calls=calls[2:]),
                           "done"])
    runtime = Runtime(SQLiteStore(sys.argv[1]))
    async for e in runtime.stream(Agent(model=model, tools=[add]), "go", session_id="s"):
        print(json.dumps([str(e.type), e.run_id, e.sequence]), flush=True)

asyncio.run(main())
"""


@pytest.mark.slow
@pytest.mark.parametrize("kill_after", [1, 3, 6, 10, 14, 18])
def test_every_event_received_before_a_sigkill_is_in_the_store(
    tmp_path: Path, kill_after: int
) -> None:
    """A consumer that saw an event can rely on it: the process is killed right after the
    ``kill_after``-th event reached the parent, and every one of them is in the database."""
    import json
    import os
    import signal
    import sqlite3
    import subprocess
    import sys

    script = tmp_path / "child.py"
    script.write_text(KILL_CHILD)
    db = tmp_path / "k.db"
    src = str(Path(__file__).resolve().parents[2] / "src")
    child = subprocess.Popen(
        [sys.executable, str(script), str(db)],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=src),
    )
    assert child.stdout is not None
    received = []
    for line in child.stdout:
        received.append(json.loads(line))
        if len(received) == kill_after:
            child.send_signal(signal.SIGKILL)
            break
    child.wait(timeout=60)
    assert len(received) == kill_after, "the child ended before the kill point"
    with sqlite3.connect(db) as raw:
        stored = {(r, s) for r, s in raw.execute("SELECT run_id, sequence FROM events")}
    missing = [t for t, r, s in received if t != "llm_delta" and (r, s) not in stored]
    assert missing == []

"""How many commits a tool step costs, and what folding a result into the next commit keeps.

A run nobody watches live (no stream, no observer, no user hook) commits a ``pure`` or
``idempotent`` call's result with the next model answer: one ``Store.append`` per tool step.
An ``at_most_once`` result is committed as soon as it exists, and a watched run commits every
result at once, as before.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from loom import Agent, tool
from loom.engine.journal import PROGRESS_TYPES
from loom.engine.run_inputs import RunOptions
from loom.engine.runtime import Runtime
from loom.errors import StoreError
from loom.events import AgentEvent, EventType
from loom.messages import Message, ModelResponse, ToolCall
from loom.store import MemoryStore
from loom.testing import FunctionModel

E = EventType
STEPS = 3


class CountingStore(MemoryStore):
    """A MemoryStore that records each append's event types, and can fail the n-th one."""

    def __init__(self, fail_at: int = 0) -> None:
        super().__init__()
        self.fail_at = fail_at
        self.appends: list[list[EventType]] = []

    async def append(self, session_id: str, **kw: Any) -> None:
        if len(self.appends) + 1 == self.fail_at:
            self.fail_at = 0
            raise StoreError("disk full")
        await super().append(session_id, **kw)
        self.appends.append([e.type for e in kw.get("events", ())])


def _agent(effect: str, seen: list[list[str]] | None = None) -> Agent:
    @tool(effect=effect)  # type: ignore[arg-type]
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    def answer(messages: list[Message], tools: list[Any]) -> ModelResponse | str:
        if seen is not None:
            seen.append([m.content for m in messages if m.role == "tool"])
        done = sum(1 for m in messages if m.role == "tool")
        if done < STEPS:
            return ModelResponse(tool_calls=[ToolCall(name="add", arguments={"a": done, "b": 1})])
        return "done"

    return Agent(name="steps", model=FunctionModel(answer), tools=[add])


@pytest.mark.parametrize("effect", ["pure", "idempotent"])
async def test_a_quiet_tool_step_commits_once(effect: str) -> None:
    store = CountingStore()
    seen: list[list[str]] = []
    result = await Runtime(store).run(_agent(effect, seen), "go", session_id="s")
    assert result.output == "done"
    # AGENT_START, USER_MESSAGE, one commit per tool step, the answer, AGENT_FINISH
    assert len(store.appends) == 2 + STEPS + 1 + 1
    steps = store.appends[2 : 2 + STEPS]
    assert all(E.LLM_COMPLETE in s and E.TOOL_EXECUTION_START in s for s in steps)
    # each step after the first carries the result of the one before, in journal order
    for s in steps[1:]:
        assert s.index(E.TOOL_RESULT) < s.index(E.LLM_COMPLETE)
    # the model saw every result before its next answer (held, not yet committed)
    assert seen == [[], ["1"], ["1", "2"], ["1", "2", "3"]]
    stored = await store.load_messages("s")
    assert [m.role for m in stored] == ["user", *["assistant", "tool"] * STEPS, "assistant"]
    assert [m.role for m in result.messages] == [m.role for m in stored]


async def test_an_at_most_once_result_is_committed_before_the_next_model_call() -> None:
    store = CountingStore()
    await Runtime(store).run(_agent("at_most_once"), "go", session_id="s")
    assert len(store.appends) == 2 + 2 * STEPS + 1 + 1
    results = [s for s in store.appends if E.TOOL_RESULT in s]
    assert len(results) == STEPS
    assert all(E.LLM_COMPLETE not in s for s in results)


async def test_a_watched_run_commits_each_result_at_once() -> None:
    store = CountingStore()
    seen: list[AgentEvent] = []
    await Runtime(store, observers=[seen.append]).run(_agent("pure"), "go", session_id="s")
    assert len(store.appends) == 2 + 2 * STEPS + 1 + 1
    streamed = CountingStore()
    runtime = Runtime(streamed)
    async for _ in runtime.stream(_agent("pure"), "go", session_id="s"):
        pass
    assert len(streamed.appends) == 2 + 2 * STEPS + 1 + 1


async def test_a_held_result_lost_with_its_commit_is_answered_by_the_next_run() -> None:
    """The commit carrying a held result fails: the run ends, its runtime's cached transcript
    drops what never reached the store, and the next run answers the call exactly once."""
    store = CountingStore(fail_at=4)  # AGENT_START, USER_MESSAGE, step 1; step 2 fails
    runtime = Runtime(store)
    agent = _agent("pure")
    with contextlib.suppress(StoreError):
        await runtime.run(agent, "go", session_id="s")
    stored = await store.load_messages("s")
    assert [m.role for m in stored] == ["user", "assistant"]  # step 1's result was held
    view = await runtime.session_view("s")
    assert [m.role for m in view.messages] == ["user", "assistant"]
    result = await runtime.run(agent, "again", session_id="s")
    assert result.stop_reason == "completed"
    stored = await store.load_messages("s")
    asked = [c.id for m in stored for c in m.tool_calls]
    answered = [m.tool_call_id for m in stored if m.role == "tool"]
    assert sorted(asked) == sorted(answered) and len(set(answered)) == len(answered)
    recovered = [m for m in stored if m.metadata.get("recovered") == "rerun"]
    assert len(recovered) == 1 and recovered[0].content == "1"


FOLD_CHILD = r"""
import asyncio, os, signal, sys
from loom import Agent, ModelResponse, Runtime, ToolCall, tool
from loom.store import SQLiteStore
from loom.testing import FunctionModel

db, log, kill = sys.argv[1], sys.argv[2], sys.argv[3] == "kill"

@tool(effect="pure")
async def add(a: int, b: int) -> int:
    '''Add.'''
    with open(log, "a") as f:
        f.write(f"{a}\n")
    return a + b

def answer(messages, tools):
    start = max(i for i, m in enumerate(messages) if m.role == "user")
    done = sum(1 for m in messages[start:] if m.role == "tool")
    if kill and done == 1:  # step 1's result is held, in this model call's input only
        os.kill(os.getpid(), signal.SIGKILL)
    if done < 2:
        return ModelResponse(tool_calls=[ToolCall(name="add", arguments={"a": 10 + done, "b": 1})])
    return "done"

async def main():
    runtime = Runtime(SQLiteStore(db), lease_ttl=0.2)
    agent = Agent(model=FunctionModel(answer), tools=[add])
    result = await runtime.run(agent, "go", session_id="s")
    print(result.stop_reason)

asyncio.run(main())
"""


@pytest.mark.slow
def test_a_sigkill_before_a_held_result_is_committed_loses_only_what_nobody_saw(
    tmp_path: Any,
) -> None:
    """SIGKILL during the model call that saw a held (pure) result: the store has the call's
    ``started`` row and no result; the next process runs it again (a pure call may) and the
    transcript answers every call exactly once."""
    import os
    import sqlite3
    import subprocess
    import sys
    import time
    from pathlib import Path

    script, db, log = tmp_path / "child.py", tmp_path / "f.db", tmp_path / "ran.log"
    script.write_text(FOLD_CHILD)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = dict(os.environ, PYTHONPATH=src)
    killed = subprocess.run(
        [sys.executable, str(script), str(db), str(log), "kill"], env=env, timeout=60
    )
    assert killed.returncode == -9
    assert log.read_text().split() == ["10"]  # the call ran once before the kill
    with sqlite3.connect(db) as raw:
        roles = [r for (r,) in raw.execute("SELECT role FROM messages ORDER BY seq")]
        ledger = [s for (s,) in raw.execute("SELECT status FROM ledger ORDER BY seq")]
    assert roles == ["user", "assistant"]  # the held result died with the process
    assert ledger == ["started"]
    time.sleep(0.3)  # the dead process's lease runs out
    again = subprocess.run(
        [sys.executable, str(script), str(db), str(log), "live"],
        env=env,
        timeout=60,
        capture_output=True,
        text=True,
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "completed"
    assert log.read_text().split()[:2] == ["10", "10"]  # recovery ran the pure call again
    with sqlite3.connect(db) as raw:
        statuses = [s for (s,) in raw.execute("SELECT status FROM ledger ORDER BY seq")]
    assert statuses.count("started") == statuses.count("completed")

    async def transcript() -> list[Message]:
        from loom.store import SQLiteStore

        store = SQLiteStore(db)
        try:
            return await store.load_messages("s")
        finally:
            await store.close()

    import asyncio

    stored = asyncio.run(transcript())
    asked = [c.id for m in stored for c in m.tool_calls]
    answered = [m.tool_call_id for m in stored if m.role == "tool"]
    assert sorted(asked) == sorted(answered) and len(set(answered)) == len(answered)


async def test_a_quiet_run_builds_no_progress_notices() -> None:
    """Nobody watches a ``Runtime.run``: its state changes, iteration, context and recursion
    notices are neither built nor journaled; a tool step stores its steps and the notices
    that are not progress (``LLM_START``, ``LLM_TOOL_CALLS``) only."""
    store = CountingStore()
    result = await Runtime(store).run(_agent("pure"), "go", session_id="s")
    assert result.output == "done"
    stored = await store.load_events("s")
    assert not [e.type for e in stored if e.type in PROGRESS_TYPES]
    per_step = [s for s in store.appends[2 : 2 + STEPS]]
    for step in per_step[1:]:  # the previous call's result, then this step's answer and call
        assert sorted(step) == sorted(
            [
                E.TOOL_RESULT,
                E.LLM_START,
                E.LLM_COMPLETE,
                E.TOOL_EXECUTION_START,
            ]
        )
    # numbered without gaps: no number went to a notice nobody saw
    assert [e.sequence for e in stored] == list(range(len(stored)))


async def test_a_watched_run_still_announces_and_journals_its_progress_notices() -> None:
    store = CountingStore()
    seen: list[AgentEvent] = []
    await Runtime(store, observers=[seen.append]).run(_agent("pure"), "go", session_id="s")
    shown = {e.type for e in seen if e.type in PROGRESS_TYPES}
    assert {
        E.STATE_CHANGE,
        E.ITERATION_START,
        E.RECURSION,
        E.CONTEXT_ASSEMBLY_START,
        E.LLM_TOOL_CALLS,
    } <= shown
    stored = await store.load_events("s")
    journaled = [e for e in seen if e.type not in (E.LLM_DELTA, E.OUTPUT_PARTIAL)]
    assert stored == journaled  # everything it showed is in the journal, in order


async def test_a_run_followed_through_the_store_journals_its_progress_notices() -> None:
    """A queued worker's run has no live watcher, but the server streams it from the
    journal: ``RunOptions(progress=True)`` keeps its progress notices."""
    store = CountingStore()
    options = RunOptions(progress=True)
    await Runtime(store).run(_agent("pure"), "go", session_id="s", options=options)
    stored = {e.type for e in await store.load_events("s")}
    assert {E.STATE_CHANGE, E.ITERATION_START, E.RECURSION, E.LLM_TOOL_CALLS} <= stored


async def test_a_watcher_that_reads_only_steps_gets_no_progress_notice() -> None:
    """``RunOptions(progress=False)``: a watched run (a blocking server run whose stream modes
    show no notice) builds none; what it shows is still exactly what it journals."""
    store = CountingStore()
    seen: list[AgentEvent] = []
    options = RunOptions(progress=False)
    runtime = Runtime(store, observers=[seen.append])
    await runtime.run(_agent("pure"), "go", session_id="s", options=options)
    assert not [e.type for e in seen if e.type in PROGRESS_TYPES]
    assert {E.LLM_COMPLETE, E.TOOL_RESULT, E.AGENT_FINISH} <= {e.type for e in seen}
    assert await store.load_events("s") == seen

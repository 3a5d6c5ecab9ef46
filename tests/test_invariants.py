"""Property tests: every tool call gets exactly one result; the transcript only grows; after
every kind of write the stored messages are the transcript derived from the journal."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from loom import Agent, ModelResponse, ToolCall, ToolError, tool
from loom.engine.journal import transcript
from loom.engine.runtime import Runtime
from loom.events import EventType
from loom.judge import FunctionJudge, JudgePanel
from loom.memory import MemoryConfig, set_kernel
from loom.messages import Message
from loom.store import MemoryStore, SQLiteStore
from loom.testing import FunctionModel, ScriptedModel


@tool
async def work(ms: int) -> str:
    """Sleep ms milliseconds (negative: fail)."""
    if ms < 0:
        raise ValueError("negative")
    await asyncio.sleep(ms / 1000)
    return "ok"


call = st.one_of(
    st.builds(lambda ms: ToolCall(name="work", arguments={"ms": ms}), st.integers(-5, 30)),
    st.builds(lambda: ToolCall(name="missing")),
    st.builds(lambda: ToolCall(name="work", raw_arguments="{oops")),
    st.builds(lambda: ToolCall(name="work", arguments={"ms": "soon"})),
    st.builds(lambda: ToolCall(id="dup", name="work", arguments={"ms": 1})),  # ids may clash
)
response = st.one_of(
    st.builds(lambda cs: ModelResponse(tool_calls=cs), st.lists(call, min_size=1, max_size=4)),
    st.builds(lambda t: ModelResponse(text=t), st.text(min_size=1, max_size=20)),
)


def check_pairing(history: list[Message]) -> None:
    """Each assistant tool call is answered once, right after its message (ids are only
    unique within one answer: models reuse them across turns)."""
    answered = 0
    for i, m in enumerate(history):
        if m.role == "assistant" and m.tool_calls:
            ids = [c.id for c in m.tool_calls]
            assert len(set(ids)) == len(ids), "two calls of one answer share an id"
            following = history[i + 1 : i + 1 + len(ids)]
            assert sorted(f.tool_call_id or "" for f in following) == sorted(ids)
            assert all(f.role == "tool" for f in following)
            answered += len(ids)
    assert answered == sum(m.role == "tool" for m in history), "a result without a call"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=st.lists(st.lists(response, min_size=1, max_size=4), min_size=1, max_size=3),
    max_iterations=st.integers(1, 4),
    max_tool_calls=st.integers(1, 6),
    timeout=st.sampled_from([0.01, 0.05, 5.0]),
)
def test_every_call_has_one_result_and_the_transcript_only_grows(
    turns: list[list[ModelResponse]], max_iterations: int, max_tool_calls: int, timeout: float
) -> None:
    async def scenario() -> None:
        script = [r for turn in turns for r in turn]
        agent = Agent(
            model=ScriptedModel(script),
            tools=[work],
            max_iterations=max_iterations,
            max_tool_calls=max_tool_calls,
            timeout=timeout,
        )
        before: list[Message] = []
        for i in range(len(turns)):
            await agent.run(f"turn {i}", session_id="prop")
            history = await agent.store.load_messages("prop")
            assert history[: len(before)] == before, "the transcript was rewritten"
            check_pairing(history)
            assert await agent.store.open_tool_calls("prop") == []
            before = history

    asyncio.run(scenario())


# -- stored messages == transcript(stored events), after every kind of write --------------------


class Person(BaseModel):
    name: str
    age: int


async def _assert_transcript_is_the_journal(store: Any, session_id: str, after: str) -> None:
    stored = await store.load_messages(session_id)
    derived = transcript(await store.load_events(session_id))
    assert stored == derived, f"after {after}: stored messages differ from transcript(events)"


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_every_kind_of_write_keeps_the_stored_transcript_equal_to_the_journal(
    kind: str, tmp_path: Path
) -> None:
    store: Any = MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "t.db")
    runtime = Runtime(store)
    sid = "s"
    check = _assert_transcript_is_the_journal

    @tool(effect="pure")
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    @tool
    def fail() -> str:
        """Fail."""
        raise ToolError("broken", code="BROKEN")

    @tool
    def ask() -> str:
        """Needs approval."""
        return "asked"

    # a user message, an assistant message with calls, a tool result and a tool error
    tools = Agent(
        model=ScriptedModel(
            [
                ModelResponse(
                    tool_calls=[
                        ToolCall(name="add", arguments={"a": 1, "b": 2}),
                        ToolCall(name="fail"),
                    ]
                ),
                "three",
            ]
        ),
        tools=[add, fail],
    )
    await runtime.run(tools, "1+2?", session_id=sid)
    await check(store, sid, "a turn with a tool result and a tool error")

    # a Kernel entry set from code, and one removed
    await set_kernel(store, sid, "goal", "ship the release")
    await check(store, sid, "set_kernel")
    await set_kernel(store, sid, "goal", None)
    await check(store, sid, "set_kernel(None)")

    # a call parked for approval, then the human's decision (resume)
    asking = Agent(
        model=ScriptedModel([ModelResponse(tool_calls=[ToolCall(name="ask")]), "done"]),
        tools=[ask],
        permissions={"ask": ["ask"], "default": "allow"},
    )
    parked = await runtime.run(asking, "ask me", session_id=sid)
    assert parked.stop_reason == "awaiting_approval"
    await check(store, sid, "a call parked for approval")
    resumed = await runtime.resume(asking, sid, True)
    assert resumed.stop_reason == "completed"
    await check(store, sid, "resume with an approval decision")

    # a server query, then the client's answer
    def reader(messages: list[Message], specs: object) -> str:
        if messages[-1].metadata.get("server_query"):
            return "read it"
        return "I need to read src/main.rs first."

    querying = Agent(
        model=FunctionModel(reader), query_detector={"file_read": r"I need to read (?P<p>\S+)"}
    )
    asked = await runtime.run(querying, "what does main do?", session_id=sid)
    assert asked.stop_reason == "awaiting_input"
    await check(store, sid, "a server query")
    answered = await runtime.answer_query(querying, sid, "fn main() {}")
    assert answered.stop_reason == "completed"
    await check(store, sid, "the answer to a server query")

    # an answer that does not fit output_type, sent back (OUTPUT_RETRY), then one that does
    typed = Agent(
        model=ScriptedModel(['{"name": "Ada"}', '{"name": "Ada", "age": 36}']),
        output_type=Person,
    )
    person = await runtime.run(typed, "who?", session_id=sid)
    assert person.output == Person(name="Ada", age=36)
    await check(store, sid, "an output retry")

    # a judge's correction (JUDGE_RETRY)
    verdicts = iter([False, True])
    judged = Agent(
        model=ScriptedModel(["short", "longer and better"]),
        judges=JudgePanel(
            [FunctionJudge(lambda q, a, ctx: (next(verdicts), "add detail"))], max_retries=1
        ),
    )
    await runtime.run(judged, "explain", session_id=sid)
    await check(store, sid, "a judge retry")

    # summaries and flush markers of the memory stage (MEMORY_RECORD), over a tight window
    summary = "Summary: numbered turns were asked and answered. " * 3
    tight = Agent(
        model=FunctionModel(lambda m, t: "an answer " + "lorem ipsum dolor " * 20),
        context_window=1400,
        reserved_output_tokens=100,
        memory=MemoryConfig(summarizer=FunctionModel(lambda m, t: summary)),
    )
    for n in range(8):
        await runtime.run(tight, f"turn {n} " + "padding words " * 20, session_id=sid)
    events = await store.load_events(sid)
    assert any(
        e.type == EventType.MEMORY_RECORD and e.data["metadata"].get("loom") == "summary"
        for e in events
    ), "the window was meant to compress"
    await check(store, sid, "memory summaries")
    await store.close()

"""The segmented builder through the real loop: tiers, compression, fallback, masking, purity."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loom import Agent, EventType, Message, ModelResponse, ToolCall, tool
from loom.context import ContextRequest
from loom.errors import ConfigurationError
from loom.memory import MemoryConfig, SegmentedContextBuilder, describe_session, set_kernel
from loom.memory.compression import SEGMENTS
from loom.memory.tokens import MessageCounter, TiktokenCounter
from loom.store.memory import MemoryStore
from loom.testing import FunctionModel

E = EventType
COUNTER = TiktokenCounter("cl100k_base")


def turn_deps(agent: Any) -> dict[str, Any]:
    """What the runtime puts into a ContextRequest for ``agent``: its tool specs and model."""
    return {"tool_specs": agent.tool_specs, "model": agent.model}


@tool(effect="pure", blocking=False)
def fetch(n: int) -> str:
    """Return n words of data.

    Args:
        n: How many words.
    """
    return f"ref_{n:08d} " + " ".join(f"data{i}" for i in range(n))


def summary_text(messages: list[Message]) -> str:
    return "\n".join(f"## {s}\n{s.lower()} of the span" for s in SEGMENTS[:-1])


def is_summary_request(messages: list[Message]) -> bool:
    return bool(messages) and messages[0].content.startswith("You compress")


def scripted(size: int = 120):
    """Calls fetch(size) on every user message, then answers; summarises when asked."""

    def fn(messages: list[Message], tools: Any) -> ModelResponse | str:
        if is_summary_request(messages):
            return summary_text(messages)
        last = messages[-1]
        if last.role == "user" and "MEMORY.md" in last.content:
            return "NO_REPLY"
        if last.role == "user":
            return ModelResponse(tool_calls=[ToolCall(name="fetch", arguments={"n": size})])
        return "done: " + last.content[:20]

    return FunctionModel(fn)


def agent_with(model: Any, window: int = 2000, **cfg: Any) -> Agent:
    config = MemoryConfig(counter=COUNTER, retry_delays=(0.0,), memory_file=None, **cfg)
    return Agent(
        "t",
        "You are a test agent.",
        model=model,
        tools=[fetch],
        context_window=window,
        reserved_output_tokens=400,
        memory=config,
    )


async def run_turns(agent: Agent, n: int, session: str = "s") -> list[Any]:
    events = []
    for i in range(n):
        async for ev in agent.stream(f"turn {i}", session_id=session):
            events.append(ev)
    return events


def sent_tokens(messages: list[Message], agent: Agent) -> int:
    mc = MessageCounter(COUNTER)
    return mc.messages(messages) + mc.tools(agent.tool_specs)


async def test_every_call_fits_and_compression_events_are_emitted_in_order():
    model = scripted()
    agent = agent_with(model)
    events = await run_turns(agent, 25)
    for call in model.calls:
        assert sent_tokens(call.messages, agent) <= 1600
    types = [e.type for e in events]
    assert E.COMPRESSION_START in types and E.COMPRESSION_COMPLETE in types
    start = types.index(E.COMPRESSION_START)
    assert types[start + 1] is E.COMPRESSION_PROGRESS
    assert types.index(E.COMPRESSION_COMPLETE, start) < types.index(E.LLM_START, start)
    complete = next(e for e in events if e.type is E.COMPRESSION_COMPLETE)
    assert complete.data["method"] == "summary"
    assert complete.data["tokens_after"] < complete.data["tokens_before"]
    # LLM_START carries the real count of what was sent
    starts = [e for e in events if e.type is E.LLM_START]
    agent_calls = [c for c in model.calls if not is_summary_request(c.messages)]
    assert [e.data["token_estimate"] for e in starts] == [
        sent_tokens(c.messages, agent) for c in agent_calls
    ]


async def test_summary_is_persisted_and_the_stored_transcript_keeps_everything():
    model = scripted()
    agent = agent_with(model)
    await run_turns(agent, 25)
    stored = await agent.store.load_messages("s")
    summaries = [m for m in stored if m.metadata.get("loom") == "summary"]
    assert summaries and all(m.role == "system" for m in summaries)
    assert all(f"## {s}" in summaries[0].content for s in SEGMENTS)
    assert "covers conversation messages 0–" in summaries[0].content  # our Metadata segment
    # append-only: all 25 user messages are still in the transcript
    assert sum(1 for m in stored if m.role == "user") == 25
    # ... but the last call did not send the first turns verbatim
    last = [c for c in model.calls if not is_summary_request(c.messages)][-1].messages
    assert not any(m.role == "user" and m.content == "turn 0" for m in last)
    assert any(m.content.startswith("Summary of the earlier conversation") for m in last)


async def test_context_is_a_function_of_the_transcript():
    """A fresh builder (a restarted process) compiles the same context from the store."""
    model = scripted()
    agent = agent_with(model)
    await run_turns(agent, 20)
    history = await agent.store.load_messages("s")
    history.append(Message.user("one more"))
    live = await agent.runtime.builder_for(agent).build(
        ContextRequest(agent, history, "s", "r", 1, "x", **turn_deps(agent))
    )
    fresh_builder = SegmentedContextBuilder(
        agent.memory, context_window=2000, reserved_output_tokens=400
    )
    roundtrip = [Message.model_validate_json(m.model_dump_json()) for m in history]
    fresh = await fresh_builder.build(
        ContextRequest(agent, roundtrip, "s", "r", 1, "x", **turn_deps(agent))
    )
    assert [(m.role, m.content) for m in fresh.messages] == [
        (m.role, m.content) for m in live.messages
    ]
    assert fresh.persist == [] and live.persist == []  # nothing left to compress


async def test_summariser_failures_retry_with_backoff_then_fall_back():
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    def fn(messages: list[Message], tools: Any) -> ModelResponse | str:
        if is_summary_request(messages):
            raise RuntimeError("summariser is down")
        return scripted().fn(messages, tools)  # type: ignore[return-value]

    model = FunctionModel(fn)
    config = MemoryConfig(counter=COUNTER, memory_file=None, sleep=sleep)
    agent = Agent(
        "t",
        "You are a test agent.",
        model=model,
        tools=[fetch],
        context_window=2000,
        reserved_output_tokens=400,
        memory=config,
    )
    events = await run_turns(agent, 25)
    progress = [e.data for e in events if e.type is E.COMPRESSION_PROGRESS]
    assert [p["status"] for p in progress[:5]] == [
        "attempt",
        "retry",
        "attempt",
        "retry",
        "attempt",
    ]
    assert waits[:2] == [1.0, 2.0]
    fallback = next(e for e in events if e.type is E.COMPRESSION_FALLBACK)
    assert fallback.data["fallback_method"] == "sliding_window"
    assert "summariser is down" in fallback.data["reason"]
    complete = next(e for e in events if e.type is E.COMPRESSION_COMPLETE)
    assert complete.data["method"] == "sliding_window"
    for call in model.calls:
        if not is_summary_request(call.messages):
            assert sent_tokens(call.messages, agent) <= 1600


@pytest.mark.parametrize("answer", ["", "   ", "NO_REPLY"])
async def test_unusable_summary_falls_back(answer):
    def fn(messages: list[Message], tools: Any) -> ModelResponse | str:
        if is_summary_request(messages):
            return (
                ModelResponse(text=answer)
                if answer.strip()
                else ModelResponse(tool_calls=[ToolCall(name="fetch", arguments={"n": 1})])
            )
        return scripted().fn(messages, tools)  # type: ignore[return-value]

    agent = agent_with(FunctionModel(fn))
    events = await run_turns(agent, 25)
    assert any(e.type is E.COMPRESSION_FALLBACK for e in events)
    result = await agent.run("and now?", session_id="s")
    assert result.stop_reason == "completed"


async def test_old_tool_outputs_are_masked_before_summarising_and_keep_their_reference():
    model = scripted(size=150)
    agent = agent_with(model, window=3000, keep_tool_outputs=2)
    await run_turns(agent, 14)
    masked_seen = False
    for call in model.calls:
        tool_msgs = [m for m in call.messages if m.role == "tool"]
        masked = [m for m in tool_msgs if m.content.startswith("[older fetch output masked")]
        if masked:
            masked_seen = True
            verbatim = [m for m in tool_msgs if m not in masked]
            assert len(verbatim) >= 2  # the newest outputs stay verbatim
            assert all("ref_00000150" in m.content for m in masked)  # reference kept
            assert all(len(m.content.splitlines()) == 1 for m in masked)
        if is_summary_request(call.messages):
            # the summariser sees masked outputs, not the full data
            assert "data149" not in call.messages[1].content.split("[user] turn")[1]
    assert masked_seen


async def test_a_message_larger_than_the_whole_budget_is_truncated_with_a_marker():
    model = FunctionModel(lambda m, t: "ok")
    agent = agent_with(model, window=1000)
    huge = "lorem ipsum dolor " * 3000
    await agent.run(huge, session_id="big")
    sent = model.calls[0].messages
    user = next(m for m in sent if m.role == "user")
    assert "truncated to fit the context window" in user.content
    assert len(user.content) < len(huge)
    assert sent_tokens(sent, agent) <= 600


def test_window_smaller_than_rom_plus_reserve_is_an_error_naming_the_numbers():
    with pytest.raises(ConfigurationError) as err:
        Agent(
            "t",
            "Be thorough. " * 200,
            model=FunctionModel(lambda m, t: "x"),
            context_window=500,
            reserved_output_tokens=200,
        )
    text = str(err.value)
    assert "context_window=500" in text and "reserved_output_tokens=200" in text
    assert "system prompt takes" in text


def test_window_of_the_model_object_is_used():
    class Windowed(FunctionModel):
        context_window = 300

    with pytest.raises(ConfigurationError, match="context_window=300"):
        Agent("t", "Be thorough. " * 100, model=Windowed(lambda m, t: "x"))


async def test_kernel_from_tool_and_api_survives_compaction():
    def fn(messages: list[Message], tools: Any) -> ModelResponse | str:
        if is_summary_request(messages):
            return summary_text(messages)
        last = messages[-1]
        if last.role == "user" and last.content == "my name is Ada":
            return ModelResponse(
                tool_calls=[
                    ToolCall(name="remember", arguments={"key": "user_name", "value": "Ada"})
                ]
            )
        return scripted().fn(messages, tools)  # type: ignore[return-value]

    model = FunctionModel(fn)
    agent = agent_with(model, tools=True)
    assert "remember" in agent.tools
    await agent.run("my name is Ada", session_id="k")
    await set_kernel(agent.store, "k", "goal", "ship the release")
    await run_turns(agent, 25, session="k")
    last = [c for c in model.calls if not is_summary_request(c.messages)][-1].messages
    kernel = [m for m in last if m.content.startswith("Session context (Kernel)")]
    assert kernel and "user_name: Ada" in kernel[0].content
    assert "goal: ship the release" in kernel[0].content
    assert not any(m.content == "my name is Ada" for m in last)  # the turn itself is gone
    await set_kernel(agent.store, "k", "goal", None)
    await agent.run("again", session_id="k")
    last = model.calls[-1].messages
    assert "goal" not in next(m for m in last if m.content.startswith("Session context")).content


async def test_l2_is_merged_when_over_its_budget():
    model = scripted()
    agent = agent_with(model, l2_tokens=200)
    events = await run_turns(agent, 60)
    starts = [e.data for e in events if e.type is E.COMPRESSION_START]
    assert any(s["kind"] == "merge" for s in starts)
    stored = await agent.store.load_messages("s")
    merges = [m for m in stored if m.metadata.get("method") == "merge"]
    assert merges and merges[0].metadata["covers_from"] == 0


async def test_component_decisions_are_emitted():
    agent = agent_with(scripted(), window=2000)
    events = await run_turns(agent, 1)
    included = [e.data["component"] for e in events if e.type is E.CONTEXT_COMPONENT_INCLUDED]
    assert {"system", "tools", "history"} <= set(included)
    first = next(e for e in events if e.type is E.CONTEXT_COMPONENT_INCLUDED)
    assert first.data["priority"] == 100 and first.data["tokens"] > 0


async def test_patterns_in_extra_system_are_truncated_to_the_rom_budget():
    agent = agent_with(scripted(), window=2000, rom_tokens=100)
    builder = agent.runtime.builder_for(agent)
    long_patterns = ["pattern: " + "use small steps " * 200]
    ctx = await builder.build(
        ContextRequest(
            agent,
            [Message.user("hi")],
            "p",
            "r",
            1,
            "hi",
            extra_system=long_patterns,
            **turn_deps(agent),
        )
    )
    truncated = [d for t, d in ctx.notes if t is E.CONTEXT_COMPONENT_TRUNCATED]
    assert truncated and truncated[0]["component"] == "patterns"
    assert COUNTER.count(ctx.messages[0].content) <= 100


class JsonStore(MemoryStore):
    """A store that round-trips every message through JSON, like a database would."""

    async def load_messages(self, session_id: str) -> list[Message]:
        return [
            Message.model_validate(json.loads(m.model_dump_json()))
            for m in await super().load_messages(session_id)
        ]


async def test_works_with_a_store_that_returns_new_objects():
    model = scripted()
    config = MemoryConfig(counter=COUNTER, retry_delays=(0.0,), memory_file=None)
    agent = Agent(
        "t",
        "You are a test agent.",
        model=model,
        tools=[fetch],
        context_window=2000,
        reserved_output_tokens=400,
        memory=config,
        store=JsonStore(),
    )
    events = await run_turns(agent, 25)
    assert any(e.type is E.COMPRESSION_COMPLETE for e in events)
    for call in model.calls:
        assert sent_tokens(call.messages, agent) <= 1600


async def test_describe_session_reports_the_tiers():
    agent = agent_with(scripted(), tools=True)
    await agent.run("hello", session_id="d")
    await set_kernel(agent.store, "d", "user_name", "Ada")
    await run_turns(agent, 25, session="d")
    report = await describe_session(agent.store, "d", agent)
    tiers = {t.name: t for t in report.tiers}
    assert set(tiers) == {"ROM", "MEMORY.md", "Kernel", "L2", "L1"}
    assert tiers["Kernel"].items == 1 and tiers["Kernel"].tokens > 0
    assert tiers["L2"].items >= 1 and tiers["L2"].tokens > 0
    assert report.budget == 1600 and report.context_window == 2000
    assert report.transcript_messages == len(await agent.store.load_messages("d"))
    assert report.rows()[0][0] == "ROM"
    from loom.errors import SessionNotFound

    with pytest.raises(SessionNotFound):
        await describe_session(agent.store, "nope", agent)

"""MEMORY.md: loading, the MEMORY_FLUSH flow, the memory tools."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loom import Agent, EventType, Message, ModelResponse, ToolCall
from loom.memory import MemoryConfig
from loom.memory.compression import FLUSH_SYSTEM, FLUSH_USER, SEGMENTS, _with_metadata
from loom.memory.tokens import TiktokenCounter
from loom.testing import FunctionModel

E = EventType
COUNTER = TiktokenCounter("cl100k_base")


def chatty(note: str | None):
    """Answers with 80 words; writes ``note`` when asked to flush (else NO_REPLY)."""

    def fn(messages: list[Message], tools: Any) -> ModelResponse | str:
        if messages[0].content.startswith("You compress"):
            return "## Task Overview\nchatting\n## Progress\nmany turns"
        if messages[-1].content == FLUSH_USER:
            assert messages[-2].content == FLUSH_SYSTEM and [t.name for t in tools] == [
                "memory_write"
            ]
            if note is None:
                return "NO_REPLY"
            return ModelResponse(
                tool_calls=[ToolCall(name="memory_write", arguments={"note": note})]
            )
        return "answer " + " ".join(f"w{i}" for i in range(80))

    return FunctionModel(fn)


def agent_in(ws: Path, model: Any, **cfg: Any) -> Agent:
    return Agent(
        "m",
        "You remember things.",
        model=model,
        workspace=ws,
        context_window=2000,
        reserved_output_tokens=400,
        memory=MemoryConfig(counter=COUNTER, retry_delays=(0.0,), **cfg),
    )


async def test_missing_memory_file_is_empty_memory(tmp_path):
    model = chatty(None)
    agent = agent_in(tmp_path, model)
    result = await agent.run("hi", session_id="s")
    assert result.stop_reason == "completed"
    assert not any("MEMORY.md" in m.content for m in model.calls[0].messages)


async def test_memory_file_is_loaded_into_the_context(tmp_path):
    (tmp_path / "MEMORY.md").write_text("# MEMORY\n\n- The deploy key lives in vault/ops.\n")
    model = chatty(None)
    await agent_in(tmp_path, model).run("hi", session_id="s")
    system = [m for m in model.calls[0].messages if m.role == "system"]
    assert any("deploy key lives in vault/ops" in m.content for m in system)


async def test_flush_writes_notes_once_per_cycle_before_compaction(tmp_path):
    model = chatty("User prefers metric units.")
    agent = agent_in(tmp_path, model)
    events = []
    for i in range(30):
        async for ev in agent.stream(f"question {i}", session_id="s"):
            events.append(ev)
    flushes = [e for e in events if e.type is E.MEMORY_FLUSH]
    compactions = [e for e in events if e.type is E.COMPRESSION_COMPLETE]
    assert flushes and compactions
    assert flushes[0].data["status"] == "written" and flushes[0].data["notes"] == 1
    cycles = [f.data["cycle"] for f in flushes]
    assert len(cycles) == len(set(cycles))  # once per compaction cycle
    types = [e.type for e in events]
    assert types.index(E.MEMORY_FLUSH) < types.index(E.COMPRESSION_START)
    text = (tmp_path / "MEMORY.md").read_text()
    assert "- User prefers metric units." in text
    # the note is in the context after the compaction
    last = model.calls[-1].messages
    assert any("User prefers metric units." in m.content for m in last if m.role == "system")
    # flush markers are bookkeeping in the transcript
    stored = await agent.store.load_messages("s")
    assert sum(m.metadata.get("loom") == "memory_flush" for m in stored) == len(flushes)


async def test_no_reply_is_suppressed(tmp_path):
    model = chatty(None)
    agent = agent_in(tmp_path, model)
    outputs, flushes = [], []
    for i in range(30):
        result = await agent.run(f"question {i}", session_id="s")
        outputs.append(result.output)
        events = await agent.store.load_events("s", result.run_id)
        flushes += [e for e in events if e.type is E.MEMORY_FLUSH]
    assert flushes and all(f.data["status"] == "no_reply" for f in flushes)
    assert not any("NO_REPLY" in o for o in outputs)
    assert not (tmp_path / "MEMORY.md").exists()
    stored = await agent.store.load_messages("s")
    assert not any(m.role == "assistant" and "NO_REPLY" in m.content for m in stored)


async def test_flush_failure_does_not_fail_the_turn(tmp_path):
    def fn(messages: list[Message], tools: Any) -> str:
        if messages[-1].content == FLUSH_USER:
            raise RuntimeError("model hiccup")
        if messages[0].content.startswith("You compress"):
            return "## Progress\nfine"
        return "answer " + " ".join(f"w{i}" for i in range(80))

    agent = agent_in(tmp_path, FunctionModel(fn))
    statuses = []
    for i in range(30):
        result = await agent.run(f"q {i}", session_id="s")
        assert result.stop_reason == "completed"
        events = await agent.store.load_events("s", result.run_id)
        statuses += [e.data["status"] for e in events if e.type is E.MEMORY_FLUSH]
    assert statuses and set(statuses) == {"failed"}


async def test_memory_write_tool_appends_to_the_workspace_file(tmp_path):
    model = FunctionModel(
        lambda m, t: (
            ModelResponse(
                tool_calls=[
                    ToolCall(
                        name="memory_write", arguments={"note": "Prod DB is read-only on Fridays."}
                    )
                ]
            )
            if m[-1].role == "user"
            else "saved"
        )
    )
    agent = Agent("m", "x", model=model, tools=["memory_write"], workspace=tmp_path)
    assert (await agent.run("remember this")).output == "saved"
    assert "- Prod DB is read-only on Fridays." in (tmp_path / "MEMORY.md").read_text()


async def test_memory_write_without_a_workspace_tells_the_model(tmp_path):
    model = FunctionModel(
        lambda m, t: (
            ModelResponse(tool_calls=[ToolCall(name="memory_write", arguments={"note": "x"})])
            if m[-1].role == "user"
            else "ok"
        )
    )
    agent = Agent("m", "x", model=model, tools=["memory_write"])
    await agent.run("remember this")
    tool_msg = next(m for m in model.calls[-1].messages if m.role == "tool")
    assert "no workspace" in tool_msg.content


def test_summary_metadata_segment_is_ours():
    text = _with_metadata("## Task Overview\nx\n## Metadata\nmodel invented this", "- covers 0–9")
    assert "model invented this" not in text and text.endswith("## Metadata\n- covers 0–9")
    assert SEGMENTS[-1] == "Metadata" and len(SEGMENTS) == 8

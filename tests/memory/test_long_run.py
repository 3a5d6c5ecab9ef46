"""The issue's acceptance run: 500 scripted turns, varied tool outputs, a 4k window."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from loom import Agent, EventType, Message, ModelResponse, ToolCall, tool
from loom.memory import MemoryConfig
from loom.memory.compression import FLUSH_USER, SEGMENTS
from loom.memory.tokens import MessageCounter, TiktokenCounter
from loom.testing import FunctionModel

E = EventType
COUNTER = TiktokenCounter("cl100k_base")
SIZES = (3, 40, 250, 900, 15, 120)


@tool(effect="pure", blocking=False)
def fetch(n: int, topic: str) -> str:
    """Fetch n lines about a topic.

    Args:
        n: Lines wanted.
        topic: What about.
    """
    return f"ref_{topic}_{n:06d}\n" + "\n".join(
        f"{topic} fact {i}: value {i * 7}" for i in range(n)
    )


def model_fn(messages: list[Message], tools: Any) -> ModelResponse | str:
    first, last = messages[0], messages[-1]
    if first.content.startswith("You compress"):
        turns = re.findall(r"\[user\] turn (\d+)", last.content)
        span = f"turns {turns[0]}–{turns[-1]}" if turns else "earlier summaries"
        return "\n".join(f"## {s}\n{s}: {span}" for s in SEGMENTS[:-1])
    system = "\n".join(m.content for m in messages if m.role == "system")
    if last.content == FLUSH_USER:
        said = any("favourite colour is teal" in m.content for m in messages if m.role == "user")
        if said and "teal" not in system:
            return ModelResponse(
                tool_calls=[
                    ToolCall(
                        name="memory_write",
                        arguments={"note": "The user's favourite colour is teal."},
                    )
                ]
            )
        return "NO_REPLY"
    if last.role == "tool":
        return f"Noted {len(last.content)} characters."
    n = int(re.match(r"turn (\d+)", last.content).group(1))  # type: ignore[union-attr]
    if "favourite colour?" in last.content:
        found = (
            "teal"
            if "teal" in system or any("teal" in m.content for m in messages if m.role == "user")
            else "unknown"
        )
        return f"Your favourite colour is {found}."
    if n % 7 == 3:
        return f"Plain answer to turn {n}."
    return ModelResponse(
        tool_calls=[
            ToolCall(name="fetch", arguments={"n": SIZES[n % len(SIZES)], "topic": f"t{n}"})
        ]
    )


def user_message(i: int) -> str:
    if i == 0:
        return "turn 0: hello, my favourite colour is teal."
    if i % 50 == 49:
        return f"turn {i}: what is my favourite colour?"
    return f"turn {i}: please look up topic t{i}."


async def test_500_turns_in_a_4k_window(tmp_path: Path):
    model = FunctionModel(model_fn)
    agent = Agent(
        "long",
        "You are a research assistant. Use fetch to look things up.",
        model=model,
        tools=[fetch],
        workspace=tmp_path,
        context_window=4096,
        reserved_output_tokens=512,
        memory=MemoryConfig(counter=COUNTER, retry_delays=(0.0,)),
    )
    counts: dict[EventType, int] = {}
    answers = {}
    for i in range(500):
        result = None
        async for ev in agent.stream(user_message(i), session_id="long"):
            counts[ev.type] = counts.get(ev.type, 0) + 1
        result = (await agent.store.load_messages("long"))[-1]
        if i % 50 == 49:
            answers[i] = result.content
    budget = 4096 - 512
    fresh = MessageCounter(TiktokenCounter("cl100k_base"))
    sent = [fresh.messages(c.messages) + fresh.tools(c.tools) for c in model.calls]
    assert len(sent) > 900
    assert max(sent) <= budget
    for kind in (
        E.COMPRESSION_START,
        E.COMPRESSION_PROGRESS,
        E.COMPRESSION_COMPLETE,
        E.MEMORY_FLUSH,
    ):
        assert counts.get(kind, 0) > 0, kind
    assert counts[E.AGENT_FINISH] == 500 and counts.get(E.ERROR, 0) == 0
    # the note written before the first compaction is still known 500 turns later
    memory = (tmp_path / "MEMORY.md").read_text()
    assert memory.count("favourite colour is teal") == 1
    assert all(a == "Your favourite colour is teal." for a in answers.values()), answers
    last_call = [c for c in model.calls if not c.messages[0].content.startswith("You compress")][-1]
    assert not any(
        "favourite colour is teal" in m.content for m in last_call.messages if m.role == "user"
    )  # turn 0 itself is long gone from the context
    stored = await agent.store.load_messages("long")
    assert sum(m.role == "user" for m in stored) == 500  # the transcript keeps everything

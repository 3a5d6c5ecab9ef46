"""The Anthropic provider, replaying streamed Messages API responses through the SDK's HTTP
transport (``httpx2.MockTransport``): no Anthropic server exists offline. The transcripts in
``recordings/`` are in the API's wire format (``event:`` / ``data:`` lines, including a
``tool_use`` whose input JSON arrives over several ``input_json_delta`` events)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import pytest
from pydantic import BaseModel

from loom import Agent
from loom.errors import ContextTooLong, MissingDependencyError, ModelAuthError, ModelUnavailable
from loom.events import EventType
from loom.messages import Message, ModelResponse, ToolCall, ToolResult, Usage
from loom.models import resolve_model
from loom.models.anthropic import OUTPUT_TOOL, AnthropicModel, to_anthropic_messages
from loom.models.base import ModelSettings, RetryNotice, StreamPart, TextDelta
from loom.models.resilience import CircuitBreaker, RetryPolicy
from loom.tools.basic import add, multiply

RECORDINGS = Path(__file__).parent / "recordings"


def recording(name: str) -> bytes:
    return (RECORDINGS / f"anthropic_{name}.sse").read_bytes()


class Replay:
    """Answers each request with the next scripted (status, body, headers); records requests."""

    def __init__(self, *answers: tuple[int, bytes] | tuple[int, bytes, dict[str, str]]) -> None:
        self.answers = list(answers)
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(json.loads(request.content))
        status, body, *rest = self.answers.pop(0)
        headers = {
            "content-type": "text/event-stream" if status == 200 else "application/json",
            **(rest[0] if rest else {}),
        }
        return httpx2.Response(status, content=body, headers=headers)

    def model(self, **kw: Any) -> AnthropicModel:
        kw.setdefault("retry", RetryPolicy(initial_delay=0.01, max_delay=0.02))
        kw.setdefault("breaker", CircuitBreaker("anthropic-test", failure_threshold=100))
        return AnthropicModel(
            "claude-opus-4-6",
            api_key="sk-test",
            base_url="http://replay.invalid",
            http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(self)),
            **kw,
        )


def error_body(kind: str, message: str) -> bytes:
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


async def collect(
    model: AnthropicModel,
    messages: list[Message] | None = None,
    tools: Any = (),
    settings: ModelSettings | None = None,
) -> list[StreamPart]:
    parts: list[StreamPart] = []
    try:
        async for p in model.stream(messages or [Message.user("hi")], list(tools), settings):
            parts.append(p)
    except Exception as exc:
        exc.parts = parts  # type: ignore[attr-defined]
        raise
    return parts


async def test_a_tool_use_split_across_input_json_deltas() -> None:
    replay = Replay((200, recording("tool_use")))
    parts = await collect(replay.model(), tools=[add.spec()])
    final = parts[-1]
    assert isinstance(final, ModelResponse)
    assert final.text == "Let me add those for you."
    assert [(c.id, c.name, c.arguments) for c in final.tool_calls] == [
        ("toolu_01T1x1fJ34qAmk2tNTrN7Up6", "add", {"a": 17, "b": 25})
    ]
    assert final.finish_reason == "tool_calls"
    assert final.usage is not None
    assert (final.usage.input_tokens, final.usage.output_tokens) == (472, 89)
    assert [p.text for p in parts if isinstance(p, TextDelta)] == ["Let me add", " those for you."]
    # the input JSON arrived over several events; it is assembled, not streamed as parts
    assert recording("tool_use").count(b'"type":"input_json_delta"') >= 4
    assert all(isinstance(p, TextDelta) for p in parts[:-1])


async def test_parallel_tool_uses_and_cached_input_tokens() -> None:
    replay = Replay((200, recording("parallel_tools")), (200, recording("text")))
    model = replay.model()
    final = (await collect(model, tools=[add.spec(), multiply.spec()]))[-1]
    assert isinstance(final, ModelResponse)
    assert [(c.name, c.arguments, c.raw_arguments) for c in final.tool_calls] == [
        ("add", {"a": 2, "b": 3}, None),
        ("multiply", {}, '{"a": 4, "b": 5'),  # the recording's JSON is cut: kept for the model
    ]
    text = (await collect(model))[-1]
    assert isinstance(text, ModelResponse) and text.usage is not None
    assert text.usage.input_tokens == 630  # 530 fresh + 100 read from the prompt cache


def test_system_prompt_tool_use_and_merged_tool_results() -> None:
    a = ToolCall(id="toolu_a", name="add", arguments={"a": 1, "b": 2})
    b = ToolCall(id="toolu_b", name="add", arguments={"a": 3, "b": 4})
    system, messages = to_anthropic_messages(
        [
            Message.system("You add."),
            Message.user("sums?"),
            Message.assistant("On it.", tool_calls=[a, b]),
            Message.tool(ToolResult(tool_call_id="toolu_a", name="add", data=3)),
            Message.tool(
                ToolResult(
                    tool_call_id="toolu_b",
                    name="add",
                    success=False,
                    error_code="boom",
                    error_message="failed",
                )
            ),
            Message.system("Be brief."),
        ]
    )
    assert system == "You add.\n\nBe brief."
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == [
        {"type": "text", "text": "On it."},
        {"type": "tool_use", "id": "toolu_a", "name": "add", "input": {"a": 1, "b": 2}},
        {"type": "tool_use", "id": "toolu_b", "name": "add", "input": {"a": 3, "b": 4}},
    ]
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_a", "content": "3"},
        {
            "type": "tool_result",
            "tool_use_id": "toolu_b",
            "content": "Error (boom): failed",
            "is_error": True,
        },
    ]


async def test_a_tool_round_trip_through_the_agent() -> None:
    replay = Replay((200, recording("tool_use")), (200, recording("text")))
    agent = Agent(
        name="calc",
        instructions="You add numbers.",
        model=replay.model(),
        tools=["add"],
        # prompt caching off: the request has the plain form (see the breakpoint tests below)
        model_settings=ModelSettings(max_tokens=300, tool_choice="auto", prompt_cache=False),
    )
    result = await agent.run("What is 17 + 25?")
    assert result.stop_reason == "completed"
    assert result.output == "17 + 25 is 42."
    first, second = replay.requests
    assert first["system"] == "You add numbers."
    assert first["max_tokens"] == 300 and first["stream"] is True
    assert first["tool_choice"] == {"type": "auto"}
    assert first["tools"][0]["name"] == "add" and "input_schema" in first["tools"][0]
    assert second["messages"][-1] == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                "content": "42",
            }
        ],
    }
    assert result.usage.input_tokens == 472 + 630


@pytest.mark.parametrize(
    ("choice", "wire"),
    [("add", {"type": "tool", "name": "add"}), ("required", {"type": "any"})],
)
async def test_a_forced_first_call_then_auto(choice: str, wire: dict[str, str]) -> None:
    replay = Replay((200, recording("tool_use")), (200, recording("text")))
    agent = Agent(
        model=replay.model(),
        tools=["add"],
        model_settings=ModelSettings(max_tokens=300, tool_choice=choice),
    )
    result = await agent.run("What is 17 + 25?")
    assert result.stop_reason == "completed"
    assert [r["tool_choice"] for r in replay.requests] == [wire, {"type": "auto"}]


async def test_a_missing_key_names_the_variable() -> None:
    with pytest.raises(ModelAuthError, match="ANTHROPIC_API_KEY"):
        resolve_model("anthropic:claude-opus-4-6")


def test_a_missing_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "anthropic", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'loom-agents\[anthropic\]'"):
        resolve_model("anthropic:claude-opus-4-6")


async def test_a_rejected_key_is_an_auth_error_and_not_retried() -> None:
    replay = Replay((401, error_body("authentication_error", "invalid x-api-key")))
    with pytest.raises(ModelAuthError, match=r"invalid x-api-key.*ANTHROPIC_API_KEY"):
        await collect(replay.model())
    assert len(replay.requests) == 1


async def test_429_and_529_are_retried_then_the_answer_streams() -> None:
    replay = Replay(
        (429, error_body("rate_limit_error", "slow down"), {"retry-after": "0"}),
        (529, error_body("overloaded_error", "Overloaded")),
        (200, recording("text")),
    )
    parts = await collect(replay.model())
    notices = [p for p in parts if isinstance(p, RetryNotice)]
    assert [(n.attempt, "429" in n.error or "529" in n.error) for n in notices] == [
        (1, True),
        (2, True),
    ]
    assert notices[0].delay == 0.0  # retry-after: 0 honoured
    final = parts[-1]
    assert isinstance(final, ModelResponse) and final.text == "17 + 25 is 42."


async def test_an_overloaded_error_event_before_any_output_is_retried() -> None:
    replay = Replay((200, recording("overloaded_midstream")), (200, recording("text")))
    parts = await collect(replay.model())
    assert sum(isinstance(p, RetryNotice) for p in parts) == 1
    assert isinstance(parts[-1], ModelResponse) and parts[-1].text == "17 + 25 is 42."


async def test_overloaded_every_time_gives_up_typed() -> None:
    replay = Replay(*[(529, error_body("overloaded_error", "Overloaded"))] * 3)
    with pytest.raises(ModelUnavailable, match=r"529.*gave up after 2 retries"):
        await collect(replay.model(retry=RetryPolicy(max_retries=2, initial_delay=0.01)))
    assert len(replay.requests) == 3


async def test_a_prompt_that_is_too_long() -> None:
    replay = Replay(
        (
            400,
            error_body(
                "invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"
            ),
        )
    )
    with pytest.raises(ContextTooLong, match="prompt is too long"):
        await collect(replay.model())
    assert len(replay.requests) == 1


async def test_a_stream_cut_after_text_is_not_retried() -> None:
    replay = Replay((200, recording("cut")), (200, recording("text")))
    with pytest.raises(ModelUnavailable, match="broke after output had started") as info:
        await collect(replay.model())
    assert [p.text for p in info.value.parts if isinstance(p, TextDelta)] == ["The answer is"]  # type: ignore[attr-defined]
    assert len(replay.requests) == 1


async def test_the_agent_stores_nothing_from_a_cut_stream() -> None:
    replay = Replay((200, recording("cut")))
    agent = Agent(model=replay.model())
    events = [e async for e in agent.stream("hi", session_id="s")]
    assert events[-1].type is EventType.AGENT_FINISH
    assert events[-1].data["stop_reason"] == "model_error"
    assert [m.role for m in await agent.store.load_messages("s")] == ["user"]


# -- output_type: a forced output tool ----------------------------------------------------------
class Reading(BaseModel):
    hour: int
    celsius: float


class Forecast(BaseModel):
    city: str
    readings: list[Reading]


async def test_an_output_type_is_a_forced_output_tool_whose_input_is_the_answer() -> None:
    replay = Replay((200, recording("output_tool")))
    agent = Agent(model=replay.model(), output_type=Forecast)
    events = [e async for e in agent.stream("weather in Oslo?")]
    finish = events[-1]
    assert finish.type == EventType.AGENT_FINISH and finish.data["stop_reason"] == "completed"
    sent = replay.requests[0]
    [tool] = sent["tools"]
    assert tool["name"] == OUTPUT_TOOL and tool["input_schema"] == Forecast.model_json_schema()
    assert sent["tool_choice"] == {"type": "tool", "name": OUTPUT_TOOL}
    # the tool's input streamed as the answer's text, and partial values followed it
    deltas = "".join(e.text for e in events if e.type == EventType.LLM_DELTA)
    readings = [{"hour": 9, "celsius": 3.5}, {"hour": 12, "celsius": 6.0}]
    assert json.loads(deltas) == {"city": "Oslo", "readings": readings}
    partials = [e.data["output"] for e in events if e.type == EventType.OUTPUT_PARTIAL]
    assert partials[0] == {"city": "Oslo", "readings": [{"hour": 9, "celsius": 3.5}]}
    assert partials[-1]["readings"][-1] == {"hour": 12, "celsius": 6.0}
    complete = next(e for e in events if e.type == EventType.LLM_COMPLETE)
    assert complete.data["tool_calls"] == []  # the output tool is not a tool call for the loop


async def test_an_output_tool_answer_that_does_not_validate_is_corrected() -> None:
    replay = Replay((200, recording("output_tool_bad")), (200, recording("output_tool")))
    result = await Agent(model=replay.model(), output_type=Forecast).run("weather in Oslo?")
    assert result.stop_reason == "completed"
    readings = [Reading(hour=9, celsius=3.5), Reading(hour=12, celsius=6.0)]
    assert result.output == Forecast(city="Oslo", readings=readings)
    second = replay.requests[1]["messages"]
    assert second[-2]["role"] == "assistant"  # the bad answer, replayed as text
    assert "readings.0.hour" in second[-1]["content"][0]["text"]  # the validation error


async def test_with_tools_the_model_must_call_one_of_them_or_the_output_tool() -> None:
    replay = Replay((200, recording("tool_use")), (200, recording("output_tool")))
    agent = Agent(model=replay.model(), tools=[add], output_type=Forecast)
    result = await agent.run("add then answer")
    assert result.stop_reason == "completed" and result.output.city == "Oslo"
    first = replay.requests[0]
    assert [t["name"] for t in first["tools"]] == ["add", OUTPUT_TOOL]
    assert first["tool_choice"] == {"type": "any"}


EPHEMERAL = {"type": "ephemeral"}


def breakpoints(body: dict[str, Any]) -> list[str]:
    """Where a request body's ``cache_control`` marks are: ``system[i]``, ``messages[i][j]``."""
    marks = [
        f"system[{i}]"
        for i, b in enumerate(body["system"] if isinstance(body["system"], list) else [])
        if "cache_control" in b
    ]
    for i, m in enumerate(body["messages"]):
        marks += [f"messages[{i}][{j}]" for j, b in enumerate(m["content"]) if "cache_control" in b]
    return marks


async def test_the_request_carries_cache_breakpoints_by_segment() -> None:
    """ROM (with the tools before it) and the Kernel end in a breakpoint each; so do the last
    message the previous request also sent and the last message (the next request's stable
    part). The provider's cache counts land in Usage and are priced at the cache prices."""
    from loom.memory.tools import set_kernel
    from loom.pricing import PriceTable

    replay = Replay((200, recording("tool_use")), (200, recording("text")))
    agent = Agent(
        name="calc",
        instructions="You add numbers.",
        model=replay.model(),
        tools=["add"],
        model_settings=ModelSettings(max_tokens=300),
    )
    await set_kernel(agent.store, "s", "user", "Ada")
    result = await agent.run("What is 17 + 25?", session_id="s")
    assert result.stop_reason == "completed"
    first, second = replay.requests
    rom = {"type": "text", "text": "You add numbers.", "cache_control": EPHEMERAL}
    kernel = {
        "type": "text",
        "text": "Session context (Kernel):\n- user: Ada",
        "cache_control": EPHEMERAL,
    }
    assert first["system"] == second["system"] == [rom, kernel]
    assert first["tools"][0]["name"] == "add"  # the tools come first: the ROM mark covers them
    assert breakpoints(first) == ["system[0]", "system[1]", "messages[0][0]"]
    # the user message (the end of what the first request sent) and the tool result
    assert breakpoints(second) == ["system[0]", "system[1]", "messages[0][0]", "messages[2][0]"]
    assert second["messages"][0]["content"] == [
        {"type": "text", "text": "What is 17 + 25?", "cache_control": EPHEMERAL}
    ]
    assert second["messages"][2]["content"][0]["cache_control"] == EPHEMERAL
    assert "cache_control" not in json.dumps(second["messages"][1])  # the assistant's tool_use
    # the second answer's usage: 530 fresh + 100 read from the cache
    assert result.usage.cache_read_tokens == 100 and result.usage.cache_write_tokens == 0
    price = {"input": 5.0, "cached_input": 0.5, "cache_write": 6.25, "output": 25.0}
    table = PriceTable({"anthropic:claude-opus-4-6": price})
    second_call = Usage(input_tokens=630, output_tokens=12, requests=1, cache_read_tokens=100)
    assert table.cost(second_call, "anthropic:claude-opus-4-6") == round(
        (530 * 5.0 + 100 * 0.5 + 12 * 25.0) / 1e6, 10
    )


def test_at_most_four_breakpoints_and_none_when_caching_is_off() -> None:
    model = Replay().model()
    msgs = [Message.system("rules"), Message.system("kernel")]
    for i in range(4):
        msgs += [Message.user(f"q{i}"), Message.assistant(f"a{i}")]
    on = model._request(msgs, [], ModelSettings(cache_points=(0, 1, 3, 5, 7, 9)))
    assert breakpoints(on) == ["system[0]", "system[1]", "messages[1][0]", "messages[3][0]"]
    off = model._request(msgs, [], ModelSettings(cache_points=(0, 1, 3), prompt_cache=False))
    assert off["system"] == "rules\n\nkernel" and "cache_control" not in json.dumps(off)
    # the conversation the caller holds is not marked: the marks are the request's
    assert "cache_control" not in json.dumps(to_anthropic_messages(msgs)[1])

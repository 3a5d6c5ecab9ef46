"""The OpenAI provider against a real OpenAI-compatible server: llama-cpp-python's own server
running the bundled model on loopback. Chunk shapes no local server produces (parallel tool
calls, bad JSON arguments) are replayed through the SDK's HTTP transport."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
from pydantic import BaseModel, Field

from loom import Agent
from loom.errors import ContextTooLong, ModelAuthError, ModelRequestError, ModelUnavailable
from loom.events import EventType
from loom.messages import Message, ModelResponse, ToolCall, ToolResult
from loom.models import resolve_model
from loom.models.base import ModelSettings, RetryNotice, StreamPart, TextDelta
from loom.models.cache import session_cache_key
from loom.models.openai import OpenAIModel, response_format, strict_schema, to_openai_messages
from loom.models.resilience import CircuitBreaker, RetryPolicy
from loom.output import compile_output
from loom.tools.basic import add

pytestmark = pytest.mark.slow

FAST = RetryPolicy(initial_delay=0.01, max_delay=0.02)


def compatible(base: str, **kw: Any) -> OpenAIModel:
    return OpenAIModel(
        "smollm2", base_url=base, provider="openai-compatible", require_key=False, **kw
    )


async def collect(stream: AsyncIterator[StreamPart]) -> list[StreamPart]:
    return [p async for p in stream]


async def test_streams_text_deltas_from_the_real_server(llama_server: str) -> None:
    model = compatible(llama_server)
    parts = await collect(
        model.stream([Message.user("Say hello.")], [], ModelSettings(max_tokens=12, temperature=0))
    )
    deltas = [p.text for p in parts if isinstance(p, TextDelta)]
    final = parts[-1]
    assert isinstance(final, ModelResponse)
    assert len(deltas) >= 3
    assert "".join(deltas) == final.text
    assert final.finish_reason in ("stop", "length")
    assert final.usage is not None and final.usage.requests == 1


async def test_a_tool_round_trip_through_the_agent(llama_server: str) -> None:
    """The agent forces the first call to ``add`` (the server's generic chat handler makes tool
    calls only when a tool is named in tool_choice); after the result it asks with "auto"."""
    sent: list[dict[str, Any]] = []

    async def record(request: httpx2.Request) -> None:
        sent.append(json.loads(request.content))

    model = compatible(
        llama_server, http_client=httpx2.AsyncClient(event_hooks={"request": [record]})
    )
    agent = Agent(
        name="calc",
        instructions="You add numbers.",
        model=model,
        tools=["add"],
        model_settings=ModelSettings(max_tokens=30, temperature=0, tool_choice="add"),
    )
    events = [e async for e in agent.stream("What is 17 + 25?")]
    start = next(e.data for e in events if e.type is EventType.TOOL_EXECUTION_START)
    result = next(e.data for e in events if e.type is EventType.TOOL_RESULT)
    finish = events[-1].data
    assert start["tool_name"] == "add"
    assert start["arguments"] == {"a": 17, "b": 25}
    assert start["tool_call_id"]  # the server's id, sent back with the result
    assert result["content"] == "42"
    assert finish["stop_reason"] == "completed", finish["error"][:3000]
    assert finish["output"]  # the server accepted the tool message and answered
    assert [b["tool_choice"] for b in sent] == [
        {"type": "function", "function": {"name": "add"}},
        "auto",
    ]


def test_required_and_none_are_sent_as_openai_spells_them() -> None:
    model = compatible("http://127.0.0.1:9/v1")
    tools = [add.spec()]
    msgs = [Message.user("hi")]
    for choice in ("required", "none", "auto"):
        assert (
            model._request(msgs, tools, ModelSettings(tool_choice=choice))["tool_choice"] == choice
        )
    assert "tool_choice" not in model._request(msgs, [], ModelSettings(tool_choice="required"))


async def test_a_model_string_selects_the_compatible_server(llama_server: str) -> None:
    agent = Agent(
        model=f"openai-compatible:{llama_server}#smollm2",
        model_settings=ModelSettings(max_tokens=8),
    )
    result = await agent.run("Hi!")
    assert result.stop_reason == "completed"
    assert result.output


async def test_a_wrong_base_url_is_a_request_error_without_retries(llama_server: str) -> None:
    model = compatible(
        llama_server.replace("/v1", "/nope/v1"), retry=FAST, breaker=CircuitBreaker("t")
    )
    parts: list[StreamPart] = []
    with pytest.raises(ModelRequestError, match=r"404.*check the model name and the base URL"):
        async for part in model.stream([Message.user("hi")], [], None):
            parts.append(part)
    assert parts == []


async def test_a_server_error_is_retried_then_typed(llama_server: str) -> None:
    # llama-cpp's server answers 500 to a request it cannot validate.
    model = compatible(
        llama_server,
        retry=RetryPolicy(max_retries=2, initial_delay=0.01),
        breaker=CircuitBreaker("t"),
    )
    parts: list[StreamPart] = []
    with pytest.raises(ModelUnavailable, match=r"(?s)500.*gave up after 2 retries"):
        async for part in model.stream(
            [Message.user("hi")], [], ModelSettings(extra={"temperature": "hot"})
        ):
            parts.append(part)
    assert [p.attempt for p in parts if isinstance(p, RetryNotice)] == [1, 2]


def test_real_openai_without_a_key_names_the_variable() -> None:
    with pytest.raises(ModelAuthError, match="OPENAI_API_KEY"):
        resolve_model("openai:gpt-4o-mini")


def test_ollama_and_compatible_strings() -> None:
    ollama = resolve_model("ollama:qwen3:4b")
    assert isinstance(ollama, OpenAIModel)
    assert (ollama.model, ollama.base_url) == ("qwen3:4b", "http://localhost:11434/v1")
    other = resolve_model("openai-compatible:http://10.0.0.5:8000/v1#my-model")
    assert isinstance(other, OpenAIModel)
    assert (other.model, other.base_url) == ("my-model", "http://10.0.0.5:8000/v1")
    from loom.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="separated by '#'"):
        resolve_model("openai-compatible:http://10.0.0.5:8000/v1")


def test_a_missing_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from loom.errors import MissingDependencyError

    monkeypatch.setitem(__import__("sys").modules, "openai", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'loom-agents\[openai\]'"):
        resolve_model("ollama:qwen3:4b")


def test_message_conversion() -> None:
    call = ToolCall(id="c1", name="add", arguments={"a": 1})
    bad = ToolCall(id="c2", name="add", raw_arguments="{oops")
    out = to_openai_messages(
        [
            Message.system("s"),
            Message.user("u"),
            Message.assistant("thinking", tool_calls=[call, bad]),
            Message.tool(ToolResult(tool_call_id="c1", name="add", data=1)),
        ]
    )
    assert out[0] == {"role": "system", "content": "s"}
    assert out[2]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 1}'}
    assert out[2]["tool_calls"][1]["function"]["arguments"] == "{oops"  # shown as it was
    assert out[3] == {"role": "tool", "tool_call_id": "c1", "content": "1"}


# -- replayed streams -----------------------------------------------------------------------
def sse(*chunks: dict[str, Any], done: bool = True) -> bytes:
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    return (body + ("data: [DONE]\n\n" if done else "")).encode()


def chunk(
    delta: dict[str, Any] | None = None,
    finish: str | None = None,
    usage: dict[str, int] | None = None,
) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {
        "id": "x",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": choices,
        "usage": usage,
    }


def replay(body: bytes, status: int = 200) -> OpenAIModel:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, content=body, headers={"content-type": "text/event-stream"})

    client = httpx2.AsyncClient(transport=httpx2.MockTransport(handler))
    return OpenAIModel(
        "m",
        api_key="k",
        base_url="http://replay/v1",
        http_client=client,
        retry=FAST,
        breaker=CircuitBreaker("replay"),
    )


def tc(
    index: int, *, id: str | None = None, name: str | None = None, args: str = ""
) -> dict[str, Any]:
    fn: dict[str, Any] = {"arguments": args}
    if name:
        fn["name"] = name
    return {"tool_calls": [{"index": index, "id": id, "type": "function", "function": fn}]}


async def test_parallel_tool_call_deltas_are_assembled_per_index() -> None:
    body = sse(
        chunk({"role": "assistant", "content": None}),
        chunk(tc(0, id="call_a", name="add", args="")),
        chunk(tc(1, id="call_b", name="multiply", args='{"a": ')),
        chunk(tc(0, args='{"a": 1,')),
        chunk(tc(1, args='3, "b": 4}')),
        chunk(tc(0, args=' "b": 2}')),
        chunk({}, finish="tool_calls"),
        chunk(None, usage={"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}),
    )
    parts = await collect(replay(body).stream([Message.user("x")], [add.spec()], None))
    final = parts[-1]
    assert isinstance(final, ModelResponse)
    assert [(c.id, c.name, c.arguments) for c in final.tool_calls] == [
        ("call_a", "add", {"a": 1, "b": 2}),
        ("call_b", "multiply", {"a": 3, "b": 4}),
    ]
    assert final.usage is not None
    assert (final.usage.input_tokens, final.usage.output_tokens) == (11, 7)
    assert final.finish_reason == "tool_calls"


async def test_malformed_tool_arguments_are_kept_for_the_model_to_see() -> None:
    body = sse(chunk(tc(0, id="c", name="add", args='{"a": 1, "b": ')), chunk({}, "tool_calls"))
    final = (await collect(replay(body).stream([Message.user("x")], [add.spec()], None)))[-1]
    assert isinstance(final, ModelResponse)
    assert final.tool_calls[0].arguments == {}
    assert final.tool_calls[0].raw_arguments == '{"a": 1, "b": '


async def test_a_stream_cut_after_output_is_unavailable_and_not_retried() -> None:
    body = sse(chunk({"content": "The answer"}), chunk({"content": " is"}), done=False)
    parts: list[StreamPart] = []
    with pytest.raises(ModelUnavailable, match="broke after output had started"):
        async for part in replay(body).stream([Message.user("x")], [], None):
            parts.append(part)
    assert [p.text for p in parts if isinstance(p, TextDelta)] == ["The answer", " is"]
    assert not any(isinstance(p, RetryNotice) for p in parts)


async def test_a_wrong_api_key_is_an_auth_error() -> None:
    body = json.dumps({"error": {"message": "Incorrect API key provided", "type": "x"}}).encode()
    with pytest.raises(ModelAuthError, match=r"Incorrect API key.*check OPENAI_API_KEY"):
        await collect(replay(body, status=401).stream([Message.user("x")], [], None))


async def test_a_context_length_error_is_context_too_long_and_not_retried() -> None:
    # What OpenAI (and llama.cpp's server, for non-streamed calls) answer to an oversized prompt.
    body = json.dumps(
        {
            "error": {
                "message": "This model's maximum context length is 1024 tokens, however you "
                "requested 3010 tokens",
                "type": "invalid_request_error",
                "code": "context_length_exceeded",
            }
        }
    ).encode()
    parts: list[StreamPart] = []
    with pytest.raises(ContextTooLong, match="maximum context length is 1024"):
        async for part in replay(body, status=400).stream([Message.user("x")], [], None):
            parts.append(part)
    assert parts == []


# -- output_type: response_format ----------------------------------------------------------------
class Place(BaseModel):
    city: str = Field(max_length=24)
    country: str = Field(max_length=24)


class Trip(BaseModel):
    traveller: str = Field(max_length=24)
    days: int
    stops: list[Place] = Field(min_length=1, max_length=2)


async def test_a_typed_answer_through_the_real_servers_response_format(llama_server: str) -> None:
    """llama-cpp-python's server turns ``{"type": "json_object", "schema": ...}`` into a grammar:
    every answer parses and validates, for several prompts."""
    model = compatible(llama_server, structured_output="json_object")
    agent = Agent(model=model, output_type=Trip, instructions="Describe the trip as JSON.")
    for prompt in ("Ana spends 3 days in Lisbon, Portugal.", "Ken visits Kyoto, Japan for a week"):
        events = [e async for e in agent.stream(prompt)]
        finish = events[-1]
        assert finish.data["stop_reason"] == "completed", finish.data
        trip = Trip.model_validate_json(finish.data["output"])
        assert 1 <= len(trip.stops) <= 2
        assert any(e.type == EventType.OUTPUT_PARTIAL for e in events)


async def test_the_real_server_rejects_json_schema_so_the_option_exists(llama_server: str) -> None:
    # (it answers 500 for its own validation error, so Loom retries it as a server error)
    model = compatible(llama_server, retry=FAST, breaker=CircuitBreaker("t-rf"))
    result = await Agent(model=model, output_type=Trip).run("a trip")
    assert result.stop_reason == "model_error"
    assert "validation error" in (result.error or "") and "literal" in (result.error or "")


def test_response_format_is_strict_only_when_the_schema_allows() -> None:
    out = compile_output(Trip)
    assert out is not None
    rf = response_format(out.wire, "json_schema")
    assert rf["type"] == "json_schema" and rf["json_schema"]["name"] == "Trip"
    assert rf["json_schema"]["strict"] is True
    schema = rf["json_schema"]["schema"]
    assert schema["additionalProperties"] is False
    assert schema["$defs"]["Place"]["additionalProperties"] is False

    class Loose(BaseModel):
        name: str
        nickname: str | None = None  # optional: strict mode needs every property required

    loose = compile_output(Loose)
    assert loose is not None
    assert response_format(loose.wire, "json_schema")["json_schema"]["strict"] is False
    assert strict_schema({"type": "object", "properties": {}, "additionalProperties": {}}) is None
    listed = compile_output(list[int])
    assert listed is not None and listed.wrapped
    assert response_format(listed.wire, "json_object") == {
        "type": "json_object",
        "schema": listed.wire.schema,
    }
    assert listed.wire.schema["properties"]["response"]["type"] == "array"


async def test_openai_gets_a_stable_prompt_cache_key_per_session_and_cached_tokens_priced() -> None:
    """OpenAI's own API gets ``prompt_cache_key`` (the same for every request of a session,
    another for another session) and ``prompt_cache_retention`` when set; its
    ``cached_tokens`` land in Usage and are priced at the cached-input price."""
    sent: list[dict[str, Any]] = []
    body = sse(
        chunk({"role": "assistant", "content": "Hi."}),
        chunk({}, finish="stop"),
        chunk(
            None,
            usage={
                "prompt_tokens": 2000,
                "completion_tokens": 10,
                "total_tokens": 2010,
                "prompt_tokens_details": {"cached_tokens": 1536},
            },
        ),
    )

    def handler(request: httpx2.Request) -> httpx2.Response:
        sent.append(json.loads(request.content))
        return httpx2.Response(200, content=body, headers={"content-type": "text/event-stream"})

    def model(base: str) -> OpenAIModel:
        return OpenAIModel(
            "gpt-4.1",
            api_key="k",
            base_url=base,
            http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)),
            retry=FAST,
            breaker=CircuitBreaker("replay-cache"),
        )

    agent = Agent(name="chat", instructions="Be brief.", model=model("https://api.openai.com/v1"))
    first = await agent.run("Hello", session_id="a")
    await agent.run("Again", session_id="a")
    await agent.run("Hello", session_id="b")
    keys = [b["prompt_cache_key"] for b in sent]
    assert keys[0] == keys[1] != keys[2] and keys[0].startswith("loom-")
    assert keys[0] == session_cache_key("chat", "a")  # a digest: no session id is sent
    assert all("prompt_cache_retention" not in b for b in sent)
    assert first.usage.cache_read_tokens == 1536
    assert first.usage.cost == round((464 * 2.0 + 1536 * 0.5 + 10 * 8.0) / 1e6, 10)

    sent.clear()
    retained = Agent(
        name="chat",
        model=model("https://api.openai.com/v1"),
        model_settings=ModelSettings(cache_retention="24h"),
    )
    await retained.run("Hello", session_id="a")
    assert sent[0]["prompt_cache_retention"] == "24h"
    sent.clear()
    off = Agent(
        name="chat",
        model=model("https://api.openai.com/v1"),
        model_settings=ModelSettings(prompt_cache=False, cache_retention="24h"),
    )
    await off.run("Hello", session_id="a")
    assert "prompt_cache_key" not in sent[0] and "prompt_cache_retention" not in sent[0]
    sent.clear()
    # an OpenAI-compatible server may refuse fields it does not know: none are sent
    await Agent(name="chat", model=model("http://replay/v1")).run("Hello", session_id="a")
    assert "prompt_cache_key" not in sent[0]

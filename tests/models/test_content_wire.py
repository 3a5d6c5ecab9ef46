"""Media and reasoning on each provider's wire, through the official SDKs against a loopback
HTTP server (``wire``): the request bodies are checked against the OpenAI Chat Completions and
Anthropic Messages formats; streamed reasoning (an OpenAI-compatible server's
``reasoning_content``, Anthropic's thinking blocks, from a hand-written transcript in the
documented event format) becomes its own stream parts and events, and Anthropic's thinking
comes back byte for byte within a tool loop."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from tests.models.conftest import WireServer

from loom import Agent
from loom.content import Audio, File, Image, Reasoning, describe
from loom.errors import ModelRequestError, UnsupportedContent
from loom.events import EventType
from loom.messages import Message, ModelResponse, ToolCall, ToolResult
from loom.models.anthropic import AnthropicModel
from loom.models.base import (
    ModelSettings,
    OutputSchema,
    ReasoningDelta,
    StreamPart,
    TextDelta,
)
from loom.models.openai import OpenAIModel
from loom.models.resilience import CircuitBreaker, RetryPolicy
from loom.tools.basic import add

RECORDINGS = Path(__file__).parent / "recordings"
FAST = RetryPolicy(max_retries=0)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 24
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x00" * 24
PDF = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<<>>\nendobj\ntrailer\n<<>>\n%%EOF\n"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def sse(*chunks: dict[str, Any]) -> bytes:
    return ("".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n").encode()


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "x",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


TEXT_ANSWER = sse(chunk({"content": "ok"}), chunk({}, "stop"))


def openai(wire: WireServer) -> OpenAIModel:
    return OpenAIModel(
        "m",
        base_url=f"{wire.url}/v1",
        provider="openai-compatible",
        require_key=False,
        retry=FAST,
        breaker=CircuitBreaker("wire-openai", failure_threshold=100),
    )


def anthropic(wire: WireServer) -> AnthropicModel:
    return AnthropicModel(
        "claude-opus-4-6",
        api_key="sk-test",
        base_url=wire.url,
        retry=FAST,
        breaker=CircuitBreaker("wire-anthropic", failure_threshold=100),
    )


async def collect(model: Any, messages: list[Message], **kw: Any) -> list[StreamPart]:
    return [p async for p in model.stream(messages, kw.get("tools", []), kw.get("settings"))]


def tool_round(media: list[Any]) -> list[Message]:
    call = ToolCall(id="call_shot", name="screenshot", arguments={})
    return [
        Message.user("What is on the screen?"),
        Message.assistant("", tool_calls=[call]),
        Message.tool(
            ToolResult(tool_call_id="call_shot", name="screenshot", data="taken"), None, media
        ),
    ]


# -- OpenAI chat ----------------------------------------------------------------------------
async def test_openai_user_media_are_a_content_array(wire: WireServer) -> None:
    wire.script((200, TEXT_ANSWER))
    message = Message.user(
        [
            "Compare these.",
            Image.from_bytes(PNG, name="a.png").model_copy(update={"detail": "low"}),
            Image(url="https://example.com/cat.jpg"),
            Audio.from_bytes(WAV, name="note.wav"),
            File.from_bytes(PDF, name="report.pdf"),
        ]
    )
    await collect(openai(wire), [Message.system("Be brief."), message])
    path, body = wire.requests[0]
    assert path == "/v1/chat/completions"
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert body["messages"][1] == {
        "role": "user",
        "content": [
            {"type": "text", "text": "Compare these."},
            {
                "type": "image_url",
                "image_url": {"url": f"data:image/png;base64,{b64(PNG)}", "detail": "low"},
            },
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
            {"type": "input_audio", "input_audio": {"data": b64(WAV), "format": "wav"}},
            {
                "type": "file",
                "file": {
                    "file_data": f"data:application/pdf;base64,{b64(PDF)}",
                    "filename": "report.pdf",
                },
            },
        ],
    }


async def test_openai_tool_result_images_follow_in_a_user_message(wire: WireServer) -> None:
    wire.script((200, TEXT_ANSWER))
    shot = Image.from_bytes(PNG, name="shot.png")
    await collect(openai(wire), [*tool_round([shot]), Message.user("Thanks")])
    messages = wire.bodies[0]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "user", "user"]
    assert messages[2] == {
        "role": "tool",
        "tool_call_id": "call_shot",
        "content": f"taken\n(attached in the next user message: {describe(shot)})",
    }
    assert messages[3] == {
        "role": "user",
        "content": [
            {"type": "text", "text": "Attached to the result of screenshot (call_shot):"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}},
        ],
    }
    assert messages[4] == {"role": "user", "content": "Thanks"}


async def test_a_compatible_server_refusing_an_image_names_the_part(wire: WireServer) -> None:
    refusal = {"error": {"message": "image input is not supported", "type": "invalid_request"}}
    wire.script((400, json.dumps(refusal).encode()))
    message = Message.user(["What is this?", Image.from_bytes(PNG, name="chart.png")])
    with pytest.raises(ModelRequestError, match=r"not supported.*held chart\.png.*openai:gpt-4o"):
        await collect(openai(wire), [message])
    assert len(wire.requests) == 1  # a refusal is not retried


async def test_audio_the_chat_api_cannot_take_is_refused_before_the_call(wire: WireServer) -> None:
    flac = Audio.from_bytes(b"fLaC" + b"\x00" * 30, name="song.flac")
    with pytest.raises(UnsupportedContent, match=r"song\.flac.*WAV or MP3") as info:
        await collect(openai(wire), [Message.user(["Transcribe", flac])])
    assert info.value.part == "song.flac"
    assert wire.requests == []


def test_the_openai_models_read_images_files_and_audio() -> None:
    assert OpenAIModel.accepts_media == {"image", "file", "audio"}
    assert AnthropicModel.accepts_media == {"image", "file"}


async def test_reasoning_content_streams_as_reasoning_never_as_the_answer(
    wire: WireServer,
) -> None:
    wire.script(
        (
            200,
            sse(
                chunk({"role": "assistant", "content": None, "reasoning_content": "Two plus"}),
                chunk({"reasoning_content": " two is four."}),
                chunk({"content": "4"}),
                chunk({}, "stop"),
            ),
        )
    )
    parts = await collect(openai(wire), [Message.user("2+2?")])
    assert [p.text for p in parts if isinstance(p, ReasoningDelta)] == ["Two plus", " two is four."]
    assert [p.text for p in parts if isinstance(p, TextDelta)] == ["4"]
    final = parts[-1]
    assert isinstance(final, ModelResponse)
    assert final.text == "4"
    assert final.parts == [Reasoning(text="Two plus two is four.", provider="openai-compatible")]


async def test_reasoning_through_the_agent_is_its_own_live_event(wire: WireServer) -> None:
    """A run streams LLM_REASONING_DELTA events (never LLM_DELTA), stores none of them, keeps
    the reasoning on the answer, and does not send it back to the server on the next call."""
    wire.script(
        (
            200,
            sse(
                chunk({"reasoning": "I need the add tool."}),  # Ollama's and vLLM's newer key
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'},
                            }
                        ]
                    }
                ),
                chunk({}, "tool_calls"),
            ),
        ),
        (200, sse(chunk({"reasoning_content": "It said 4."}), chunk({"content": "4"}, "stop"))),
    )
    agent = Agent(model=openai(wire), tools=["add"])
    events = [e async for e in agent.stream("2+2?")]
    reasoning = [e for e in events if e.type is EventType.LLM_REASONING_DELTA]
    assert [e.data["text"] for e in reasoning] == ["I need the add tool.", "It said 4."]
    assert all(e.text == "" for e in reasoning)  # not answer text to any surface
    deltas = "".join(e.text for e in events if e.type is EventType.LLM_DELTA)
    assert deltas == "4"
    finish = events[-1].data
    assert finish["stop_reason"] == "completed" and finish["output"] == "4"
    session = events[0].session_id
    stored = await agent.runtime.store.load_events(session)
    assert not any(e.type is EventType.LLM_REASONING_DELTA for e in stored)
    completes = [e for e in stored if e.type is EventType.LLM_COMPLETE]
    assert [
        Reasoning.model_validate(p) if isinstance(p, dict) else p
        for p in completes[0].data["parts"]
    ] == [Reasoning(text="I need the add tool.", provider="openai-compatible")]
    second = wire.bodies[1]["messages"]
    assert "I need the add tool." not in json.dumps(second)  # the API takes no reasoning back


async def test_reasoning_effort_is_sent(wire: WireServer) -> None:
    wire.script((200, TEXT_ANSWER))
    await collect(
        openai(wire), [Message.user("hi")], settings=ModelSettings(reasoning_effort="low")
    )
    assert wire.bodies[0]["reasoning_effort"] == "low"


# -- Anthropic --------------------------------------------------------------------------------
def recording(name: str) -> bytes:
    return (RECORDINGS / f"anthropic_{name}.sse").read_bytes()


def recorded_events(name: str) -> list[dict[str, Any]]:
    return [
        json.loads(line[len("data: ") :])
        for line in recording(name).decode().splitlines()
        if line.startswith("data: ")
    ]


async def test_anthropic_images_and_documents(wire: WireServer) -> None:
    wire.script((200, recording("text")))
    notes = File.from_bytes("Totals: 42 \u00e9t\u00e9\n".encode(), "text/plain", name="notes.txt")
    message = Message.user(
        [
            "Read these.",
            Image.from_bytes(PNG, name="a.png"),
            Image(url="https://example.com/cat.jpg"),
            File.from_bytes(PDF, name="report.pdf"),
            notes,
            File(url="https://example.com/paper.pdf"),
        ]
    )
    await collect(anthropic(wire), [message])
    path, body = wire.requests[0]
    assert path == "/v1/messages"
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Read these."},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)},
                },
                {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
                {
                    "type": "document",
                    "source": {"type": "base64", "media_type": "application/pdf", "data": b64(PDF)},
                    "title": "report.pdf",
                },
                {
                    "type": "document",
                    "source": {
                        "type": "text",
                        "media_type": "text/plain",
                        "data": "Totals: 42 \u00e9t\u00e9\n",
                    },
                    "title": "notes.txt",
                },
                {
                    "type": "document",
                    "source": {"type": "url", "url": "https://example.com/paper.pdf"},
                },
            ],
        }
    ]


async def test_anthropic_tool_results_carry_their_images(wire: WireServer) -> None:
    wire.script((200, recording("text")))
    await collect(anthropic(wire), tool_round([Image.from_bytes(PNG, name="shot.png")]))
    assert wire.bodies[0]["messages"][-1] == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "call_shot",
                "content": [
                    {"type": "text", "text": "taken"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)},
                    },
                ],
            }
        ],
    }


async def test_an_image_type_anthropic_cannot_read_is_refused_before_the_call(
    wire: WireServer,
) -> None:
    bmp = Image.from_bytes(b"BM" + b"\x00" * 40, "image/bmp", name="scan.bmp")
    with pytest.raises(UnsupportedContent, match=r"scan\.bmp is image/bmp.*PNG, JPEG, GIF"):
        await collect(anthropic(wire), [Message.user(["What is this?", bmp])])
    assert wire.requests == []


async def test_a_thinking_tool_loop_sends_the_thinking_back_byte_for_byte(
    wire: WireServer,
) -> None:
    wire.script((200, recording("thinking_tool_use")), (200, recording("text")))
    agent = Agent(
        instructions="You add numbers.",
        model=anthropic(wire),
        tools=["add"],
        model_settings=ModelSettings(max_tokens=1024, thinking_budget=2048, temperature=0.2),
    )
    events = [e async for e in agent.stream("What is 17 + 25?")]
    finish = events[-1].data
    assert finish["stop_reason"] == "completed", finish["error"]
    assert finish["output"] == "17 + 25 is 42."

    recorded = recorded_events("thinking_tool_use")
    thinking = "".join(
        e["delta"]["thinking"]
        for e in recorded
        if e.get("delta", {}).get("type") == "thinking_delta"
    )
    (signature,) = [
        e["delta"]["signature"]
        for e in recorded
        if e.get("delta", {}).get("type") == "signature_delta"
    ]
    (redacted,) = [
        e["content_block"]["data"]
        for e in recorded
        if e.get("content_block", {}).get("type") == "redacted_thinking"
    ]
    first, second = wire.bodies
    assert first["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert first["max_tokens"] == 2048 + 1024  # room for the answer after the thinking
    assert "temperature" not in first  # the API takes no other temperature with thinking
    assert second["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": thinking, "signature": signature},
            {"type": "redacted_thinking", "data": redacted},
            {
                "type": "tool_use",
                "id": "toolu_01ThinkAdd7x9Qm2",
                "name": "add",
                "input": {"a": 17, "b": 25},
            },
        ],
    }
    # the thinking streamed as its own events, never as answer text
    streamed = [e.data["text"] for e in events if e.type is EventType.LLM_REASONING_DELTA]
    assert "".join(streamed) == thinking
    assert "tool" not in "".join(e.text for e in events if e.type is EventType.LLM_DELTA)


async def test_the_thinking_stream_gives_reasoning_parts(wire: WireServer) -> None:
    wire.script((200, recording("thinking_tool_use")))
    parts = await collect(anthropic(wire), [Message.user("17 + 25?")], tools=[add.spec()])
    assert [p.text for p in parts if isinstance(p, ReasoningDelta)] == [
        "The user wants 17 + 25. ",
        "I should call the add tool rather than \u00e9stimate it \u2014 exactly.",
    ]
    assert not any(isinstance(p, TextDelta) for p in parts)
    final = parts[-1]
    assert isinstance(final, ModelResponse)
    assert final.text == ""
    assert [
        (r.provider, bool(r.text), bool(r.signature), bool(r.encrypted)) for r in final.parts
    ] == [
        ("anthropic", True, True, False),
        ("anthropic", False, False, True),
    ]


def test_reasoning_goes_back_only_to_the_provider_that_made_it() -> None:
    from loom.models.anthropic import to_anthropic_messages
    from loom.models.openai import to_openai_messages

    answer = Message(
        role="assistant",
        content="4",
        parts=[
            Reasoning(text="theirs", provider="openai-compatible"),
            Reasoning(text="mine", provider="anthropic", signature="sig=="),
        ],
    )
    _, anthropic_messages = to_anthropic_messages([Message.user("2+2?"), answer])
    assert anthropic_messages[1]["content"] == [
        {"type": "thinking", "thinking": "mine", "signature": "sig=="},
        {"type": "text", "text": "4"},
    ]
    assert to_openai_messages([answer]) == [{"role": "assistant", "content": "4"}]


def test_audio_in_an_anthropic_history_is_a_placeholder() -> None:
    from loom.models.anthropic import to_anthropic_messages

    clip = Audio.from_bytes(WAV, name="note.wav")
    _, messages = to_anthropic_messages([Message.user(["Listen", clip])])
    assert messages[0]["content"] == [
        {"type": "text", "text": "Listen"},
        {"type": "text", "text": describe(clip)},
    ]


async def test_with_thinking_the_output_tool_is_asked_for_not_forced(wire: WireServer) -> None:
    """Anthropic forces no tool while thinking (it refuses ``any`` and ``tool`` choices)."""
    wire.script((200, recording("output_tool")))
    output = OutputSchema("Forecast", {"type": "object", "properties": {}})
    settings = ModelSettings(thinking_budget=1024, output=output)
    await collect(anthropic(wire), [Message.user("weather?")], settings=settings)
    body = wire.bodies[0]
    assert body["tool_choice"] == {"type": "auto"}
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert body["max_tokens"] == 4096  # already above the budget


async def test_reasoning_content_goes_back_only_when_asked(wire: WireServer) -> None:
    wire.script((200, TEXT_ANSWER), (200, TEXT_ANSWER))
    answer = Message(
        role="assistant",
        content="",
        tool_calls=[ToolCall(id="c1", name="add", arguments={"a": 1, "b": 2})],
        parts=[
            Reasoning(text="Use add.", provider="openai-compatible"),
            Reasoning(text="not mine", provider="anthropic", signature="s"),
        ],
    )
    history = [
        Message.user("1+2?"),
        answer,
        Message.tool(ToolResult(tool_call_id="c1", name="add", data=3)),
    ]
    await collect(openai(wire), history)
    model = openai(wire)
    model.send_reasoning = True
    await collect(model, history)
    plain, deepseek = (body["messages"][1] for body in wire.bodies)
    assert "reasoning_content" not in plain
    assert deepseek["reasoning_content"] == "Use add."


async def test_thinking_parked_for_approval_comes_back_unchanged_from_sqlite(
    wire: WireServer, tmp_path: Path
) -> None:
    """The tool loop resumes in another runtime, from the database: the thinking block and its
    signature were stored with the answer and go back to the API byte for byte."""
    from loom.engine.run_inputs import Resume
    from loom.engine.runtime import Runtime
    from loom.store.sqlite import SQLiteStore

    wire.script((200, recording("thinking_tool_use")), (200, recording("text")))

    def agent() -> Agent:
        return Agent(
            model=anthropic(wire),
            tools=["add"],
            permissions={"ask": ["add"]},
            model_settings=ModelSettings(thinking_budget=2048),
        )

    db = tmp_path / "loom.db"
    first = await Runtime(SQLiteStore(db)).run(agent(), "What is 17 + 25?")
    assert first.stop_reason == "awaiting_approval"
    done = await Runtime(SQLiteStore(db)).run(agent(), Resume(True), session_id=first.session_id)
    assert done.stop_reason == "completed", done.error
    recorded = recorded_events("thinking_tool_use")
    signature = next(
        e["delta"]["signature"]
        for e in recorded
        if e.get("delta", {}).get("type") == "signature_delta"
    )
    sent = wire.bodies[1]["messages"][1]["content"]
    assert sent[0]["type"] == "thinking" and sent[0]["signature"] == signature
    assert sent[0]["thinking"] == "".join(
        e["delta"]["thinking"]
        for e in recorded
        if e.get("delta", {}).get("type") == "thinking_delta"
    )
    assert sent[1]["type"] == "redacted_thinking"

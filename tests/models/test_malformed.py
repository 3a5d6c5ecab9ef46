"""A server that streams garbage: every provider ends with a typed ``ModelResponseError``
(``stop_reason="model_error"`` in a run), never a raw ``JSONDecodeError`` or ``AttributeError``.

Driven through the official SDKs against a real HTTP server on the loopback interface."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from loom import Agent
from loom.errors import ModelResponseError
from loom.messages import Message
from loom.models.anthropic import AnthropicModel
from loom.models.base import StreamPart, TextDelta
from loom.models.openai import OpenAIModel
from loom.models.resilience import CircuitBreaker, RetryPolicy

FAST = RetryPolicy(initial_delay=0.01, max_delay=0.02)


class GarbageServer(ThreadingHTTPServer):
    daemon_threads = True
    body: bytes = b""
    requests: int = 0


class Handler(BaseHTTPRequestHandler):
    server: GarbageServer

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.server.requests += 1
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        self.wfile.write(self.server.body)
        self.wfile.flush()
        self.close_connection = True


@pytest.fixture
def server() -> Iterator[GarbageServer]:
    srv = GarbageServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def openai_chunk(delta: Any, reason: str | None = None) -> str:
    data = {
        "id": "x",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": reason}],
    }
    return f"data: {json.dumps(data)}\n\n"


def openai_model(srv: GarbageServer) -> OpenAIModel:
    return OpenAIModel(
        "m",
        base_url=f"http://127.0.0.1:{srv.server_port}/v1",
        provider="openai-compatible",
        require_key=False,
        retry=FAST,
        breaker=CircuitBreaker("garbage", failure_threshold=100),
    )


async def collect(model: Any) -> list[StreamPart]:
    parts: list[StreamPart] = []
    try:
        async for part in model.stream([Message.user("hi")], []):
            parts.append(part)
    except Exception as exc:
        exc.parts = parts  # type: ignore[attr-defined]
        raise
    return parts


async def test_an_openai_stream_line_that_is_not_json_is_a_typed_error(
    server: GarbageServer,
) -> None:
    server.body = b"data: {not json}\n\n"
    with pytest.raises(ModelResponseError, match="not valid JSON") as caught:
        await collect(openai_model(server))
    assert isinstance(caught.value.__cause__, json.JSONDecodeError)
    assert server.requests == 1  # a server speaking garbage is not retried


async def test_a_run_against_a_garbage_server_ends_as_model_error(server: GarbageServer) -> None:
    server.body = b"data: {not json}\n\n"
    result = await Agent(model=openai_model(server)).run("hi")
    assert result.stop_reason == "model_error"
    assert result.error is not None
    assert result.error.startswith("ModelResponseError:") and "not valid JSON" in result.error


async def test_garbage_after_text_has_streamed_is_a_typed_error(server: GarbageServer) -> None:
    server.body = (openai_chunk({"content": "Hello"}) + "data: {not json}\n\n").encode()
    with pytest.raises(ModelResponseError, match="broke after output had started") as caught:
        await collect(openai_model(server))
    assert [p.text for p in caught.value.parts if isinstance(p, TextDelta)] == ["Hello"]  # type: ignore[attr-defined]
    assert server.requests == 1


@pytest.mark.parametrize(
    "body",
    [
        'data: {"choices": 5}\n\n',  # JSON, but not a chunk
        "data: [1, 2, 3]\n\n",
        openai_chunk({"content": {"text": "hi"}}),
        openai_chunk({"tool_calls": [{"index": "first", "function": {"name": "f"}}]}),
        openai_chunk({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": 7}}]}),
        openai_chunk({"tool_calls": [{"index": 0, "id": 5, "function": {"name": "f"}}]}, "stop"),
        openai_chunk({"content": "hi"}, reason=["stop"]),  # type: ignore[arg-type]
    ],
)
async def test_an_openai_chunk_of_the_wrong_shape_is_a_typed_error(
    server: GarbageServer, body: str
) -> None:
    server.body = body.encode() + b"data: [DONE]\n\n"
    with pytest.raises(ModelResponseError, match=r"cannot read|broke after output"):
        await collect(openai_model(server))


def anthropic_model(srv: GarbageServer) -> AnthropicModel:
    return AnthropicModel(
        "claude-test",
        api_key="sk-test",
        base_url=f"http://127.0.0.1:{srv.server_port}",
        retry=FAST,
        breaker=CircuitBreaker("garbage-anthropic", failure_threshold=100),
    )


def anthropic_event(kind: str, data: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n"


MESSAGE_START = anthropic_event(
    "message_start",
    {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 10, "output_tokens": 1},
        },
    },
)


async def test_an_anthropic_event_that_is_not_json_is_a_typed_error(
    server: GarbageServer,
) -> None:
    server.body = b"event: message_start\ndata: {not json}\n\n"
    with pytest.raises(ModelResponseError, match="not valid JSON"):
        await collect(anthropic_model(server))
    assert server.requests == 1


async def test_anthropic_garbage_after_text_is_a_typed_error(server: GarbageServer) -> None:
    text_start = anthropic_event(
        "content_block_start",
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    )
    text = anthropic_event(
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
    )
    garbage = "event: content_block_delta\ndata: {not json}\n\n"
    server.body = (MESSAGE_START + text_start + text + garbage).encode()
    with pytest.raises(ModelResponseError, match="broke after output had started"):
        await collect(anthropic_model(server))
    result = await Agent(model=anthropic_model(server)).run("hi")
    assert result.stop_reason == "model_error" and "not valid JSON" in (result.error or "")


async def test_an_anthropic_event_of_the_wrong_shape_is_a_typed_error(
    server: GarbageServer,
) -> None:
    wrong = anthropic_event(
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": 5}},
    )
    start = anthropic_event(
        "content_block_start",
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    )
    server.body = (MESSAGE_START + start + wrong).encode()
    with pytest.raises(ModelResponseError, match="cannot read"):
        await collect(anthropic_model(server))

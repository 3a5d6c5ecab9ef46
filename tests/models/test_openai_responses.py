"""The OpenAI Responses provider, replayed through the SDK's HTTP transport
(``httpx2.MockTransport``): no OpenAI server exists offline. The recordings in
``recordings/openai_responses_*.sse`` are in the API's wire format (``event:`` / ``data:``
lines): a reasoning model that thinks, calls ``add``, and answers after the result."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import httpx2
import pytest

from loom import Agent
from loom.content import File, Image, Reasoning
from loom.engine.runtime import Runtime
from loom.errors import ModelAuthError, UnsupportedContent
from loom.events import EventType
from loom.messages import Message
from loom.models import resolve_model
from loom.models.base import ModelSettings
from loom.models.openai_responses import OpenAIResponsesModel, to_responses_input
from loom.models.resilience import CircuitBreaker, RetryPolicy
from loom.store.memory import MemoryStore
from loom.tools.basic import add

RECORDINGS = Path(__file__).parent / "recordings"
ENCRYPTED = "gAAAAABoR3x-9kz/Yq+W0==opaque+payload/that=must+return/unchanged=="


def recording(name: str) -> bytes:
    return (RECORDINGS / f"openai_responses_{name}.sse").read_bytes()


def png() -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")
        )

    header = (1).to_bytes(4, "big") * 2 + b"\x08\x00\x00\x00\x00"
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00\x00"))
        + chunk(b"IEND", b"")
    )


class Replay:
    """Answers each request with the next recorded stream; keeps the raw request bodies."""

    def __init__(self, *bodies: bytes) -> None:
        self.bodies = list(bodies)
        self.raw: list[bytes] = []

    @property
    def requests(self) -> list[dict[str, Any]]:
        return [json.loads(r) for r in self.raw]

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.raw.append(request.content)
        return httpx2.Response(
            200, content=self.bodies.pop(0), headers={"content-type": "text/event-stream"}
        )

    def model(self, **kw: Any) -> OpenAIResponsesModel:
        kw.setdefault("base_url", "http://replay.invalid/v1")
        return OpenAIResponsesModel(
            "o4-mini",
            api_key="sk-test",
            http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(self)),
            retry=RetryPolicy(initial_delay=0.01, max_delay=0.02),
            breaker=CircuitBreaker("responses-test", failure_threshold=100),
            **kw,
        )


async def test_reasoning_goes_back_unchanged_within_the_tool_loop() -> None:
    replay = Replay(recording("reasoning_tool"), recording("answer"))
    agent = Agent(name="calc", model=replay.model(reasoning_effort="low"), tools=[add])
    store = MemoryStore()
    runtime = Runtime(store=store)
    events = [e async for e in runtime.stream(agent, "What is 17 + 25?", session_id="s")]
    reasoning = [e.data["text"] for e in events if e.type is EventType.LLM_REASONING_DELTA]
    answer = [e.text for e in events if e.type is EventType.LLM_DELTA]
    assert reasoning == ["**Adding numbers**\n\nI should call add with 17 and 25."]
    assert answer == ["17 + 25", " = 42."]  # reasoning never in the answer's text
    finish = events[-1].data
    assert finish["output"] == "17 + 25 = 42."
    first, second = replay.requests
    assert first["store"] is False and first["include"] == ["reasoning.encrypted_content"]
    assert first["reasoning"] == {"effort": "low", "summary": "auto"}
    assert first["tools"][0]["name"] == "add"
    # the second request carries the reasoning item before its call, byte for byte
    kinds = [item.get("type") for item in second["input"]]
    assert kinds[-3:] == ["reasoning", "function_call", "function_call_output"]
    item = second["input"][-3]
    assert item["id"] == "rs_68a1b2c3d4e5f6" and item["encrypted_content"] == ENCRYPTED
    assert ENCRYPTED.encode() in replay.raw[1]  # the same bytes on the wire
    assert second["input"][-2]["call_id"] == "call_Xk2mB9"
    assert second["input"][-1] == {
        "type": "function_call_output",
        "call_id": "call_Xk2mB9",
        "output": "42",
    }
    # the transcript keeps the reasoning as a part of the assistant message, not its text
    thought = (await store.load_messages("s"))[1]
    assert thought.role == "assistant" and thought.content == ""
    assert thought.parts == [
        Reasoning(
            text="**Adding numbers**\n\nI should call add with 17 and 25.",
            provider="openai",
            id="rs_68a1b2c3d4e5f6",
            encrypted=ENCRYPTED,
        )
    ]
    assert finish["usage"]["input_tokens"] == 81 + 260
    assert finish["usage"]["cache_read_tokens"] == 128


def test_media_and_foreign_reasoning_in_the_request() -> None:
    img = Image.from_bytes(png(), name="dot.png")
    pdf = File.from_bytes(b"%PDF-1.4\n%%EOF\n", name="r.pdf")
    messages = [
        Message.system("Be brief."),
        Message.user(["Compare", img, Image(url="https://example.com/cat.jpg", detail="low"), pdf]),
        Message(
            role="assistant",
            content="Done.",
            parts=[Reasoning(text="hm", provider="anthropic", signature="sig")],
        ),
    ]
    items = to_responses_input(messages)
    assert items[0] == {"type": "message", "role": "system", "content": "Be brief."}
    content = items[1]["content"]
    assert content[0] == {"type": "input_text", "text": "Compare"}
    assert content[1]["type"] == "input_image"
    assert content[1]["image_url"].startswith("data:image/png;base64,iVBORw0KGgo")
    assert content[2] == {
        "type": "input_image",
        "image_url": "https://example.com/cat.jpg",
        "detail": "low",
    }
    assert content[3]["type"] == "input_file" and content[3]["filename"] == "r.pdf"
    assert content[3]["file_data"].startswith("data:application/pdf;base64,")
    # another provider's reasoning means nothing to OpenAI: it is not sent
    assert items[2] == {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Done."}],
    }


def test_audio_is_refused_with_a_model_that_takes_it() -> None:
    from loom.content import Audio

    wav = b"RIFF\x24\x00\x00\x00WAVEfmt "
    with pytest.raises(UnsupportedContent, match="chat completions"):
        to_responses_input([Message.user(["listen", Audio.from_bytes(wav)])])


def test_the_model_string_and_a_missing_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ModelAuthError, match="OPENAI_API_KEY"):
        resolve_model("openai-responses:o4-mini")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    model = resolve_model("openai-responses:o4-mini")
    assert isinstance(model, OpenAIResponsesModel) and model.name == "openai-responses:o4-mini"


def test_the_prompt_cache_fields_go_to_openai_only() -> None:
    settings = ModelSettings(cache_key="loom-k", cache_retention="in_memory")
    msgs = [Message.user("hi")]
    official = Replay().model(base_url="https://api.openai.com/v1").request(msgs, [], settings)
    assert official["prompt_cache_key"] == "loom-k"
    assert official["prompt_cache_retention"] == "in_memory"
    elsewhere = Replay().model().request(msgs, [], settings)
    assert "prompt_cache_key" not in elsewhere and "prompt_cache_retention" not in elsewhere

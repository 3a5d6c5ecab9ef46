"""Files over A2A on a real ``loom serve``, sent by the ``a2a-sdk`` Python client: raw bytes
and URL parts reach the model as Loom media (the test model reports the digests of the bytes
it was given), a data part reaches it as fenced JSON, and an answer with an image comes back
as a raw part with its media type and filename.

The server (``media_server``, tests/interop/conftest.py) keeps its sessions in memory."""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.interop.a2a_agents import BEEP, CHART, REPORT, png
from tests.interop.conftest import MEDIA_KEY
from tests.server.conftest import Server

pytest.importorskip("a2a.client")

from a2a.client import ClientConfig, create_client
from a2a.helpers.proto_helpers import new_data_part, new_raw_part, new_text_part, new_url_part
from a2a.types.a2a_pb2 import GetTaskRequest, Message, Part, Role, SendMessageRequest, TaskState

from loom import ModelResponse, ToolCall
from loom.messages import Message as LoomMessage
from loom.testing import FunctionModel

AUTH = {"Authorization": f"Bearer {MEDIA_KEY}"}
PDF = b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n"

session_loop = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture
def server(media_server: Server) -> Server:
    return media_server


@pytest.fixture
async def looker(server: Server) -> AsyncIterator[Any]:
    async with httpx.AsyncClient(headers=AUTH, timeout=30) as http:
        yield await create_client(
            f"{server.url}/agents/looker",
            ClientConfig(httpx_client=http, streaming=False),
            resolver_http_kwargs={"headers": AUTH},
        )


async def _send(client: Any, parts: list[Part]) -> Any:
    message = Message(role=Role.ROLE_USER, message_id=f"m-{time.monotonic_ns()}", parts=parts)
    [response] = [r async for r in client.send_message(SendMessageRequest(message=message))]
    task = await client.get_task(GetTaskRequest(id=response.task.id))
    assert task.status.state == TaskState.TASK_STATE_COMPLETED, task
    return task


def _text(parts: Any) -> str:
    return "".join(p.text for p in parts if p.HasField("text"))


@session_loop
async def test_files_sent_by_the_sdk_client_reach_the_model_as_media(looker: Any) -> None:
    photo = png(8, 6)
    task = await _send(
        looker,
        [
            new_text_part("what are these?"),
            new_raw_part(photo, "image/png", "photo.png"),
            new_raw_part(PDF, "application/pdf", "report.pdf"),
            new_url_part("https://example.com/cat.jpg", "image/jpeg", "cat.jpg"),
            new_data_part({"unit": "cm", "rows": 3}),
        ],
    )
    seen = _text(task.artifacts[-1].parts)
    # the model got the very bytes, typed and named; the URL as a URL (Loom fetched nothing)
    assert f"image image/png photo.png {len(photo)} {hashlib.sha256(photo).hexdigest()}" in seen
    assert f"file application/pdf report.pdf {len(PDF)} {hashlib.sha256(PDF).hexdigest()}" in seen
    assert "image image/jpeg cat.jpg None url=https://example.com/cat.jpg" in seen
    # the data part as fenced JSON after the text, keys sorted, whole numbers as integers
    fenced = '```json\n{\n  "rows": 3,\n  "unit": "cm"\n}\n```'
    assert f"text={'what are these?' + chr(10) + fenced!r}" in seen


@session_loop
async def test_a_file_alone_is_a_message(looker: Any) -> None:
    task = await _send(looker, [new_raw_part(PDF, filename="notes.pdf")])  # no media type
    seen = _text(task.artifacts[-1].parts)
    assert seen.startswith("text=''; file application/pdf notes.pdf")


@session_loop
async def test_an_answer_with_an_image_comes_back_as_a_raw_part(looker: Any) -> None:
    task = await _send(looker, [new_text_part("draw me a chart")])
    answer = task.artifacts[-1].parts
    assert _text(answer) == "here is your chart"
    [image] = [p for p in answer if p.HasField("raw")]
    assert image.raw == CHART
    assert image.media_type == "image/png" and image.filename == "chart.png"
    # the task's final status message carries it too
    assert [p.raw for p in task.status.message.parts if p.HasField("raw")] == [CHART]


def test_the_card_lists_the_media_the_agent_takes(server: Server) -> None:
    card = httpx.get(f"{server.url}/agents/looker/.well-known/agent-card.json", headers=AUTH).json()
    modes = card["defaultInputModes"]
    assert modes[:2] == ["text/plain", "application/json"]
    assert {"image/png", "application/pdf", "audio/wav"} <= set(modes)


@session_loop
async def test_the_a2a_agent_tool_takes_the_files_a_remote_agent_sent(server: Server) -> None:
    from loom.content import Image, describe
    from loom.tools import a2a_agent
    from loom.tools.a2a import exchange

    remote = a2a_agent(f"{server.url}/agents/looker", headers=AUTH)
    try:
        ex = await exchange(await remote.client(), "draw me a chart", {})
    finally:
        await remote.aclose()
    # the remote's raw part is a Loom image with its bytes, type and name (once: the answer
    # artifact and the final status message both carry it)
    [image] = ex.media
    assert isinstance(image, Image) and image.data == CHART
    assert (image.media_type, image.name, image.width, image.height) == (
        "image/png",
        "chart.png",
        24,
        16,
    )
    assert ex.content == ["here is your chart", image]
    # the text names it where it was
    assert ex.answer == f"here is your chart\n{describe(image)}"
    assert describe(image) == f"[image chart.png: image/png, 24x16, {len(CHART):,} bytes]"


def _asker(tool: str, question: str, seen: list[LoomMessage]) -> FunctionModel:
    """Calls ``tool`` with ``question``, then keeps the request that carries its result."""

    def model(messages: list[LoomMessage], tools: object) -> ModelResponse | str:
        if messages[-1].role == "user":
            return ModelResponse(tool_calls=[ToolCall(name=tool, arguments={"message": question})])
        seen.extend(messages)
        return "thanks"

    return FunctionModel(model)


@session_loop
async def test_a_remote_agents_image_reaches_the_local_model_through_the_tool(
    server: Server, tmp_path: Path
) -> None:
    """A local agent calls the ``looker`` over A2A with ``a2a_agent``: the next model request
    holds the image's bytes as the tool message's part, and the store holds them once."""
    from loom import Agent, EventType, Runtime
    from loom.content import Image, describe, media_ref
    from loom.store import SQLiteStore
    from loom.tools import a2a_agent

    seen: list[LoomMessage] = []
    remote = a2a_agent(f"{server.url}/agents/looker", headers=AUTH, name="looker")
    agent = Agent("boss", model=_asker("looker", "draw me a chart", seen), tools=[remote])
    store = SQLiteStore(tmp_path / "local.db")
    try:
        result = await Runtime(store).run(agent, "get me a chart", session_id="s")
        assert result.output == "thanks"
        [tool_message] = [m for m in seen if m.role == "tool"]
        [image] = tool_message.parts
        assert isinstance(image, Image) and image.data == CHART  # the bytes, loaded for the call
        assert (image.media_type, image.name) == ("image/png", "chart.png")
        assert tool_message.content == f"here is your chart\n{describe(image)}"
        # stored once, by hash, named by the TOOL_RESULT event
        assert await store.session_blobs("s") == [(media_ref(CHART), "image/png", len(CHART))]
        [done] = [e for e in await store.load_events("s") if e.type == EventType.TOOL_RESULT]
        assert [p["ref"] for p in done.data["parts"]] == [media_ref(CHART)]
        # the stored tool message holds the reference, not the bytes
        [stored] = [m for m in await store.load_messages("s") if m.role == "tool"]
        assert [(p.ref, p.data) for p in stored.parts] == [(media_ref(CHART), None)]
    finally:
        await store.close()


@session_loop
async def test_a_remote_agents_image_file_and_sound_all_reach_the_local_model(
    server: Server,
) -> None:
    from loom import Agent
    from loom.content import Audio, File, Image
    from loom.tools import a2a_agent

    seen: list[LoomMessage] = []
    remote = a2a_agent(f"{server.url}/agents/looker", headers=AUTH, name="looker")
    agent = Agent("boss", model=_asker("looker", "send me everything", seen), tools=[remote])
    result = await agent.run("what does the looker have?")
    assert result.output == "thanks"
    [tool_message] = [m for m in seen if m.role == "tool"]
    assert [(type(p), p.data, p.name) for p in tool_message.parts] == [
        (Image, CHART, "chart.png"),
        (File, REPORT, "report.pdf"),
        (Audio, BEEP, "beep.wav"),
    ]
    assert tool_message.content.splitlines()[0] == "all of it"


def test_a_remote_answers_files_as_loom_parts_and_unusable_ones_as_lines() -> None:
    """The parts of a remote answer as the tool's result: an http(s) URL stays a URL (the
    local model's provider fetches it), a ``data:`` URL is decoded; bytes that are not what
    they claim, and a URL no provider fetches, leave the call answering, with a line naming
    each such file and why it was left out."""
    import base64

    from loom.content import File, Image, describe
    from loom.tools.a2a import Exchange

    photo = png(4, 4)
    ex = Exchange(state=TaskState.TASK_STATE_COMPLETED)
    ex.artifacts = [
        _items(
            [
                new_text_part("four files"),
                new_raw_part(b"not a png", "image/png", "fake.png"),
                new_url_part("file:///etc/passwd", "text/plain", "passwd"),
                new_raw_part(PDF, "application/pdf", "ok.pdf"),
                new_url_part("https://example.com/cat.jpg", "image/jpeg", "cat.jpg"),
                new_url_part("data:image/png;base64," + base64.b64encode(photo).decode()),
            ]
        )
    ]
    first, pdf, cat, inline = ex.content
    assert isinstance(first, str)
    assert first.startswith("four files\n[image fake.png: image/png, 9 bytes; left out: ")
    assert "are not that" in first  # the MediaTypeMismatch's words
    assert "\n[file passwd: text/plain, at file:///etc/passwd; left out: " in first
    assert isinstance(pdf, File) and pdf.data == PDF and pdf.name == "ok.pdf"
    assert isinstance(cat, Image) and cat.url == "https://example.com/cat.jpg" and cat.data is None
    assert isinstance(inline, Image) and inline.data == photo and inline.media_type == "image/png"
    assert ex.media == [pdf, cat, inline]
    assert ex.result() == [first, pdf, cat, inline]
    assert ex.answer == "\n".join([first, describe(pdf), describe(cat), describe(inline)])


def test_a_remote_answer_of_text_alone_is_text() -> None:
    from loom.tools.a2a import Exchange

    ex = Exchange(state=TaskState.TASK_STATE_COMPLETED)
    ex.set_status([new_text_part("only words")])
    assert ex.result() == "only words" == ex.answer


def _items(parts: list[Part]) -> list[Any]:
    from loom.tools.a2a import Exchange

    ex = Exchange()
    ex.set_status(parts)
    return ex.status


def test_a_v03_file_part_is_taken_too(server: Server) -> None:
    """A2A 0.3's ``FilePart`` (``kind: "file"``, base64 ``bytes``) and ``DataPart``, over the
    0.3 method name: the SDK's adapter makes them 1.0 parts, and they reach the model."""
    import base64

    photo = png(3, 2)
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "message/send",
        "params": {
            "message": {
                "kind": "message",
                "messageId": f"v03-{time.monotonic_ns()}",
                "role": "user",
                "parts": [
                    {"kind": "text", "text": "old style"},
                    {
                        "kind": "file",
                        "file": {
                            "bytes": base64.b64encode(photo).decode(),
                            "mimeType": "image/png",
                            "name": "old.png",
                        },
                    },
                    {"kind": "data", "data": {"n": 1}},
                ],
            }
        },
    }
    r = httpx.post(f"{server.url}/agents/looker/a2a", json=body, headers=AUTH, timeout=30)
    result = r.json()["result"]
    assert result["status"]["state"] == "completed", result
    seen = "".join(p.get("text", "") for p in result["artifacts"][-1]["parts"])
    assert f"image image/png old.png {len(photo)} {hashlib.sha256(photo).hexdigest()}" in seen
    assert '"n": 1' in seen
    # and an answer's image comes back to a 0.3 client as a FilePart with its bytes
    body["params"]["message"] = {  # type: ignore[index]
        "kind": "message",
        "messageId": f"v03-{time.monotonic_ns()}",
        "role": "user",
        "parts": [{"kind": "text", "text": "draw"}],
    }
    r = httpx.post(f"{server.url}/agents/looker/a2a", json=body, headers=AUTH, timeout=30)
    [file] = [p["file"] for p in r.json()["result"]["artifacts"][-1]["parts"] if "file" in p]
    assert base64.b64decode(file["bytes"]) == CHART
    assert file["mimeType"] == "image/png" and file["name"] == "chart.png"

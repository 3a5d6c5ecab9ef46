"""Images, files, audio and reasoning through the server's protocols (issue 27, every surface):
the ``openai`` SDK's content parts on chat completions and Responses, ``langgraph-sdk`` with
LangChain content blocks, and ``GET /threads/{id}/media/{ref}``, against a real ``loom serve``
whose test models say what bytes they received."""

from __future__ import annotations

import base64
import hashlib
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from tests.server.conftest import Server, start_server, stop_server

openai = pytest.importorskip("openai")

# The served agents: `looker` answers with what media its model request held (kind, type,
# size, the bytes' sha256 or the URL), `thinker` answers with a reasoning part.
MEDIA_AGENTS = r"""
import hashlib

from loom import Agent, ModelResponse
from loom.content import Reasoning
from loom.server import AgentRegistry
from loom.testing import FunctionModel


def looker(messages, tools):
    last = messages[-1]
    seen = []
    for p in last.parts:
        what = hashlib.sha256(p.data).hexdigest() if p.data is not None else f"url {p.url}"
        seen.append(f"{p.kind} {p.media_type} {what}")
    return f"text={last.content!r} parts=" + "; ".join(seen)


def thinker(messages, tools):
    return ModelResponse(text="42", parts=[Reasoning(text="six times seven", provider="test")])


class LiveThinker:  # streams its reasoning before its answer, as reasoning models do

    name = "live-thinker"
    reports_real_usage = False

    async def stream(self, messages, tools, settings=None):
        from loom.models.base import ReasoningDelta, TextDelta

        yield ReasoningDelta("six ")
        yield ReasoningDelta("times seven")
        yield TextDelta("42")
        yield ModelResponse(text="42", parts=[Reasoning(text="six times seven", provider="test")])


from loom.crew import Crew, Sequential

PAIR = Crew("pair", members={"eye": Agent(name="eye", model=FunctionModel(looker))},
            plan=Sequential("eye"))
BLIND = FunctionModel(looker, name="blind-model")
BLIND.accepts_media = frozenset({"file"})  # a model that reads documents, not images

registry = AgentRegistry([
    Agent(name="blind", instructions="Describe.", model=BLIND),
    Agent(name="looker", instructions="Describe.", model=FunctionModel(looker)),
    Agent(name="thinker", instructions="Think.", model=FunctionModel(thinker)),
    Agent(name="live-thinker", instructions="Think.", model=LiveThinker()),
    PAIR,
])
"""


def png(width: int = 2, height: int = 1) -> bytes:
    """A real PNG (what Pillow reads, if installed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


PNG = png()
PNG_SHA = hashlib.sha256(PNG).hexdigest()
PNG_B64 = base64.b64encode(PNG).decode()
PDF = b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n"
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x00" * 24


@pytest.fixture(scope="module")
def media_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server on the default durable store (SQLite, which keeps media once)."""
    srv = start_server(
        tmp_path_factory.mktemp("media"),
        app="media_agents:registry",
        source=MEDIA_AGENTS,
    )
    yield srv
    stop_server(srv)


async def fetch(method: str, url: str, **kw: Any) -> httpx.Response:
    async with httpx.AsyncClient() as http:
        return await http.request(method, url, **kw)


def oai(server: Server) -> Any:
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)


# -- OpenAI chat completions --------------------------------------------------------------------
async def test_chat_image_parts_reach_the_model_as_bytes(media_server: Server) -> None:
    reply = await oai(media_server).chat.completions.create(
        model="looker",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}},
                    {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
                ],
            }
        ],
    )
    said = reply.choices[0].message.content
    assert said == (
        f"text='What is this?' parts=image image/png {PNG_SHA}; "
        "image image/jpeg url https://example.com/cat.jpg"
    )


async def test_chat_audio_and_file_parts(media_server: Server) -> None:
    reply = await oai(media_server).chat.completions.create(
        model="looker",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "listen, read"},
                    {
                        "type": "input_audio",
                        "input_audio": {"data": base64.b64encode(WAV).decode(), "format": "wav"},
                    },
                    {
                        "type": "file",
                        "file": {
                            "filename": "report.pdf",
                            "file_data": "data:application/pdf;base64,"
                            + base64.b64encode(PDF).decode(),
                        },
                    },
                ],
            }
        ],
    )
    assert reply.choices[0].message.content == (
        f"text='listen, read' parts=audio audio/wav {hashlib.sha256(WAV).hexdigest()}; "
        f"file application/pdf {hashlib.sha256(PDF).hexdigest()}"
    )


@pytest.mark.parametrize(
    ("part", "error", "says"),
    [
        (
            {"type": "image_url", "image_url": {"url": "data:image/png;base64"}},
            "ContentError",
            "malformed data URL",
        ),
        (
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,!!notbase64"}},
            "ContentError",
            "not valid base64",
        ),
        (
            {
                "type": "image_url",
                "image_url": {"url": "data:image/png;base64," + base64.b64encode(PDF).decode()},
            },
            "MediaTypeMismatch",
            "claims image/png",
        ),
        (
            {"type": "image_url", "image_url": {"url": "data:image/tiff;base64,AAAA"}},
            "UnsupportedContent",
            "image/tiff",
        ),
        (
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "aiff"}},
            "UnsupportedContent",
            "aiff",
        ),
        (
            {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}},
            "ContentError",
            "neither a data: URL nor an http(s) URL",
        ),
    ],
)
async def test_chat_bad_parts_are_a_400_naming_the_part(
    media_server: Server, part: dict[str, Any], error: str, says: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await oai(media_server).chat.completions.create(
            model="looker",
            messages=[
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}, part]},
            ],
        )
    assert caught.value.status_code == 400
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["type"] == error, body
    assert body["param"] == "messages[1].content[1]"
    assert body["message"].startswith("messages[1].content[1]: ") and says in body["message"]


async def test_chat_returns_reasoning_content(media_server: Server) -> None:
    c = oai(media_server)
    reply = await c.chat.completions.create(
        model="thinker", messages=[{"role": "user", "content": "6*7?"}]
    )
    message = reply.choices[0].message
    assert message.content == "42"
    assert message.model_extra is not None
    assert message.model_extra["reasoning_content"] == "six times seven"

    stream = await c.chat.completions.create(
        model="thinker", messages=[{"role": "user", "content": "6*7?"}], stream=True
    )
    reasoning, text = "", ""
    async for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
    assert (reasoning, text) == ("six times seven", "42")


async def test_chat_streams_reasoning_as_it_comes_and_once(media_server: Server) -> None:
    stream = await oai(media_server).chat.completions.create(
        model="live-thinker", messages=[{"role": "user", "content": "6*7?"}], stream=True
    )
    pieces, text = [], ""
    async for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text += delta.content or ""
        piece = (delta.model_extra or {}).get("reasoning_content")
        if piece:
            pieces.append(piece)
    # each delta as the model streamed it, never the whole again at the step's end
    assert (pieces, text) == (["six ", "times seven"], "42")


async def test_a_model_that_cannot_read_images_is_a_400_before_it_runs(
    media_server: Server,
) -> None:
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}}
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            await oai(media_server).chat.completions.create(
                model="blind",
                messages=[{"role": "user", "content": [{"type": "text", "text": "see"}, image]}],
                stream=stream,
            )
        body = caught.value.body
        assert isinstance(body, dict) and body["type"] == "UnsupportedContent"
        assert "'blind-model' cannot read image input" in body["message"]


async def test_a_crew_refuses_media_rather_than_dropping_them(media_server: Server) -> None:
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}}
    with pytest.raises(openai.BadRequestError) as caught:
        await oai(media_server).chat.completions.create(
            model="pair",
            messages=[{"role": "user", "content": [{"type": "text", "text": "see"}, image]}],
        )
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "UnsupportedContent"
    assert "a crew's task is text" in body["message"]


# -- OpenAI Responses ---------------------------------------------------------------------------
async def test_responses_input_image_and_file(media_server: Server) -> None:
    response = await oai(media_server).responses.create(
        model="looker",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "compare"},
                    {
                        "type": "input_image",
                        "image_url": f"data:image/png;base64,{PNG_B64}",
                        "detail": "low",
                    },
                    {
                        "type": "input_file",
                        "filename": "r.pdf",
                        "file_data": "data:application/pdf;base64,"
                        + base64.b64encode(PDF).decode(),
                    },
                ],
            }
        ],
    )
    assert response.output_text == (
        f"text='compare' parts=image image/png {PNG_SHA}; "
        f"file application/pdf {hashlib.sha256(PDF).hexdigest()}"
    )


async def test_responses_bad_image_is_a_400(media_server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await oai(media_server).responses.create(
            model="looker",
            input=[
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": "data:image/png,notapng"}],
                }
            ],
        )
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["type"] == "MediaTypeMismatch" and body["param"] == "input[0].content[0]"


async def test_responses_reasoning_item(media_server: Server) -> None:
    c = oai(media_server)
    response = await c.responses.create(model="thinker", input="6*7?")
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "message"]
    reasoning = response.output[0].model_dump()
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "six times seven"}]
    assert response.output_text == "42"
    # rebuilt from the journal, the same
    again = await c.responses.retrieve(response.id)
    assert [item.type for item in again.output] == ["reasoning", "message"]

    stream = await c.responses.create(model="thinker", input="6*7?", stream=True)
    final = None
    added = []
    async for event in stream:
        if event.type == "response.output_item.added":
            added.append(event.item.type)
        if event.type == "response.completed":
            final = event.response
    assert final is not None
    assert sorted(added) == ["message", "reasoning"]
    assert [item.type for item in final.output] == ["message", "reasoning"]


# -- LangGraph run API --------------------------------------------------------------------------
def lg(server: Server) -> Any:
    langgraph_sdk = pytest.importorskip("langgraph_sdk")
    return langgraph_sdk.get_client(url=server.url)


BLOCKS = [
    pytest.param({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}}),
    pytest.param(
        {"type": "image", "source_type": "base64", "data": PNG_B64, "mime_type": "image/png"}
    ),
    pytest.param({"type": "image", "base64": PNG_B64, "mime_type": "image/png"}),
]


@pytest.mark.parametrize("block", BLOCKS)
async def test_langgraph_content_blocks_become_parts(
    media_server: Server, block: dict[str, Any]
) -> None:
    client = lg(media_server)
    thread = await client.threads.create()
    content = [{"type": "text", "text": "look"}, block]
    values = await client.runs.wait(
        thread["thread_id"], "looker", input={"messages": [{"role": "user", "content": content}]}
    )
    human, ai = values["messages"]
    assert ai["content"] == f"text='look' parts=image image/png {PNG_SHA}"
    # the human message shows its image as a reference to the media route, not base64
    text, image = human["content"]
    assert text == {"type": "text", "text": "look"}
    assert image["type"] == "image" and image["mime_type"] == "image/png"
    assert image["url"] == f"/threads/{thread['thread_id']}/media/sha256:{PNG_SHA}"
    assert PNG_B64 not in str(values)
    got = await fetch("GET", media_server.url + image["url"])
    assert got.status_code == 200 and got.content == PNG
    assert got.headers["content-type"] == "image/png"
    assert got.headers["x-content-type-options"] == "nosniff"


async def test_langgraph_url_file_and_audio_blocks(media_server: Server) -> None:
    client = lg(media_server)
    thread = await client.threads.create()
    content = [
        {"type": "text", "text": "these"},
        {"type": "image", "source_type": "url", "url": "https://example.com/a.png"},
        {"type": "file", "base64": base64.b64encode(PDF).decode(), "mime_type": "application/pdf"},
        {
            "type": "audio",
            "source_type": "base64",
            "data": base64.b64encode(WAV).decode(),
            "mime_type": "audio/wav",
        },
    ]
    values = await client.runs.wait(
        thread["thread_id"], "looker", input={"messages": [{"role": "user", "content": content}]}
    )
    assert values["messages"][-1]["content"] == (
        "text='these' parts=image image/png url https://example.com/a.png; "
        f"file application/pdf {hashlib.sha256(PDF).hexdigest()}; "
        f"audio audio/wav {hashlib.sha256(WAV).hexdigest()}"
    )
    pdf = values["messages"][0]["content"][2]
    got = await fetch("GET", media_server.url + pdf["url"])
    assert got.content == PDF and got.headers["content-disposition"] == "attachment"


async def test_langgraph_reasoning_is_a_reasoning_block(media_server: Server) -> None:
    client = lg(media_server)
    thread = await client.threads.create()
    values = await client.runs.wait(
        thread["thread_id"], "thinker", input={"messages": [{"role": "user", "content": "6*7?"}]}
    )
    assert values["messages"][-1]["content"] == [
        {"type": "reasoning", "reasoning": "six times seven"},
        {"type": "text", "text": "42"},
    ]


async def test_langgraph_bad_block_names_it(media_server: Server) -> None:
    client = lg(media_server)
    thread = await client.threads.create()
    bad = {"type": "image", "base64": base64.b64encode(PDF).decode(), "mime_type": "image/png"}
    r = await fetch(
        "POST",
        f"{media_server.url}/threads/{thread['thread_id']}/runs/wait",
        json={
            "assistant_id": "looker",
            "input": {
                "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, bad]}]
            },
        },
    )
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["type"] == "MediaTypeMismatch"
    assert error["message"].startswith("input.messages[0].content[1]: ")


async def test_media_route_404_for_a_ref_the_thread_does_not_name(media_server: Server) -> None:
    client = lg(media_server)
    mine = await client.threads.create()
    other = await client.threads.create()
    content = [{"type": "image", "base64": PNG_B64, "mime_type": "image/png"}]
    await client.runs.wait(
        mine["thread_id"], "looker", input={"messages": [{"role": "user", "content": content}]}
    )
    ref = f"sha256:{PNG_SHA}"
    seen = await fetch("GET", f"{media_server.url}/threads/{mine['thread_id']}/media/{ref}")
    assert seen.is_success
    # the bytes are in the store, but the other thread names none of them
    r = await fetch("GET", f"{media_server.url}/threads/{other['thread_id']}/media/{ref}")
    assert r.status_code == 404 and "names no media" in r.json()["error"]["message"]
    r = await fetch(
        "GET", f"{media_server.url}/threads/{mine['thread_id']}/media/sha256:{'0' * 64}"
    )
    assert r.status_code == 404
    r = await fetch("GET", f"{media_server.url}/threads/no-such-thread/media/{ref}")
    assert r.status_code == 404


ALICE, BOB = "alice-key-media-1", "bob-key-media-2"


@pytest.fixture(scope="module")
def keyed_media(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("keyed_media")
    (tmp / "keys.yaml").write_text(
        f"- {{name: alice, key: {ALICE}}}\n- {{name: bob, key: {BOB}}}\n"
    )
    srv = start_server(
        tmp,
        "--keys",
        str(tmp / "keys.yaml"),
        app="media_agents:registry",
        source=MEDIA_AGENTS,
    )
    yield srv
    stop_server(srv)


def test_media_route_is_owner_checked(keyed_media: Server) -> None:
    url = keyed_media.url
    alice, bob = ({"Authorization": f"Bearer {k}"} for k in (ALICE, BOB))
    thread = httpx.post(f"{url}/threads", json={}, headers=alice).json()["thread_id"]
    content = [{"type": "image", "base64": PNG_B64, "mime_type": "image/png"}]
    run = {"assistant_id": "looker", "input": {"messages": [{"role": "user", "content": content}]}}
    done = httpx.post(f"{url}/threads/{thread}/runs/wait", json=run, headers=alice)
    assert done.status_code == 200, done.text
    path = f"/threads/{thread}/media/sha256:{PNG_SHA}"
    assert httpx.get(url + path, headers=alice).content == PNG
    r = httpx.get(url + path, headers=bob)
    assert r.status_code == 404 and thread in r.json()["error"]["message"]
    assert httpx.get(url + path).status_code == 401


def test_parse_errors_name_the_part_offline() -> None:
    """Past the size limit: refused before decoding (a request that big is over the server's
    default --max-body, so this is checked without one)."""
    from loom.content import MAX_MEDIA_BYTES
    from loom.errors import MediaTooLarge
    from loom.server.content_blocks import openai_parts

    huge = "A" * (MAX_MEDIA_BYTES * 4 // 3 + 8)
    with pytest.raises(MediaTooLarge) as caught:
        openai_parts(
            [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{huge}"}}],
            "messages[0].content",
        )
    assert caught.value.part == "messages[0].content[0]"
    assert "over the" in str(caught.value)


async def test_langgraph_streams_never_carry_the_bytes(media_server: Server) -> None:
    client = lg(media_server)
    thread = await client.threads.create()
    content = [
        {"type": "text", "text": "look"},
        {"type": "image", "base64": PNG_B64, "mime_type": "image/png"},
    ]
    frames = [
        part
        async for part in client.runs.stream(
            thread["thread_id"],
            "looker",
            input={"messages": [{"role": "user", "content": content}]},
            stream_mode=["values", "messages-tuple", "updates", "events"],
        )
    ]
    assert PNG_B64 not in str([f.data for f in frames])
    user = next(
        f.data["data"] for f in frames if f.event == "events" and f.data["type"] == "user_message"
    )
    assert user["parts"][0]["ref"] == f"sha256:{PNG_SHA}", user
    last_values = [f.data for f in frames if f.event == "values"][-1]
    assert last_values["messages"][0]["content"][1]["url"].endswith(f"/media/sha256:{PNG_SHA}")


async def test_a_cron_refuses_media_rather_than_dropping_them(media_server: Server) -> None:
    from langgraph_sdk.errors import UnprocessableEntityError

    content = [
        {"type": "text", "text": "every morning"},
        {"type": "image", "base64": PNG_B64, "mime_type": "image/png"},
    ]
    with pytest.raises(UnprocessableEntityError) as caught:
        await lg(media_server).crons.create(
            "looker",
            schedule="0 9 * * *",
            input={"messages": [{"role": "user", "content": content}]},
        )
    assert "cannot keep images" in str(caught.value.body)

"""An agent's answer with media, as the official ``mcp`` client reads it from ``/mcp`` on a real
``loom serve``: the text first, then in the answer's order the image as ``ImageContent``, the
PDF as an ``EmbeddedResource`` blob and the sound as ``AudioContent``, each with the very
bytes."""

from __future__ import annotations

import base64

import pytest
from tests.interop.a2a_agents import BEEP, CHART, REPORT
from tests.interop.conftest import MEDIA_KEY
from tests.server.conftest import Server

mcp = pytest.importorskip("mcp")

pytestmark = pytest.mark.timeout(120)


async def test_an_answers_media_are_mcp_content_beside_its_text(media_server: Server) -> None:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {MEDIA_KEY}"}, timeout=30)
    transport = streamable_http_client(media_server.url + "/mcp", http_client=http)
    async with http, mcp.Client(transport) as client:
        result = await client.call_tool("looker", {"message": "show me everything"})
        plain = await client.call_tool("looker", {"message": "hello"})
    assert not result.is_error
    text, image, resource, audio = result.content  # the answer's order
    assert text.type == "text" and text.text == "all of it"
    assert image.type == "image" and image.mime_type == "image/png"
    assert base64.b64decode(image.data) == CHART
    assert audio.type == "audio" and audio.mime_type == "audio/wav"
    assert base64.b64decode(audio.data) == BEEP
    assert resource.type == "resource" and resource.resource.mime_type == "application/pdf"
    assert base64.b64decode(resource.resource.blob) == REPORT
    assert resource.resource.uri.startswith("loom://media/sha256:")
    assert resource.resource.meta == {"loom/filename": "report.pdf"}
    # an answer without media is its text alone, as before
    assert [c.type for c in plain.content] == ["text"]

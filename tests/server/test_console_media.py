"""The console shows a session's media in a real browser (headless Chromium, driven by
playwright) against a real ``loom serve`` with API keys: an image the user sent (over AG-UI)
and one in the answer are shown inline (loaded: ``naturalWidth > 0``), live and after a
reload; a PDF is a download link whose answer is the file (``Content-Disposition:
attachment``, its name); the answer's reasoning is folded (``<details>``). The media route
answers only a logged-in key that sees the session, and only for media the session names.
Screenshots go to ``tests/artifacts/console/``.

The server keeps its sessions in memory (``--store :memory:``): ``MemoryStore`` keeps media
(``BlobStore``); the SQLite store gets it in its own change."""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.server.conftest import Server, start_server, stop_server
from tests.server.test_console_browser import ARTIFACTS, CHROMIUM, KEY, login, shot, wait_live

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra")

OTHER_KEY = "console-other-key-8901"
PDF = b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n"

AGENTS = r'''
"""An agent that looks at what it is sent and answers with its reasoning and a chart."""

import struct
import zlib

from loom import Agent, ModelResponse
from loom.content import Image, Reasoning
from loom.server import AgentRegistry
from loom.testing import FunctionModel


def png(width, height):
    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + b"\x20\x60\xd0" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def shower(messages, tools):
    last = messages[-1]
    seen = ", ".join(f"{p.name or p.kind} ({p.size} bytes)" for p in last.parts)
    return ModelResponse(
        text=f"I got {seen}; here is a chart of it.",
        parts=[
            Reasoning(text="The user sent a picture and a report; a chart answers best.",
                      provider="anthropic", signature="sig-123"),
            Image.from_bytes(png(64, 40), name="answer-chart.png"),
        ],
    )


registry = AgentRegistry([Agent(name="shower", model=FunctionModel(shower))])
'''


def png_of(width: int, height: int) -> bytes:
    from tests.interop.a2a_agents import png

    return png(width, height)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("console-media")
    srv = start_server(
        tmp,
        app="console_media_agents:registry",
        source=AGENTS,
        env={"LOOM_API_KEYS": f"{KEY},{OTHER_KEY}"},
    )
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(
            executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
            args=["--no-sandbox", "--headless", "--disable-gpu", "--no-first-run"],
        )
        yield b
        b.close()


def _agui(server: Server, thread_id: str, photo: bytes) -> None:
    """The user's message with a photo and a PDF, over AG-UI (read to the stream's end)."""
    body = {
        "threadId": thread_id,
        "runId": "r1",
        "state": {},
        "tools": [],
        "context": [],
        "forwardedProps": {},
        "messages": [
            {
                "id": "u1",
                "role": "user",
                "content": [
                    {"type": "text", "text": "what do you make of these?"},
                    {
                        "type": "image",
                        "source": {
                            "type": "data",
                            "value": base64.b64encode(photo).decode(),
                            "mimeType": "image/png",
                        },
                        "metadata": {"filename": "photo.png"},
                    },
                    {
                        "type": "document",
                        "source": {
                            "type": "data",
                            "value": base64.b64encode(PDF).decode(),
                            "mimeType": "application/pdf",
                        },
                        "metadata": {"filename": "report.pdf"},
                    },
                ],
            }
        ],
    }
    r = httpx.post(f"{server.url}/agui/shower", json=body, headers={"x-api-key": KEY}, timeout=30)
    assert r.status_code == 200 and "RUN_FINISHED" in r.text, r.text


def _loaded(page: Any, selector: str) -> list[int]:
    """The natural widths of the images ``selector`` finds, once each has loaded."""
    page.wait_for_function(
        "sel => [...document.querySelectorAll(sel)].every(i => i.complete)", arg=selector
    )
    widths: list[int] = page.locator(selector).evaluate_all("imgs => imgs.map(i => i.naturalWidth)")
    return widths


def test_images_inline_files_as_downloads_reasoning_folded(browser: Any, server: Server) -> None:
    page = login(browser, server)
    photo = png_of(48, 32)
    with httpx.Client(base_url=server.url, headers={"x-api-key": KEY}, timeout=30) as client:
        client.post("/threads", json={"thread_id": "media-1"}).raise_for_status()
        _agui(server, "media-1", photo)  # the user's photo and PDF; the answer's chart
        page.goto(f"{server.url}/console/sessions/media-1")
        wait_live(page)
        # a second turn over the run API streams into the open page (AG-UI runs do not:
        # the console follows the runs the server's run manager publishes)
        client.post(
            "/threads/media-1/runs",
            json={
                "assistant_id": "shower",
                "input": {"messages": [{"role": "user", "content": "and now?"}]},
            },
        ).raise_for_status()
    page.locator("#transcript li.m-assistant").nth(1).wait_for()
    page.locator("li.run[data-status=completed]").nth(1).wait_for()
    for where in ("live", "loaded"):
        # the user's photo and each answer's chart, in the transcript and the timeline
        assert _loaded(page, "#transcript img") == [48, 64, 64], where
        assert _loaded(page, "li.run img") == [48, 64, 64], where
        user = page.locator("#transcript li.m-user").first
        assert user.locator("img").get_attribute("alt") == "photo.png"
        link = user.locator("div.media.file a.download")
        assert link.text_content() == "report.pdf"
        # the reasoning is folded, before the answer's text, and opens on a click
        for answer in page.locator("#transcript li.m-assistant").all():
            reasoning = answer.locator("details.reasoning")
            assert reasoning.count() == 1 and reasoning.get_attribute("open") is None
            assert not reasoning.locator("pre").is_visible()
            order = answer.evaluate(
                "li => [...li.querySelectorAll('details.reasoning, pre.content, figure.media')]"
                ".map(e => e.tagName)"
            )
            assert order == ["DETAILS", "PRE", "FIGURE"], where
            assert "sig-123" not in answer.inner_html()  # the provider's signature stays inside
        first = page.locator("#transcript li.m-assistant details.reasoning").first
        first.locator("summary").click()
        assert "a chart answers best" in first.locator("pre").text_content()
        shot(page, f"media-{where}")
        if where == "live":
            page.reload()
            page.locator("li.run[data-status=completed]").nth(1).wait_for()
    # the PDF link downloads the file under its name
    pdf_link = page.locator("#transcript li.m-user div.media.file a.download")
    href = pdf_link.get_attribute("href")
    assert href is not None
    got = page.request.get(f"{server.url}{href}")
    assert got.status == 200 and got.body() == PDF
    assert got.headers["content-type"] == "application/pdf"
    assert got.headers["content-disposition"].startswith('attachment; filename="report.pdf"')
    with page.expect_download() as download:
        pdf_link.click()
    assert download.value.suggested_filename == "report.pdf"
    # an image's own address shows it inline, with no script allowed
    src = page.locator("#transcript li.m-user img").get_attribute("src")
    assert src is not None and re.fullmatch(
        r"/console/sessions/media-1/media/sha256:[0-9a-f]{64}", src
    )
    image = page.request.get(f"{server.url}{src}")
    assert image.body() == photo and image.headers["content-disposition"].startswith("inline")
    assert "sandbox" in image.headers["content-security-policy"]
    page.context.close()


def test_the_media_route_answers_only_for_the_sessions_own_media(
    browser: Any, server: Server
) -> None:
    photo = png_of(20, 10)
    with httpx.Client(base_url=server.url, headers={"x-api-key": KEY}, timeout=30) as client:
        client.post("/threads", json={"thread_id": "media-2"}).raise_for_status()
        client.post("/threads", json={"thread_id": "media-empty"}).raise_for_status()
    _agui(server, "media-2", photo)
    ref = "sha256:" + hashlib.sha256(photo).hexdigest()
    page = login(browser, server)
    ok = page.request.get(f"{server.url}/console/sessions/media-2/media/{ref}")
    assert ok.status == 200 and ok.body() == photo
    # the same bytes through a session that does not name them, a made-up ref, a bad ref
    for path in (
        f"/console/sessions/media-empty/media/{ref}",
        f"/console/sessions/media-2/media/sha256:{'0' * 64}",
        "/console/sessions/media-2/media/..%2F..%2Fetc",
    ):
        missing = page.request.get(f"{server.url}{path}")
        assert missing.status == 404, path
        assert "text/html" in missing.headers["content-type"]
    page.context.close()
    # another key does not see the session, so not its media either
    other = login(browser, server, key=OTHER_KEY)
    refused = other.request.get(f"{server.url}/console/sessions/media-2/media/{ref}")
    assert refused.status == 404 and refused.body() != photo
    other.context.close()
    # without a login: the login form, never the bytes
    anonymous = httpx.get(f"{server.url}/console/sessions/media-2/media/{ref}", timeout=30)
    assert anonymous.content != photo and anonymous.status_code in (302, 303, 401)

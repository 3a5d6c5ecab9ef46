"""Tools that return media: the parts reach the next model request, are stored once, and the
ledger row of the call keeps them (as references) through the store's codec."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest

from loom import Agent, Message, ModelResponse, ToolCall, tool
from loom.content import File, Image, describe
from loom.engine.runtime import Runtime
from loom.store.base import LedgerEntry
from loom.store.codec import decode_ledger, encode_ledger
from loom.store.memory import MemoryStore
from loom.testing import FunctionModel
from loom.tools import mcp_server
from loom.tools.media import split_media


def png(width: int, height: int, colour: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.new("RGB", (width, height), colour).save(buf, format="PNG")
    return buf.getvalue()


CHART = png(64, 32)
PDF = b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n"


@tool
def chart(title: str) -> list[Any]:
    """Draw a chart.

    Args:
        title: Its title.
    """
    return [f"Here is {title}:", Image.from_bytes(CHART, name="chart.png")]


@tool
def report() -> dict[str, Any]:
    """Write a report."""
    return {"pages": 1, "file": File.from_bytes(PDF, name="report.pdf")}


def scripted(seen: list[list[Message]], name: str, arguments: dict[str, Any]) -> FunctionModel:
    def answer(messages: list[Message], tools: Any) -> ModelResponse | str:
        seen.append(list(messages))
        if messages[-1].role == "tool":
            return "done"
        return ModelResponse(tool_calls=[ToolCall(id="c1", name=name, arguments=arguments)])

    return FunctionModel(answer)


async def test_an_image_a_tool_returns_reaches_the_next_request_and_is_stored_once() -> None:
    seen: list[list[Message]] = []
    store = MemoryStore()
    rt = Runtime(store)
    agent = Agent(model=scripted(seen, "chart", {"title": "sales"}), tools=[chart])
    result = await rt.run(agent, "draw sales", session_id="s")
    assert result.stop_reason == "completed" and result.output == "done"
    # the second request shows the tool message with the image part, bytes loaded
    tool_msg = seen[1][-1]
    assert tool_msg.role == "tool" and len(tool_msg.parts) == 1
    part = tool_msg.parts[0]
    assert isinstance(part, Image) and part.data == CHART and (part.width, part.height) == (64, 32)
    # the text the model reads names the image where the tool put it
    assert tool_msg.content == f"Here is sales:\n{describe(part)}"
    assert "[image chart.png: image/png, 64x32" in tool_msg.content
    # stored once, by its hash; the stored message holds the reference, not the bytes
    blobs = await store.session_blobs("s")
    assert blobs == [(part.ref, "image/png", len(CHART))]
    stored = [m for m in await store.load_messages("s") if m.role == "tool"]
    assert [p.ref for p in stored[0].parts] == [part.ref]
    # a second turn sends the same image again: still one blob
    await rt.run(agent, "again", session_id="s")
    assert len(await store.session_blobs("s")) == 1
    # the TOOL_RESULT event carries the part (what the journal stored before the message)
    events = [e for e in await store.load_events("s") if e.type.value == "tool_result"]
    assert all(len(e.parts) == 1 for e in events)


async def test_the_ledger_row_of_a_media_result_keeps_its_references() -> None:
    store = MemoryStore()
    rt = Runtime(store)
    agent = Agent(model=scripted([], "report", {}), tools=[report])
    await rt.run(agent, "write it", session_id="s")
    entry = (await store.ledger("s"))[-1]
    assert entry.status == "completed" and entry.result is not None
    (part,) = entry.result.parts
    assert isinstance(part, File) and part.name == "report.pdf"
    # the data names the file in place; the dict's other values stay
    assert entry.result.data == {"pages": 1, "file": describe(part)}
    # through the stores' codec (what SQLite and PostgreSQL keep): the reference survives
    back: LedgerEntry = decode_ledger("s", encode_ledger(entry))
    assert back.result is not None
    (again,) = back.result.parts
    assert isinstance(again, File) and again.ref == part.ref and again.data is None
    assert again.media_type == "application/pdf" and again.size == len(PDF)


@pytest.mark.parametrize(
    ("value", "data", "kinds"),
    [
        ("text", "text", []),
        ({"a": [1, 2]}, {"a": [1, 2]}, []),
        (Image.from_bytes(CHART), "[image: image/png, 64x32, {n} bytes]", ["image"]),
        (
            ("a", Image.from_bytes(CHART), "b"),
            "a\n[image: image/png, 64x32, {n} bytes]\nb",
            ["image"],
        ),
        ([1, Image.from_bytes(CHART)], [1, "[image: image/png, 64x32, {n} bytes]"], ["image"]),
    ],
)
def test_split_media_shapes(value: Any, data: Any, kinds: list[str]) -> None:
    out, media = split_media(value)
    n = f"{len(CHART):,}"
    expected = (
        data.format(n=n)
        if isinstance(data, str)
        else [d.format(n=n) if isinstance(d, str) else d for d in data]
        if isinstance(data, list)
        else data
    )
    assert out == expected
    assert [m.kind for m in media] == kinds


MEDIA_SERVER = str(Path(__file__).parent / "mcp_servers" / "media_server.py")


@pytest.mark.slow
async def test_an_mcp_tool_returning_image_content_gives_the_model_an_image_part() -> None:
    """A real stdio MCP server (the SDK's) returns ``ImageContent`` and an embedded PDF
    resource: both become parts of the tool messages, not text; a bad image is an error
    result the model reads."""
    seen: list[list[Message]] = []
    calls = [
        ToolCall(id="c1", name="screenshot", arguments={"width": 5, "height": 3}),
        ToolCall(id="c2", name="export_report", arguments={}),
        ToolCall(id="c3", name="broken_image", arguments={}),
    ]

    def answer(messages: list[Message], tools: Any) -> ModelResponse | str:
        seen.append(list(messages))
        return "done" if messages[-1].role == "tool" else ModelResponse(tool_calls=calls)

    store = MemoryStore()
    server = mcp_server("media", command=sys.executable, args=[MEDIA_SERVER])
    agent = Agent(model=FunctionModel(answer), tools=[server])
    rt = Runtime(store)
    try:
        result = await rt.run(agent, "screenshot and report", session_id="s")
    finally:
        await rt.aclose()  # stops the server this runtime started
    assert result.stop_reason == "completed"
    shot, pdf, bad = seen[1][-3:]
    (image,) = shot.parts
    assert isinstance(image, Image) and (image.width, image.height) == (5, 3)
    assert image.data is not None and image.data.startswith(b"\x89PNG")
    assert shot.content == f"Screenshot taken:\n{describe(image)}"
    (doc,) = pdf.parts
    assert isinstance(doc, File) and doc.name == "q3.pdf" and doc.media_type == "application/pdf"
    assert pdf.content.startswith("Report exported.\n[file q3.pdf: application/pdf")
    assert bad.parts == [] and bad.metadata["error_code"] == "mcp_content"
    assert "claims image/png, but its bytes are not that" in bad.content
    assert {r for r, _, _ in await store.session_blobs("s")} == {image.ref, doc.ref}

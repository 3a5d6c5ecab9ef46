"""Content parts (``loom.content``): what a part accepts and refuses, how a run takes them at
the front door, and the journal's promise that a step's media are stored before the messages
that name them, then read back only for a model request."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from loom import Agent
from loom.content import (
    MAX_MEDIA_BYTES,
    Audio,
    Blob,
    File,
    Image,
    Reasoning,
    describe,
    split_content,
)
from loom.engine.run_inputs import NewMessage, as_run_input
from loom.engine.runtime import Runtime
from loom.errors import (
    ContentError,
    MediaTooLarge,
    MediaTypeMismatch,
    UnsupportedContent,
)
from loom.messages import Message, ModelResponse, ToolSpec
from loom.store.memory import MemoryStore
from loom.testing import FunctionModel


def png(width: int = 2, height: int = 1) -> bytes:
    """A real PNG of ``width`` x ``height`` black pixels."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body).to_bytes(4, "big")
        return len(body).to_bytes(4, "big") + kind + body + crc

    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + b"\x08\x00\x00\x00\x00"
    rows = b"".join(b"\x00" + b"\x00" * width for _ in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


PDF = b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n"


# -- parts -------------------------------------------------------------------------------------
def test_image_from_bytes_sniffs_type_hashes_and_sizes() -> None:
    data = png(3, 2)
    img = Image.from_bytes(data)
    assert img.media_type == "image/png"
    assert img.size == len(data)
    assert img.ref is not None and img.ref.startswith("sha256:") and len(img.ref) == 7 + 64
    assert Image.from_bytes(data).ref == img.ref  # content-addressed
    pytest.importorskip("PIL")
    assert (img.width, img.height) == (3, 2)


def test_bytes_never_enter_a_parts_json_form() -> None:
    img = Image.from_bytes(png(), name="dot.png")
    m = Message.user(["look", img])
    text = m.model_dump_json()
    assert img.ref is not None
    assert "IHDR" not in text and img.ref in text  # the reference, not the bytes
    back = Message.model_validate_json(text)
    assert back.parts[0].ref == img.ref and back.parts[0].data is None  # type: ignore[union-attr]


def test_bytes_that_are_not_their_claimed_type_are_refused() -> None:
    with pytest.raises(MediaTypeMismatch, match="claims image/png"):
        Image(data=b"just some text", media_type="image/png")
    with pytest.raises(MediaTypeMismatch, match="image/png"):  # names what they look like
        File(data=png(), media_type="application/pdf", name="fake.pdf")


def test_a_part_without_content_or_of_the_wrong_kind_is_refused() -> None:
    with pytest.raises(ContentError, match="no content"):
        Image()
    with pytest.raises(ContentError, match="both bytes and a URL"):
        Image(data=png(), url="https://example.com/a.png")
    with pytest.raises(ContentError, match="not an image: send it as File"):
        Image(data=PDF)
    with pytest.raises(ContentError, match="not audio"):
        Audio(data=png())
    with pytest.raises(ContentError, match="media type"):
        File(data=b"\x00\x01 no signature")  # unknown bytes need a media_type


def test_a_part_over_the_limit_is_refused_with_its_size(tmp_path: Path) -> None:
    big = tmp_path / "big.pdf"
    with big.open("wb") as f:
        f.write(PDF)
        f.truncate(MAX_MEDIA_BYTES + 1)
    with pytest.raises(MediaTooLarge) as caught:
        File.from_path(big)
    assert caught.value.size == MAX_MEDIA_BYTES + 1 and caught.value.limit == MAX_MEDIA_BYTES
    with pytest.raises(ContentError, match="cannot read"):
        File.from_path(tmp_path / "missing.pdf")


def test_from_path_names_the_part_and_url_parts_guess_their_type(tmp_path: Path) -> None:
    path = tmp_path / "report.pdf"
    path.write_bytes(PDF)
    f = File.from_path(path)
    assert (f.name, f.media_type, f.size) == ("report.pdf", "application/pdf", len(PDF))
    notes = tmp_path / "notes.csv"
    notes.write_text("a,b\n1,2\n")
    assert File.from_path(notes).media_type == "text/csv"
    assert Image(url="https://example.com/cat.jpg?x=1").media_type == "image/jpeg"
    assert describe(f) == f"[file report.pdf: application/pdf, {len(PDF)} bytes]"


def test_split_content_keeps_order_and_refuses_other_things() -> None:
    a, b = Image.from_bytes(png()), File.from_bytes(PDF, name="r.pdf")
    assert split_content(["one", a, "two", b]) == ("one\ntwo", [a, b])
    assert split_content("plain") == ("plain", [])
    assert split_content(a) == ("", [a])
    with pytest.raises(ContentError, match="input item 1 is Reasoning"):
        split_content(["x", Reasoning(text="thinking")])  # type: ignore[list-item]


def test_a_list_input_is_a_new_message_with_parts() -> None:
    img = Image.from_bytes(png())
    assert as_run_input(["what is it?", img]) == NewMessage("what is it?", (img,))
    assert as_run_input(img) == NewMessage("", (img,))


# -- runs --------------------------------------------------------------------------------------
class Recorder:
    """A model function that records, per call, each message's role and whether its media
    came with their bytes."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, list[bool]]]] = []

    def __call__(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> str:
        self.calls.append([(m.role, [p.data is not None for p in m.parts]) for m in messages])  # type: ignore[union-attr]
        return "a black dot"


async def test_media_are_stored_once_and_read_back_for_a_new_runtime() -> None:
    store = MemoryStore()
    seen = Recorder()
    agent = Agent(name="eyes", model=FunctionModel(seen))
    img = Image.from_bytes(png(), name="dot.png")
    first = await Runtime(store=store).run(agent, ["what is this?", img])
    assert first.text == "a black dot"
    assert await store.session_blobs(first.session_id) == [(img.ref, "image/png", img.size)]
    stored = await store.load_messages(first.session_id)
    assert stored[0].parts[0].ref == img.ref and stored[0].parts[0].data is None  # type: ignore[union-attr]
    # another process: the transcript comes from the store; the model still gets the bytes
    await Runtime(store=store).run(agent, "and now?", session_id=first.session_id)
    assert seen.calls[-1][0] == ("user", [True])
    # the image entered the store once, though two runs and three model calls saw it
    assert len(await store.load_blobs([img.ref])) == 1  # type: ignore[list-item]


async def test_a_steps_media_are_stored_before_its_messages() -> None:
    class FailingBlobs(MemoryStore):
        async def put_blobs(self, session_id: str, blobs: Sequence[Blob]) -> None:
            raise OSError("disk full")

    store = FailingBlobs()
    agent = Agent(name="eyes", model=FunctionModel(Recorder()))
    with pytest.raises(OSError, match="disk full"):
        await Runtime(store=store).run(agent, ["look", Image.from_bytes(png())], session_id="s1")
    # nothing of the step that named the image was committed
    assert await store.load_messages("s1") == []


async def test_a_store_that_cannot_keep_media_refuses_them_before_committing() -> None:
    class TextOnly:
        """A MemoryStore without the BlobStore capability."""

        def __init__(self) -> None:
            self.inner = MemoryStore()

        def __getattr__(self, name: str) -> Any:
            if name in {"put_blobs", "load_blobs", "session_blobs"}:
                raise AttributeError(name)
            return getattr(self.inner, name)

    store: Any = TextOnly()
    agent = Agent(name="eyes", model=FunctionModel(Recorder()))
    with pytest.raises(UnsupportedContent, match="cannot keep media"):
        await Runtime(store=store).run(agent, ["look", Image.from_bytes(png())], session_id="s2")
    assert await store.inner.load_messages("s2") == []


async def test_a_model_that_reads_no_media_refuses_them_before_the_run() -> None:
    class TextModel(FunctionModel):
        accepts_media = frozenset({"file"})

    store = MemoryStore()
    agent = Agent(name="blind", model=TextModel(Recorder()))
    with pytest.raises(UnsupportedContent, match="cannot read image input"):
        await Runtime(store=store).run(agent, ["look", Image.from_bytes(png())], session_id="s3")
    assert await store.get_session("s3") is None  # refused at the front door
    ok = await Runtime(store=store).run(agent, ["read", File.from_bytes(PDF, name="r.pdf")])
    assert ok.stop_reason == "completed"


async def test_an_answers_reasoning_is_kept_in_the_transcript() -> None:
    thought = Reasoning(text="2+2 is 4", provider="anthropic", signature="sig==")

    def answer(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> ModelResponse:
        return ModelResponse(text="4", parts=[thought])

    store = MemoryStore()
    result = await Runtime(store=store).run(Agent(name="r", model=FunctionModel(answer)), "2+2?")
    stored = await store.load_messages(result.session_id)
    assert stored[-1].role == "assistant" and stored[-1].parts == [thought]

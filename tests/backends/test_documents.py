"""The document backend on a folder of real files (Markdown, text, PDF made with pypdf), with a
change picked up live by the watcher (waited for through the index's change callback)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pypdf")
pytest.importorskip("watchfiles")

from loom.backends.documents import DocumentBackend
from loom.errors import BackendConfigError, BackendRefused, ToolError


def _pdf(path: Path, *, password: str | None = None) -> None:
    from pypdf import PdfWriter

    writer = PdfWriter()
    writer.add_blank_page(width=200, height=200)
    if password:
        writer.encrypt(password)
    with path.open("wb") as f:
        writer.write(f)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "guide.md").write_text(
        "# Deploying\n\nRun the migration before the rollout.\n\n"
        + "filler text. " * 300
        + "\n\nThe rollback needs the previous image tag."
    )
    (tmp_path / "notes.txt").write_text("Quarterly revenue grew; churn fell.")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "faq.md").write_text("How do I reset a password? Use the console.")
    _pdf(tmp_path / "locked.pdf", password="hunter2")
    (tmp_path / ".hidden.md").write_text("rollback secret")
    return tmp_path


@pytest.fixture
def docs(folder: Path) -> Iterator[DocumentBackend]:
    b = DocumentBackend(folder, chunk_chars=500, page_chars=1000, force_polling=True)
    yield b
    b.close()


def _tools(b: DocumentBackend) -> dict[str, object]:
    return {t.name: t for t in b.tools()}


def test_search_ranks_snippets_with_source_and_position(docs: DocumentBackend) -> None:
    out = docs.search("rollback image tag")
    first = out.splitlines()[0]
    assert first.startswith("[1] guide.md (part ")
    assert "[rollback]" in first and "from character" in first
    assert ".hidden" not in out
    assert docs.search("password reset").splitlines()[0].startswith("[1] sub/faq.md")
    assert docs.search("zebra") == "no document matches; try other words"
    assert isinstance(docs.search('"; DROP TABLE chunks; --'), str)  # words only, no FTS syntax
    assert docs.search("rollback")  # the index survived the odd query above


def test_read_document_pages_and_refuses_other_paths(docs: DocumentBackend) -> None:
    page1 = docs.read("guide.md")
    assert page1.startswith("guide.md, page 1 of ") and "(next: page=2)" in page1
    pages = int(page1.split(" of ")[1].split(" ")[0])
    last = docs.read("guide.md", pages)
    assert "previous image tag" in last and "next:" not in last
    with pytest.raises(ToolError, match="pages 1 to"):
        docs.read("guide.md", pages + 1)
    for outside in ("../etc/passwd", "/etc/passwd", ".hidden.md"):
        with pytest.raises(BackendRefused):
            docs.read(outside)


def test_an_encrypted_pdf_is_an_error_result_not_a_crash(docs: DocumentBackend) -> None:
    assert "locked.pdf (unreadable: the PDF is encrypted" in docs.schema_text(500)
    with pytest.raises(ToolError, match="encrypted") as info:
        docs.read("locked.pdf")
    assert info.value.code == "unreadable"


def test_a_change_is_picked_up_live(docs: DocumentBackend, folder: Path) -> None:
    changed: list[list[str]] = []
    seen = threading.Event()

    def listener(names: list[str]) -> None:
        changed.append(names)
        if "new.md" in names:
            seen.set()

    docs.on_change(listener)
    assert docs.search("kumquat") == "no document matches; try other words"
    (folder / "new.md").write_text("Kumquats ship on Tuesdays.")
    assert seen.wait(20), "the watcher never reported new.md"
    assert docs.search("kumquat").startswith("[1] new.md")
    gone = threading.Event()
    docs.on_change(lambda names: gone.set() if "notes.txt" in names else None)
    (folder / "notes.txt").unlink()
    assert gone.wait(20)
    assert "notes.txt" not in docs.schema_text(500)


def test_configuration_errors(tmp_path: Path) -> None:
    with pytest.raises(BackendConfigError, match="does not exist"):
        DocumentBackend(tmp_path / "nope")
    with pytest.raises(BackendConfigError, match="does not exist"):
        DocumentBackend([tmp_path / "missing.md"])

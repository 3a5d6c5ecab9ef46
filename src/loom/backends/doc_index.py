"""The document backend's full-text index: SQLite FTS5 (BM25 ranking) over text chunks.

One in-memory database per backend, guarded by a lock (tool threads and the watcher use it).
Files are read as text (Markdown, plain text) or through ``pypdf``; a file that cannot be read
(an encrypted PDF, bad bytes) is recorded with its reason instead of stopping the indexing.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DocumentIndex", "Hit", "read_text"]


@dataclass(frozen=True, slots=True)
class Hit:
    path: str
    chunk: int
    start: int
    snippet: str
    score: float


class UnreadableDocument(Exception):
    """A file the index cannot read (the reason is the message)."""


def read_text(path: Path) -> str:
    """The text of a document; raises ``UnreadableDocument`` with a reason."""
    if path.suffix.lower() == ".pdf":
        try:
            from pypdf import PdfReader
            from pypdf.errors import PdfReadError
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise UnreadableDocument("reading PDFs needs pypdf (loom-agents[backends])") from exc
        try:
            reader = PdfReader(str(path))
            if reader.is_encrypted and not reader.decrypt(""):
                raise UnreadableDocument("the PDF is encrypted (password protected)")
            return "\n\n".join(page.extract_text() or "" for page in reader.pages)
        except UnreadableDocument:
            raise
        except (PdfReadError, ValueError, OSError, KeyError) as exc:
            raise UnreadableDocument(f"the PDF cannot be read: {exc}") from None
        except Exception as exc:  # pypdf raises assorted errors on damaged files
            if "encrypt" in str(exc).lower() or "decrypt" in str(exc).lower():
                raise UnreadableDocument("the PDF is encrypted (password protected)") from None
            raise UnreadableDocument(f"the PDF cannot be read: {exc}") from None
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return path.read_text(encoding="latin-1")
    except OSError as exc:
        raise UnreadableDocument(f"cannot read the file: {exc}") from None


def chunks_of(text: str, size: int) -> list[tuple[int, str]]:
    """(start offset, text) pieces of about ``size`` characters, cut at paragraph breaks."""
    out: list[tuple[int, str]] = []
    start = 0
    while start < len(text):
        end = min(len(text), start + size)
        if end < len(text):
            brk = text.rfind("\n\n", start + size // 2, end)
            if brk > start:
                end = brk
        piece = text[start:end]
        if piece.strip():
            out.append((start, piece))
        start = end
    return out


_WORD = re.compile(r"\w+", re.UNICODE)


def fts_query(text: str) -> str:
    """The model's words as an FTS5 query: each word quoted (no operators, no column
    filters), any of them matching, BM25 ranking the documents with more of them first."""
    words = _WORD.findall(text)[:32]
    return " OR ".join(f'"{w}"' for w in words)


class DocumentIndex:
    """Chunks of every readable file, searchable with FTS5."""

    def __init__(self, chunk_chars: int = 1500) -> None:
        self.chunk_chars = chunk_chars
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.executescript(
            "CREATE VIRTUAL TABLE chunks USING fts5(path UNINDEXED, chunk UNINDEXED, "
            "start UNINDEXED, body, tokenize='porter unicode61');"
            "CREATE TABLE docs(path TEXT PRIMARY KEY, stamp TEXT, chars INTEGER, error TEXT);"
        )
        self._lock = threading.Lock()
        self._texts: dict[str, str] = {}

    def update(self, files: Iterable[tuple[str, Path]]) -> list[str]:
        """Bring the index up to date with ``files`` ((name, path) pairs: every file there
        is); returns the names added, changed or removed."""
        changed: list[str] = []
        wanted = dict(files)
        with self._lock:
            known = {r[0]: r[1] for r in self._db.execute("SELECT path, stamp FROM docs")}
            for name in set(known) - set(wanted):
                self._remove(name)
                changed.append(name)
            for name, path in sorted(wanted.items()):
                try:
                    st = path.stat()
                except OSError:
                    continue
                stamp = f"{st.st_mtime_ns}:{st.st_size}"
                if known.get(name) == stamp:
                    continue
                self._remove(name)
                try:
                    text, error = read_text(path), None
                except UnreadableDocument as exc:
                    text, error = "", str(exc)
                self._texts[name] = text
                self._db.execute(
                    "INSERT INTO docs VALUES (?, ?, ?, ?)", (name, stamp, len(text), error)
                )
                self._db.executemany(
                    "INSERT INTO chunks(path, chunk, start, body) VALUES (?, ?, ?, ?)",
                    [
                        (name, i, s, piece)
                        for i, (s, piece) in enumerate(chunks_of(text, self.chunk_chars))
                    ],
                )
                changed.append(name)
            self._db.commit()
        return changed

    def _remove(self, name: str) -> None:
        self._db.execute("DELETE FROM chunks WHERE path = ?", (name,))
        self._db.execute("DELETE FROM docs WHERE path = ?", (name,))
        self._texts.pop(name, None)

    def search(self, query: str, limit: int) -> list[Hit]:
        q = fts_query(query)
        if not q:
            return []
        with self._lock:
            rows = self._db.execute(
                "SELECT path, chunk, start, snippet(chunks, 3, '[', ']', '…', 24), "
                "bm25(chunks) AS score FROM chunks WHERE chunks MATCH ? ORDER BY score LIMIT ?",
                (q, limit),
            ).fetchall()
        return [Hit(r[0], int(r[1]), int(r[2]), r[3].replace("\n", " "), float(r[4])) for r in rows]

    def documents(self) -> list[tuple[str, int, str | None]]:
        """(name, characters, error) of every indexed file."""
        with self._lock:
            rows = self._db.execute("SELECT path, chars, error FROM docs ORDER BY path")
            return [(r[0], int(r[1]), r[2]) for r in rows]

    def text(self, name: str) -> tuple[str, str | None] | None:
        """(text, error) of a document, or None if it is not indexed."""
        with self._lock:
            row = self._db.execute("SELECT error FROM docs WHERE path = ?", (name,)).fetchone()
            if row is None:
                return None
            return self._texts.get(name, ""), row[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()

"""``DocumentBackend``: a folder (or list) of Markdown, text and PDF files, searchable with
BM25 (SQLite FTS5) and readable page by page; the index follows file changes (``watchfiles``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from loom.backends.base import trim_to_tokens
from loom.backends.doc_index import DocumentIndex
from loom.errors import BackendConfigError, BackendRefused, ToolError
from loom.tools.base import FunctionTool, Tool

__all__ = ["DocumentBackend"]

log = logging.getLogger("loom.backends")

SUFFIXES = (".md", ".markdown", ".txt", ".rst", ".pdf")


class DocumentBackend:
    """A document collection as an agent's domain.

    Args:
        source: A folder (searched recursively for ``suffixes``) or a list of files.
        suffixes: File kinds to index.
        chunk_chars: Size of the pieces the search ranks and shows.
        page_chars: Characters per ``read_document`` page.
        watch: Follow changes to the files (a watcher thread until ``close()``).
        name, prefix: The backend's name; a prefix for its tool names.
    """

    def __init__(
        self,
        source: str | Path | Sequence[str | Path],
        *,
        suffixes: Sequence[str] = SUFFIXES,
        chunk_chars: int = 1500,
        page_chars: int = 4000,
        watch: bool = True,
        name: str = "docs",
        prefix: str = "",
        debounce_ms: int = 50,
        force_polling: bool | None = None,
    ) -> None:
        if isinstance(source, str | Path):
            self.root: Path | None = Path(source).resolve()
            if not self.root.is_dir():
                raise BackendConfigError(f"document folder {str(source)!r} does not exist")
            self.files: list[Path] | None = None
        else:
            self.root = None
            self.files = [Path(p).resolve() for p in source]
            missing = [str(p) for p in self.files if not p.is_file()]
            if missing:
                raise BackendConfigError(f"document file {missing[0]!r} does not exist")
        if chunk_chars < 100 or page_chars < 100:
            raise BackendConfigError("chunk_chars and page_chars must be at least 100")
        self.name, self.prefix = name, prefix
        self.suffixes = tuple(s.lower() for s in suffixes)
        self.page_chars = page_chars
        self.config: dict[str, Any] | None = None
        self.index = DocumentIndex(chunk_chars)
        self.version = 0
        self._cond = threading.Condition()
        self._listeners: list[Callable[[list[str]], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._debounce, self._polling = debounce_ms, force_polling
        self.refresh()
        self._tools = self._make_tools()
        if watch:
            self.watch()

    # -- the index ----------------------------------------------------------------------------
    def _current(self) -> list[tuple[str, Path]]:
        if self.root is None:
            assert self.files is not None
            return [(p.name, p) for p in self.files if p.is_file()]
        return [
            (p.relative_to(self.root).as_posix(), p)
            for p in sorted(self.root.rglob("*"))
            if p.suffix.lower() in self.suffixes
            and p.is_file()
            and not any(part.startswith(".") for part in p.relative_to(self.root).parts)
        ]

    def refresh(self) -> list[str]:
        """Re-read what changed on disk; returns the changed names (listeners are told)."""
        changed = self.index.update(self._current())
        if changed:
            with self._cond:
                self.version += 1
                self._cond.notify_all()
            for listener in list(self._listeners):
                try:
                    listener(changed)
                except Exception:
                    log.exception("document index listener failed")
        return changed

    def on_change(self, listener: Callable[[list[str]], None]) -> None:
        """Call ``listener(changed_names)`` after every update of the index."""
        self._listeners.append(listener)

    def wait_for_version(self, version: int, timeout: float | None = None) -> bool:
        """Block until the index reaches ``version``; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self.version >= version, timeout)

    def watch(self) -> None:
        """Start following file changes (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        try:
            import watchfiles  # noqa: F401
        except ImportError as exc:  # pragma: no cover - depends on the environment
            from loom.errors import MissingDependencyError

            raise MissingDependencyError("watchfiles", "backends", "Document watching") from exc
        ready = threading.Event()
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._watch_loop, args=(ready,), daemon=True, name=f"loom-docs-watch:{self.name}"
        )
        self._thread.start()
        ready.wait(5)

    def _watch_loop(self, ready: threading.Event) -> None:
        from watchfiles import watch

        targets = (
            [self.root] if self.root is not None else sorted({p.parent for p in self.files or []})
        )
        try:
            changes = watch(
                *targets,
                stop_event=self._stop,
                raise_interrupt=False,
                rust_timeout=1000,
                yield_on_timeout=True,
                debounce=self._debounce,
                step=20,
                force_polling=self._polling,
            )
            ready.set()
            first = True
            for batch in changes:
                if self._stop.is_set():
                    break
                if batch or first:  # the first tick catches writes made before the watch began
                    self.refresh()
                first = False
        except Exception:
            log.exception("document watcher for %s stopped", self.name)
        finally:
            ready.set()

    # -- tools --------------------------------------------------------------------------------
    def tools(self) -> list[Tool]:
        return list(self._tools)

    def search(self, query: str, limit: int = 5) -> str:
        hits = self.index.search(query, max(1, min(int(limit), 20)))
        if not hits:
            return "no document matches; try other words"
        return "\n".join(
            f"[{i}] {h.path} (part {h.chunk + 1}, from character {h.start}): {h.snippet}"
            for i, h in enumerate(hits, 1)
        )

    def read(self, path: str, page: int = 1) -> str:
        name = path.strip()
        name = name[2:] if name.startswith("./") else name
        found = self.index.text(name)
        if found is None:
            names = [d[0] for d in self.index.documents()]
            raise BackendRefused(
                f"{path!r} is not a document of this collection; documents: "
                f"{', '.join(names[:30])}{' …' if len(names) > 30 else ''}"
            )
        text, error = found
        if error:
            raise ToolError(f"{path} cannot be read: {error}", code="unreadable")
        pages = max(1, -(-len(text) // self.page_chars))
        if page < 1 or page > pages:
            raise ToolError(f"{path} has pages 1 to {pages}; asked for {page}", code="bad_page")
        start = (page - 1) * self.page_chars
        body = text[start : start + self.page_chars]
        more = f" (next: page={page + 1})" if page < pages else ""
        return f"{path}, page {page} of {pages}{more}:\n{body}"

    def _make_tools(self) -> list[Tool]:
        backend = self

        def search_documents(query: str, limit: int = 5) -> str:
            """Search the documents; returns ranked snippets with their source and position.

            Args:
                query: Words to look for.
                limit: How many results (1-20).
            """
            return backend.search(query, limit)

        def read_document(path: str, page: int = 1) -> str:
            """Read a document page by page.

            Args:
                path: The document's name, as search_documents shows it.
                page: Which page (1 is the first).
            """
            return backend.read(path, page)

        p = self.prefix
        return [
            FunctionTool(search_documents, name=f"{p}search_documents", effect="pure"),
            FunctionTool(read_document, name=f"{p}read_document", effect="pure"),
        ]

    def schema_text(self, budget: int) -> str:
        docs = self.index.documents()
        lines = [
            f"Document collection {self.name!r} ({len(docs)} documents): find passages with "
            f"{self.prefix}search_documents, read with {self.prefix}read_document. Documents:"
        ]
        lines += [f"- {n}" + (f" (unreadable: {e})" if e else "") for n, _, e in docs]
        return trim_to_tokens(lines, budget)

    def close(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)

    def __repr__(self) -> str:
        where = str(self.root) if self.root else f"{len(self.files or [])} files"
        return f"DocumentBackend({where!r})"

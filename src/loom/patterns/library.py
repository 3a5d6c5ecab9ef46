"""``PatternLibrary``: a directory of YAML patterns, its TF-IDF index, and hot reload."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType

from loom.errors import DuplicatePatternName, EmptyPatternLibrary, InputError, PatternError
from loom.patterns.index import DEFAULT_K, DEFAULT_MIN_SCORE, PatternIndex, build_index
from loom.patterns.model import (
    PATTERN_SUFFIXES,
    FileCache,
    Pattern,
    PatternProblem,
    digests_of,
    load_dir,
)

__all__ = ["PatternLibrary"]

log = logging.getLogger("loom.patterns")


def _check_min_score(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise InputError(f"min_score must be a number from 0 to 1, got {value!r}")
    return float(value)


class PatternLibrary:
    """Domain patterns matched to messages by TF-IDF cosine similarity.

    ``PatternLibrary.from_dir(path, watch=True)`` loads every YAML file under ``path`` and
    rebuilds the index in a background thread whenever a file is added, changed or deleted,
    then swaps it in atomically. ``snapshot()`` returns the current index; a turn keeps the
    snapshot it started with, so a reload never changes a turn in flight.

    Invalid files are skipped and listed in ``problems`` (path, field, message); the valid
    ones load. Call ``close()`` (or use ``with``) to stop watching.
    """

    def __init__(
        self,
        patterns: Iterable[Pattern] = (),
        *,
        k: int = DEFAULT_K,
        min_score: float = DEFAULT_MIN_SCORE,
    ) -> None:
        """A library of in-memory patterns (no directory, no reload)."""
        items = list(patterns)
        seen: dict[str, Pattern] = {}
        for p in items:
            if not isinstance(p, Pattern):
                raise InputError(f"PatternLibrary takes Pattern objects, got {type(p).__name__}")
            if p.name in seen:
                raise DuplicatePatternName(
                    p.name,
                    path=p.source or "(in memory)",
                    first_path=seen[p.name].source or "(in memory)",
                )
            seen[p.name] = p
        self.root: Path | None = None
        self.k = k
        self.min_score = _check_min_score(min_score)
        self._index = build_index(items)
        self._cond = threading.Condition()
        self._reload_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._debounce_ms, self._step_ms = 1600, 50
        self._force_polling: bool | None = None
        self._digests: tuple[tuple[str, bytes], ...] = ()
        self._cache: FileCache = {}
        self.watch_error: BaseException | None = None

    # -- loading ------------------------------------------------------------------------------
    @classmethod
    def from_dir(
        cls,
        path: str | Path,
        watch: bool = False,
        *,
        k: int = DEFAULT_K,
        min_score: float = DEFAULT_MIN_SCORE,
        strict: bool = False,
        allow_empty: bool = False,
        debounce_ms: int = 1600,
        step_ms: int = 50,
        force_polling: bool | None = None,
    ) -> PatternLibrary:
        """Load the ``*.yaml`` / ``*.yml`` files under ``path``.

        Args:
            watch: Reload on file changes (``watchfiles``) until ``close()``.
            k: Default number of patterns ``match`` returns.
            min_score: Cosine similarity below which a pattern does not match.
            strict: Raise the first problem (``PatternFileError`` / ``DuplicatePatternName``)
                instead of skipping bad files.
            allow_empty: Accept a directory with no valid pattern (useful with ``watch``);
                otherwise ``EmptyPatternLibrary`` is raised.
            debounce_ms, step_ms: Passed to ``watchfiles.watch``: changes are gathered until
                none arrives for ``step_ms`` (at most ``debounce_ms``), then one rebuild runs.
            force_polling: Poll instead of OS notifications (network file systems).
        """
        root = Path(path)
        if not root.is_dir():
            raise PatternError(
                f"pattern directory {root} does not exist or is not a directory; "
                "create it or pass the directory that holds your *.yaml patterns"
            )
        lib = cls(k=k, min_score=min_score)
        lib.root = root
        lib._debounce_ms, lib._step_ms, lib._force_polling = debounce_ms, step_ms, force_polling
        index = lib._load()
        if strict and index.problems:
            err = index.problems[0].to_error()
            if len(index.problems) > 1:
                err.add_note(
                    f"{len(index.problems) - 1} more problem(s); run "
                    f"'loom patterns validate {root}' to list them all"
                )
            raise err
        if not index.patterns and not allow_empty:
            raise EmptyPatternLibrary(_empty_message(root, index.problems))
        lib._index = index
        if watch:
            lib.watch()
        return lib

    def _load(self, version: int = 0) -> PatternIndex:
        assert self.root is not None
        result = load_dir(self.root, self._cache)
        self._digests = result.digests
        problems = list(result.problems)
        if not result.patterns:
            problems.append(
                PatternProblem(
                    str(self.root),
                    f"the library is empty: no valid pattern ({len(problems)} file(s) skipped); "
                    "matching returns nothing until a valid file is added",
                    kind="empty",
                    error=EmptyPatternLibrary(_empty_message(self.root, problems)),
                )
            )
        return build_index(result.patterns, problems, version)

    def reload(self) -> PatternIndex:
        """Re-read the directory now, swap the new index in and return it."""
        if self.root is None:
            raise PatternError(
                "this library was built from in-memory patterns; only a "
                "library made with from_dir() can reload"
            )
        with self._reload_lock:
            index = self._load(self._index.version + 1)
            with self._cond:
                self._index = index
                self._cond.notify_all()
        log.info(
            "patterns reloaded from %s: %d patterns, %d problems, index built in %.1f ms",
            self.root,
            len(index),
            len(index.problems),
            index.build_ms,
        )
        for problem in index.problems:
            log.warning("pattern skipped: %s", problem)
        return index

    # -- reading ------------------------------------------------------------------------------
    def snapshot(self) -> PatternIndex:
        """The current index. Hold on to it for a consistent view across a reload."""
        return self._index

    def match(
        self, text: str, k: int | None = None, min_score: float | None = None
    ) -> list[tuple[Pattern, float]]:
        """The best ``k`` patterns for ``text`` with their scores (0..1), best first."""
        return self._index.match(
            text,
            self.k if k is None else k,
            self.min_score if min_score is None else _check_min_score(min_score),
        )

    @property
    def patterns(self) -> tuple[Pattern, ...]:
        return self._index.patterns

    @property
    def problems(self) -> tuple[PatternProblem, ...]:
        """Files skipped by the last load, with path, field and message."""
        return self._index.problems

    @property
    def version(self) -> int:
        """Starts at 0; each reload adds one."""
        return self._index.version

    def get(self, name: str) -> Pattern | None:
        return self._index.get(name)

    def __len__(self) -> int:
        return len(self._index)

    def __iter__(self) -> Iterator[Pattern]:
        return iter(self._index.patterns)

    def __repr__(self) -> str:
        where = f" from {self.root}" if self.root else ""
        return f"<PatternLibrary {len(self)} patterns{where} v{self.version}>"

    # -- hot reload ---------------------------------------------------------------------------
    @property
    def watching(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def watch(self) -> None:
        """Start reloading on file changes (idempotent)."""
        if self.root is None:
            raise PatternError("only a library made with from_dir() can watch a directory")
        if self.watching:
            return
        try:
            import watchfiles  # noqa: F401
        except ImportError as exc:  # pragma: no cover - depends on the environment
            from loom.errors import MissingDependencyError

            raise MissingDependencyError("watchfiles", "patterns", "Pattern hot reload") from exc
        self._stop.clear()
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._watch_loop,
            args=(ready,),
            name=f"loom-patterns-watch:{self.root}",
            daemon=True,
        )
        self._thread.start()
        ready.wait(5)

    def _watch_loop(self, ready: threading.Event) -> None:
        from watchfiles import Change, DefaultFilter, watch

        base = DefaultFilter()

        def relevant(change: Change, path: str) -> bool:
            # Pattern files, or suffix-less paths (a directory of patterns removed or renamed).
            return base(change, path) and (path.endswith(PATTERN_SUFFIXES) or not Path(path).suffix)

        assert self.root is not None
        try:
            changes = watch(
                self.root,
                watch_filter=relevant,
                stop_event=self._stop,
                raise_interrupt=False,
                rust_timeout=1000,
                yield_on_timeout=True,
                debounce=self._debounce_ms,
                step=self._step_ms,
                force_polling=self._force_polling,
            )
            ready.set()
            first = True
            for batch in changes:
                if self._stop.is_set():
                    break
                # The OS watcher starts at the first iteration, a moment after from_dir()
                # loaded the files; a write in that gap shows only in the fingerprint.
                stale = first and digests_of(self.root) != self._digests
                first = False
                if not batch and not stale:  # a rust_timeout tick
                    continue
                try:
                    self.reload()
                except Exception as exc:  # keep the last good index and keep watching
                    self.watch_error = exc
                    log.exception(
                        "pattern reload from %s failed; keeping version %d", self.root, self.version
                    )
        except Exception as exc:
            self.watch_error = exc
            log.exception("pattern watcher for %s stopped", self.root)
        finally:
            ready.set()

    def wait_for_version(self, version: int, timeout: float | None = None) -> bool:
        """Block until the index reaches ``version`` (a reload happened); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._index.version >= version, timeout)

    def close(self) -> None:
        """Stop watching (waits for the watcher thread; a rebuild in progress finishes)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)

    def __enter__(self) -> PatternLibrary:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _empty_message(root: Path, problems: Iterable[PatternProblem]) -> str:
    problems = [p for p in problems if p.kind != "empty"]
    if not problems:
        return (
            f"no pattern files (*.yaml, *.yml) in {root}; add some, or pass "
            "allow_empty=True to start empty and add them while watching"
        )
    listed = "\n".join(f"  - {p}" for p in problems[:10])
    more = f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else ""
    return f"no valid pattern in {root}: all {len(problems)} file(s) were skipped:\n{listed}{more}"

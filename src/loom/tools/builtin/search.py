"""Search tools: ``glob`` (file names) and ``grep`` (file contents), inside the workspace."""

from __future__ import annotations

import os
import re
import stat

from loom.errors import ScopeViolation, ToolError
from loom.policy.matching import compile_path_glob
from loom.policy.scope import workspace_of
from loom.tools.base import RunContext
from loom.tools.builtin._base import NameEscapes, builtin, decode_counting

__all__ = ["glob", "grep"]

MAX_GREP_FILE_BYTES = 5 * 1024 * 1024
MAX_LINE_CHARS = 300
_SNIFF = 8192


@builtin(effect="pure", subject=("path", "path"))
def glob(ctx: RunContext, pattern: str, path: str = ".", max_results: int = 500) -> str:
    """Find files in the workspace whose path matches a glob pattern.

    ``*`` matches within one directory level, ``**`` across levels, ``?`` one character:
    ``**/*.py`` finds Python files anywhere, ``docs/*.md`` Markdown files directly in docs.
    Returns one workspace-relative path per line, sorted. ``.git`` and ``.loom`` are skipped.

    Args:
        pattern: Glob pattern, relative to ``path``.
        path: Directory to search from, relative to the workspace root.
        max_results: Return at most this many paths.
    """
    if pattern.startswith("/") or ".." in pattern.split("/"):
        raise ScopeViolation(
            f"glob pattern {pattern!r} leaves the search directory; use a relative pattern "
            "without '..' and set path= to search elsewhere inside the workspace"
        )
    rx = compile_path_glob(pattern.removeprefix("./"))
    ws = workspace_of(ctx.workspace, tool="glob")
    base = ws.relative(path)
    prefix = "" if base == "." else base + "/"
    found: list[str] = []
    total = 0
    shown = NameEscapes()
    for rel, _name, _fd, st in ws.walk(path):
        if stat.S_ISDIR(st.st_mode):
            continue
        if rx.match(rel[len(prefix) :]):
            total += 1
            if len(found) < max_results:
                found.append(shown(rel))
    if not found:
        return f"no files match {pattern!r} under {shown(base)}"
    if total > len(found):
        found.append(f"[{total - len(found)} more matches not shown; narrow the pattern]")
    if (note := shown.note()) is not None:
        found.append(note)
    return "\n".join(found)


@builtin(effect="pure", subject=("path", "path"))
def grep(
    ctx: RunContext,
    pattern: str,
    path: str = ".",
    include: str | None = None,
    ignore_case: bool = False,
    max_matches: int = 200,
) -> str:
    """Search the text of workspace files for a regular expression (Python ``re`` syntax).

    Returns ``path:line: text`` for each matching line. Binary files, files over 5 MB, symbolic
    links, ``.git`` and ``.loom`` are skipped.

    Args:
        pattern: Regular expression to search for.
        path: File or directory to search, relative to the workspace root.
        include: Only search files whose path (relative to ``path``) matches this glob,
            e.g. ``**/*.py``.
        ignore_case: Match without regard to case.
        max_matches: Stop after this many matching lines.
    """
    try:
        rx = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as exc:
        raise ToolError(
            f"invalid regular expression {pattern!r}: {exc}", code="invalid_regex"
        ) from None
    only = compile_path_glob(include.removeprefix("./")) if include else None
    ws = workspace_of(ctx.workspace, tool="grep")
    with ws.resolve(path) as t:
        single = t.name is not None and t.exists and _is_file(t.dir_fd, t.name)
        base = t.rel
    out: list[str] = []
    files = matched_files = 0
    shown = NameEscapes()
    replaced = [0]  # files with matches whose bytes were not all valid UTF-8
    if single:
        with ws.open_read(path) as f:
            _grep_lines(
                f.read(MAX_GREP_FILE_BYTES + 1), shown(base), rx, out, max_matches, replaced
            )
        files = 1
    else:
        prefix = "" if base == "." else base + "/"
        for rel, name, dir_fd, st in ws.walk(path):
            if len(out) >= max_matches:
                break
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_GREP_FILE_BYTES:
                continue
            if only is not None and not only.match(rel[len(prefix) :]):
                continue
            try:
                fd = os.open(
                    name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd
                )
            except OSError:
                continue
            with os.fdopen(fd, "rb") as f:
                data = f.read(MAX_GREP_FILE_BYTES + 1)
            files += 1
            before = len(out)
            _grep_lines(data, shown(rel), rx, out, max_matches, replaced)
            matched_files += len(out) > before
    if not out:
        return f"no matches for {pattern!r} in {files} file{'s' if files != 1 else ''}"
    if len(out) >= max_matches:
        out.append(f"[stopped at max_matches={max_matches}; narrow the pattern or the path]")
    if replaced[0]:
        n = replaced[0]
        out.append(
            f"[{n} file{'s' if n > 1 else ''} with matches {'are' if n > 1 else 'is'} not valid "
            "UTF-8; undecodable bytes are shown as U+FFFD (\N{REPLACEMENT CHARACTER})]"
        )
    if (note := shown.note()) is not None:
        out.append(note)
    return "\n".join(out)


def _is_file(dir_fd: int, name: str) -> bool:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode)


def _grep_lines(
    data: bytes, rel: str, rx: re.Pattern[str], out: list[str], limit: int, replaced: list[int]
) -> None:
    if b"\x00" in data[:_SNIFF]:
        return
    text, lossy = decode_counting(data)
    before = len(out)
    try:
        _match_lines(text, rel, rx, out, limit)
    finally:
        replaced[0] += lossy and len(out) > before


def _match_lines(text: str, rel: str, rx: re.Pattern[str], out: list[str], limit: int) -> None:
    for no, line in enumerate(text.splitlines(), 1):
        if rx.search(line):
            if len(line) > MAX_LINE_CHARS:
                line = line[:MAX_LINE_CHARS] + "…"
            out.append(f"{rel}:{no}: {line}")
            if len(out) >= limit:
                return

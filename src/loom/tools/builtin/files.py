"""File tools: ``read_file``, ``write_file``, ``edit_file``, ``list_dir`` (workspace only)."""

from __future__ import annotations

import difflib
import os
import stat

from loom.errors import ToolError
from loom.policy.scope import workspace_of
from loom.tools.base import RunContext
from loom.tools.builtin._base import NameEscapes, builtin, decode_counting

__all__ = ["MAX_READ_BYTES", "edit_file", "list_dir", "read_file", "write_file"]

MAX_READ_BYTES = 256 * 1024
"""The most ``read_file`` returns in one call; ask for a line range to read further."""
MAX_WRITE_BYTES = 10 * 1024 * 1024
MAX_EDIT_BYTES = 5 * 1024 * 1024
MAX_DIFF_CHARS = 8000
_SNIFF = 8192


def _refuse_binary(data: bytes, path: str, size: int, tool: str = "read_file") -> None:
    if b"\x00" in data[:_SNIFF]:
        raise ToolError(
            f"{path!r} is a binary file ({size:,} bytes); {tool} works on text only",
            code="binary_file",
        )


@builtin(effect="pure", subject=("path", "path"))
def read_file(ctx: RunContext, path: str, start_line: int = 1, max_lines: int = 2000) -> str:
    """Read a text file from the workspace.

    Returns the file's text. When only part of the file is returned, a last line in brackets
    says which lines were shown and how to read on. Binary files are refused.

    Args:
        path: File path relative to the workspace root.
        start_line: First line to return (1-based).
        max_lines: Return at most this many lines.
    """
    if start_line < 1 or max_lines < 1:
        raise ToolError("start_line and max_lines must be at least 1", code="invalid_arguments")
    ws = workspace_of(ctx.workspace, tool="read_file")
    with ws.open_read(path) as f:
        size = os.fstat(f.fileno()).st_size
        _refuse_binary(f.read(_SNIFF), path, size)
        f.seek(0)
        lines: list[str] = []
        used = line_no = replaced = 0
        stop: str | None = None
        for raw in f:
            line_no += 1
            if line_no < start_line:
                continue
            if len(lines) >= max_lines:
                stop = f"max_lines={max_lines}"
                break
            if used + len(raw) > MAX_READ_BYTES:
                stop = f"the {MAX_READ_BYTES // 1024} KB read cap"
                if not lines:  # one huge line: show its start rather than nothing
                    text, bad = decode_counting(raw[:MAX_READ_BYTES])
                    replaced += bad
                    lines.append(text + "\n")
                break
            used += len(raw)
            text, bad = decode_counting(raw)
            replaced += bad
            lines.append(text)
    if start_line > 1 and not lines:
        raise ToolError(f"{path!r} has fewer than {start_line} lines", code="invalid_arguments")
    text = "".join(lines)
    if replaced:
        text += (
            f"\n[{replaced} line{'s' if replaced > 1 else ''} of {path} held bytes that are not "
            "valid UTF-8; they are shown as U+FFFD (\N{REPLACEMENT CHARACTER})]"
        )
    if stop is not None:
        last = start_line + len(lines) - 1
        text += (
            f"\n[showing lines {start_line}-{last} of {path} ({size:,} bytes), stopped by "
            f"{stop}; call read_file with start_line={last + 1} to read on]"
        )
    return text


@builtin(effect="idempotent", subject=("path", "path"))
def write_file(ctx: RunContext, path: str, content: str) -> str:
    """Create a file, or replace its whole content, in the workspace.

    The write is atomic: the file never appears half-written. Missing parent directories are
    created. ``.git/`` and ``.loom/`` are read-only.

    Args:
        path: File path relative to the workspace root.
        content: The complete new text of the file.
    """
    data = content.encode("utf-8")
    if len(data) > MAX_WRITE_BYTES:
        raise ToolError(
            f"content is {len(data):,} bytes; write_file accepts at most {MAX_WRITE_BYTES:,}",
            code="too_large",
        )
    ws = workspace_of(ctx.workspace, tool="write_file")
    with ws.resolve(path, write=True, create_parents=True) as t:
        existed = t.exists
    rel = ws.write_atomic(path, data)
    return f"{'replaced' if existed else 'created'} {rel} ({len(data):,} bytes)"


@builtin(effect="at_most_once", subject=("path", "path"))
def edit_file(
    ctx: RunContext, path: str, old_string: str, new_string: str, replace_all: bool = False
) -> str:
    """Replace an exact piece of text in a workspace file and return the diff.

    ``old_string`` must occur exactly once (include surrounding lines to make it unique), or
    set ``replace_all`` to replace every occurrence. Whitespace and indentation must match.

    Args:
        path: File path relative to the workspace root.
        old_string: The exact text to replace.
        new_string: The text to put in its place.
        replace_all: Replace every occurrence instead of requiring exactly one.
    """
    if old_string == "":
        raise ToolError(
            "old_string is empty; to create or overwrite a file use write_file",
            code="invalid_arguments",
        )
    if old_string == new_string:
        raise ToolError("old_string and new_string are the same", code="invalid_arguments")
    ws = workspace_of(ctx.workspace, tool="edit_file")
    ws.resolve(path, write=True).close()  # refuse read-only areas before reading
    with ws.open_read(path) as f:
        data = f.read(MAX_EDIT_BYTES + 1)
    if len(data) > MAX_EDIT_BYTES:
        raise ToolError(f"{path!r} is larger than {MAX_EDIT_BYTES:,} bytes", code="too_large")
    _refuse_binary(data, path, len(data), "edit_file")
    try:
        before = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        # Editing through a lossy decode would write U+FFFD over every such byte.
        raise ToolError(
            f"{path!r} is not valid UTF-8 text (byte {data[exc.start]:#04x} at offset "
            f"{exc.start}); edit_file would corrupt it. Use bash (e.g. sed) for this file",
            code="not_utf8",
        ) from None
    count = before.count(old_string)
    if count == 0:
        hint = ""
        if old_string.strip() and before.count(old_string.strip()) > 0:
            hint = " (it occurs with different surrounding whitespace)"
        raise ToolError(
            f"old_string was not found in {path!r}{hint}; read the file and copy the text exactly",
            code="no_match",
        )
    if count > 1 and not replace_all:
        raise ToolError(
            f"old_string occurs {count} times in {path!r}; add surrounding lines to make it "
            "unique, or set replace_all=true",
            code="not_unique",
        )
    after = (
        before.replace(old_string, new_string)
        if replace_all
        else before.replace(old_string, new_string, 1)
    )
    rel = ws.write_atomic(path, after.encode("utf-8"), create_parents=False)
    diff = "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"a/{rel}",
            tofile=f"b/{rel}",
        )
    )
    if len(diff) > MAX_DIFF_CHARS:
        diff = diff[:MAX_DIFF_CHARS] + f"\n[diff truncated at {MAX_DIFF_CHARS} characters]"
    done = f"replaced {count} occurrence{'s' if count > 1 else ''} in {rel}"
    return f"{done}\n{diff}"


@builtin(effect="pure", subject=("path", "path"))
def list_dir(ctx: RunContext, path: str = ".", max_entries: int = 500) -> str:
    """List one directory of the workspace.

    Each line is an entry: directories end with ``/``, symbolic links show ``-> target``,
    files show their size in bytes.

    Args:
        path: Directory path relative to the workspace root ("." for the root).
        max_entries: List at most this many entries.
    """
    ws = workspace_of(ctx.workspace, tool="list_dir")
    fd, rel = ws.open_dir(path)
    shown = NameEscapes()
    try:
        names = sorted(os.listdir(fd))
        lines: list[str] = []
        for name in names[:max_entries]:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                lines.append(f"{shown(name)}/")
            elif stat.S_ISLNK(st.st_mode):
                lines.append(f"{shown(name)} -> {shown(os.readlink(name, dir_fd=fd))}")
            else:
                lines.append(f"{shown(name)}  ({st.st_size:,} bytes)")
    finally:
        os.close(fd)
    if len(names) > max_entries:
        lines.append(f"[{len(names) - max_entries} more entries not shown]")
    if (note := shown.note()) is not None:
        lines.append(note)
    header = f"{shown(rel)}/ ({len(names)} entries)"
    return "\n".join([header, *lines]) if lines else f"{header}: empty"

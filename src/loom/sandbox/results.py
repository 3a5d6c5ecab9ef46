"""What a sandboxed command gives the model (issue #32 item 4).

The text is the command's stdout, then its stderr under a ``[stderr]`` line, then what the
model needs to know: the exit code when it is not 0, how many bytes the output limit dropped,
the workspace files the command created or changed. A long text is not cut here: the
executor's large-result channel (``loom.tools.channel``, ``Agent(max_result_chars=...)``)
stores it whole and shows the model a preview and a reference to page through.

Images the command produced (PNG, JPEG, GIF, WebP in the workspace) come back as media
(``loom.content.Image`` parts of the tool result, ``loom.tools.media``), up to
``MAX_IMAGES`` of them. A limit the command ran into is ``SandboxLimitReached``, a
``ToolError`` the model reads (``Code sandbox_limit: the sandbox's memory_bytes limit
(536870912) was reached ...``), with the output so far.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from loom.content import MAX_MEDIA_BYTES, Image
from loom.errors import ToolError
from loom.sandbox.base import ExecResult, LimitHit, Sandbox

__all__ = ["IMAGE_SUFFIXES", "MAX_IMAGES", "SandboxLimitReached", "exec_text", "result_for_model"]

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".gif", ".webp"})
MAX_IMAGES = 4


class SandboxLimitReached(ToolError):
    """A sandboxed command ran into a limit: ``limit`` says which and its value. The message
    (for the model) names both, what to do, and carries the output so far."""

    def __init__(self, hit: LimitHit, output: str) -> None:
        self.limit = hit
        advice = {
            "wall_seconds": "make it faster, or do less per call",
            "cpu_seconds": "make it cheaper, or do less per call",
            "memory_bytes": "use less memory (stream, process in chunks)",
            "processes": "start fewer processes or threads",
            "output_bytes": "print less (write to a file, print a summary)",
            "disk_bytes": "write less to the workspace, or delete what you no longer need",
        }[hit.limit]
        text = f"{hit.describe()} and the command was stopped: {advice}."
        if output:
            text += f"\nOutput so far:\n{output}"
        super().__init__(text, code="sandbox_limit")


def exec_text(result: ExecResult, *, trailer: bool = True) -> str:
    """The command's output and notes as the model reads them (see the module docstring)."""
    text = result.stdout
    if result.stderr:
        text += ("\n" if text and not text.endswith("\n") else "") + "[stderr]\n" + result.stderr
    if not trailer:
        return text
    notes = []
    if result.exit_code != 0 and result.limit is None:
        notes.append(f"[exit code {result.exit_code}]")
    if result.truncated_bytes:
        notes.append(
            f"[{result.truncated_bytes:,} bytes of output dropped at the output limit: "
            "print less, or write to a file and read the part you need]"
        )
    if result.files:
        shown = ", ".join(result.files[:50])
        more = f" and {len(result.files) - 50} more" if len(result.files) > 50 else ""
        notes.append(f"[files created or changed: {shown}{more}]")
    if notes:
        text += ("\n" if text and not text.endswith("\n") else "") + "\n".join(notes)
    return text


async def result_for_model(
    result: ExecResult, sandbox: Sandbox, *, text: str | None = None
) -> str | list[str | Image]:
    """``text`` (default ``exec_text(result)``) plus the images among ``result.files`` as
    ``Image`` parts; raises ``SandboxLimitReached`` when a limit stopped the command."""
    body = exec_text(result) if text is None else text
    if result.limit is not None:
        raise SandboxLimitReached(result.limit, body)
    wanted = [f for f in result.files if Path(f).suffix.lower() in IMAGE_SUFFIXES][:MAX_IMAGES]
    if not wanted:
        return body or "[no output]"
    images: list[str | Image] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(wanted):
            dest = Path(tmp) / f"{i}{Path(name).suffix.lower()}"
            try:
                await sandbox.copy_out(name, dest)
                if dest.stat().st_size > MAX_MEDIA_BYTES:
                    continue
                images.append(Image.from_bytes(dest.read_bytes(), name=name))
            except Exception:
                continue
    return [body or "[no output]", *images] if images else (body or "[no output]")

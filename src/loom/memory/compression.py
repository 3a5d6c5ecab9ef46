"""Compression (seed 002) and MEMORY_FLUSH (seed 004).

The summariser writes the 8-segment structured summary of the oldest span of the conversation.
Three attempts, waits of 1 s and 2 s between them (``MemoryConfig.retry_delays``); when every
attempt fails or returns nothing usable, the caller falls back to the sliding window. Old tool
outputs in the span are already masked when it is rendered for the summariser.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from loom.events import EventType
from loom.memory.trim import has_media, without_media
from loom.messages import Message, ToolSpec
from loom.models.base import ModelSettings, complete

__all__ = [
    "FLUSH_SYSTEM",
    "FLUSH_USER",
    "NO_REPLY",
    "SEGMENTS",
    "SUMMARY_INSTRUCTIONS",
    "append_memory_notes",
    "render_span",
    "run_flush",
    "summarise",
]

SEGMENTS = (
    "Task Overview",
    "Key Decisions",
    "Progress",
    "Blockers",
    "Open Items",
    "Context",
    "Next Steps",
    "Metadata",
)

SUMMARY_INSTRUCTIONS = (
    "You compress the history of a conversation between a user and an AI agent so the agent "
    "can continue without it. Write a structured summary with these eight Markdown sections, in "
    "this order: " + ", ".join(f"## {s}" for s in SEGMENTS) + ". Keep names, numbers, file "
    "paths, identifiers and result references exactly as written. Write 'None' for an empty "
    "section. Be brief: at most {words} words."
)

FLUSH_SYSTEM = "Session nearing compaction. Store durable memories now."
FLUSH_USER = (
    "Write any lasting notes to MEMORY.md with the memory_write tool (one call per "
    "note); reply with NO_REPLY if nothing to store."
)
NO_REPLY = "NO_REPLY"

Note = tuple[EventType, dict[str, Any]]
_HEADING = re.compile(r"^#+\s*(.+?)\s*:?\s*$", re.MULTILINE)


def render_span(messages: Sequence[Message], limit_chars: int | None = None) -> str:
    """The span as plain text for the summariser: one block per message."""
    lines = []
    for m in messages:
        if has_media(m):  # the summariser reads what the media were, never their bytes
            m = without_media(m)
        if m.role == "assistant" and m.tool_calls:
            calls = "; ".join(
                f"{c.name}({json.dumps(c.arguments, ensure_ascii=False)})" for c in m.tool_calls
            )
            text = f"{m.content}\n(called {calls})" if m.content else f"(called {calls})"
            lines.append(f"[assistant] {text}")
        elif m.role == "tool":
            lines.append(f"[tool {m.name or ''} result] {m.content}")
        else:
            lines.append(f"[{m.role}] {m.content}")
    text = "\n".join(lines)
    if limit_chars is not None and len(text) > limit_chars:
        text = text[: max(limit_chars, 0)] + "\n[… span cut to fit the summariser's window]"
    return text


def _usable(text: str) -> bool:
    stripped = text.strip()
    return len(stripped) >= 8 and stripped.upper() != NO_REPLY


def _with_metadata(text: str, metadata: str) -> str:
    """Replace the model's Metadata section (if any) with the facts we know."""
    body = text.strip()
    for match in _HEADING.finditer(body):
        if match.group(1).strip().lower() == "metadata":
            body = body[: match.start()].rstrip()
            break
    return f"{body}\n\n## Metadata\n{metadata}"


async def summarise(
    model: Any,
    span_text: str,
    *,
    previous: str | None,
    words: int,
    attempts: int,
    delays: Sequence[float],
    sleep: Callable[[float], Any],
    notes: list[Note],
    metadata: str,
) -> tuple[str | None, int, str]:
    """Ask ``model`` for the 8-segment summary. Returns (summary or None, attempts, last error).

    Emits COMPRESSION_PROGRESS for each attempt and each retry.
    """
    user = f"Conversation to summarise:\n{span_text}"
    if previous:
        user = (
            f"Summary of what came before (for continuity, do not repeat it):\n{previous}\n\n{user}"
        )
    messages = [Message.system(SUMMARY_INSTRUCTIONS.format(words=words)), Message.user(user)]
    settings = ModelSettings(temperature=0.0, max_tokens=max(64, int(words * 2)))
    error = ""
    for attempt in range(1, attempts + 1):
        notes.append((EventType.COMPRESSION_PROGRESS, {"status": "attempt", "attempt": attempt}))
        try:
            response = await complete(model, messages, (), settings)
            if _usable(response.text):
                return _with_metadata(response.text, metadata), attempt, ""
            error = "the summariser returned nothing usable"
        except Exception as exc:  # a failing summariser must never fail the turn
            error = f"{type(exc).__name__}: {exc}"
        if attempt < attempts:
            delay = delays[min(attempt - 1, len(delays) - 1)] if delays else 0.0
            notes.append(
                (
                    EventType.COMPRESSION_PROGRESS,
                    {"status": "retry", "attempt": attempt, "error": error, "delay": delay},
                )
            )
            if delay > 0:
                await sleep(delay)
    return None, attempts, error


def append_memory_notes(path: Path, notes: Sequence[str]) -> None:
    """Append notes to MEMORY.md as bullet lines (creating it and its folder if needed)."""
    clean = [" ".join(n.split()) for n in notes if n and n.strip()]
    if not clean:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", encoding="utf-8") as f:
        if new:
            f.write("# MEMORY\n\n")
        f.writelines(f"- {n}\n" for n in clean)


async def run_flush(
    model: Any, context: list[Message], path: Path, tool: ToolSpec
) -> dict[str, Any]:
    """Seed 004's MEMORY_FLUSH: ask the agent for lasting notes; write them; suppress NO_REPLY.

    Returns the MEMORY_FLUSH event data. Failures are reported, never raised.
    """
    messages = [*context, Message.system(FLUSH_SYSTEM), Message.user(FLUSH_USER)]
    try:
        response = await complete(model, messages, [tool])
    except Exception as exc:
        return {
            "status": "failed",
            "error": f"{type(exc).__name__}: {exc}",
            "notes": 0,
            "path": str(path),
        }
    notes = [
        str(c.arguments.get("note", ""))
        for c in response.tool_calls
        if c.name == tool.name and c.arguments.get("note")
    ]
    if notes:
        try:
            append_memory_notes(path, notes)
        except OSError as exc:
            return {
                "status": "failed",
                "error": f"cannot write {path}: {exc}",
                "notes": 0,
                "path": str(path),
            }
        return {"status": "written", "notes": len(notes), "path": str(path)}
    status = "no_reply" if response.text.strip().upper().startswith(NO_REPLY) else "ignored"
    return {"status": status, "notes": 0, "path": str(path), "suppressed": True}

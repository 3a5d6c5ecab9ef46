"""JSONL transcripts (seed 004): export a session's messages, read them back.

One message per line: ``{"role": ..., "content": ..., "timestamp": ...}`` plus ``tool_calls``,
``tool_call_id``, ``name`` and ``metadata`` when present. The store is the source of truth; a
transcript is an export. The reader tolerates a last line cut short by a crash (it is dropped
and reported through ``Transcript.truncated``); any other bad line raises ``TranscriptError``
with its line number.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from loom.errors import TranscriptError
from loom.messages import Message

__all__ = ["Transcript", "message_line", "read_jsonl", "write_jsonl"]


def message_line(message: Message) -> str:
    """One message as one JSON line (without the newline)."""
    data: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        data["tool_calls"] = [
            c.model_dump(mode="json", exclude_none=True) for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        data["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        data["name"] = message.name
    if message.metadata:
        data["metadata"] = message.metadata
    data["timestamp"] = message.timestamp.isoformat()
    return json.dumps(data, ensure_ascii=False, default=str)


def write_jsonl(
    messages: Iterable[Message], out: IO[str], *, redact: Callable[[Any], Any] | None = None
) -> int:
    """Write ``messages`` as JSONL to ``out``; return how many lines were written.

    ``redact`` (such as ``loom.guardrails.Redactor().redact_value``) is applied to every
    string of each message (content, tool-call arguments, metadata) before it is written."""
    n = 0
    for m in messages:
        if redact is not None:
            m = m.model_copy(
                update={
                    "content": redact(m.content),
                    "tool_calls": [
                        c.model_copy(
                            update={
                                "arguments": redact(c.arguments),
                                "raw_arguments": redact(c.raw_arguments),
                            }
                        )
                        for c in m.tool_calls
                    ],
                    "metadata": redact(m.metadata),
                }
            )
        out.write(message_line(m) + "\n")
        n += 1
    return n


@dataclass(slots=True)
class Transcript:
    """What ``read_jsonl`` found: the messages, and whether a cut-off last line was dropped."""

    messages: list[Message] = field(default_factory=list)
    truncated: bool = False


def read_jsonl(path: str | Path) -> Transcript:
    """Read a JSONL transcript.

    Raises:
        TranscriptError: a line other than an unterminated last line is not a JSON message
            (``.line`` is its 1-based number), or the file cannot be read.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TranscriptError(f"cannot read transcript {path}: {exc}", path=str(path)) from exc
    lines = text.split("\n")
    complete = text.endswith("\n")
    out = Transcript()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        last_unterminated = number == len(lines) and not complete
        try:
            out.messages.append(Message.model_validate(json.loads(line)))
        except (json.JSONDecodeError, ValidationError) as exc:
            if last_unterminated and isinstance(exc, json.JSONDecodeError):
                out.truncated = True  # a writer died mid-line: everything before it is good
                break
            problem = (
                exc.msg
                if isinstance(exc, json.JSONDecodeError)
                else (
                    "; ".join(
                        f"{'.'.join(map(str, e['loc'])) or '(line)'}: {e['msg']}"
                        for e in exc.errors()
                    )
                )
            )
            raise TranscriptError(
                f"{path}:{number}: not a transcript message ({problem}); fix or delete that line",
                path=str(path),
                line=number,
            ) from None
    return out

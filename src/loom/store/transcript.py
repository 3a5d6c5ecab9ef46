"""JSONL transcripts (seed 004): export a session's messages, read them back.

One message per line: ``{"role": ..., "content": ..., "timestamp": ...}`` plus ``tool_calls``,
``tool_call_id``, ``name``, ``metadata`` and ``parts`` (images, files, audio as references,
reasoning) when present. The store is the source of truth; a
transcript is an export. The reader tolerates a last line cut short by a crash (it is dropped
and reported through ``Transcript.truncated``); any other bad line raises ``TranscriptError``
with its line number.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from loom.content import Reasoning, jsonable
from loom.errors import TranscriptError
from loom.events import AgentEvent, EventType
from loom.messages import Message
from loom.store.base import Store, capabilities_of

__all__ = [
    "Transcript",
    "TranscriptWindow",
    "message_line",
    "newest_exchange",
    "read_jsonl",
    "since_last_request",
    "write_jsonl",
]


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
    if message.parts:  # references, never bytes (``loom sessions export`` writes the files)
        data["parts"] = jsonable(message.parts)
    data["timestamp"] = message.timestamp.isoformat()
    return json.dumps(data, ensure_ascii=False, default=str)


def write_jsonl(
    messages: Iterable[Message], out: IO[str], *, redact: Callable[[Any], Any] | None = None
) -> int:
    """Write ``messages`` as JSONL to ``out``; return how many lines were written.

    ``redact`` (such as ``loom.guardrails.Redactor().redact_value``) is applied to every
    string of each message (content, tool-call arguments, metadata, reasoning) before it is
    written; media are references, their bytes are not part of the line."""
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
                    "parts": [  # a model's reasoning is text like any other
                        p.model_copy(update={"text": redact(p.text)})
                        if isinstance(p, Reasoning)
                        else p
                        for p in m.parts
                    ],
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


class TranscriptWindow(list[Message]):
    """The newest part of a session's transcript, as read at resume (``loom.memory.window``).

    A list of the messages from transcript position ``offset`` on (appending to it appends to
    the transcript, as with a whole one), plus ``prelude``: the memory entries (Loom's
    bookkeeping system messages: summaries, Kernel keys, flush markers) at positions before
    ``offset``, with their positions. The context builder folds ``prelude`` and the window
    into the same memory tiers the whole transcript gives (``SessionIndex.update``). A whole
    transcript is a window with ``offset`` 0 and no prelude.
    """

    __slots__ = ("offset", "prelude")

    def __init__(
        self,
        messages: Iterable[Message] = (),
        *,
        offset: int = 0,
        prelude: list[tuple[int, Message]] | None = None,
    ) -> None:
        super().__init__(messages)
        self.offset = offset
        self.prelude: list[tuple[int, Message]] = prelude or []

    @property
    def end(self) -> int:
        """The transcript position after the last message held (the transcript's length)."""
        return self.offset + len(self)


async def since_last_request(
    store: Store, session_id: str, types: Sequence[EventType]
) -> list[AgentEvent]:
    """The session's events of ``types`` since its last ``USER_MESSAGE`` event, in journal
    order: what the newest exchange says about them (the calls parked for approval, a query
    waiting for an answer). Read back from the journal's end when the store can
    (``LatestEventStore``), so the cost follows the exchange, not the session."""
    wanted = {EventType(t) for t in types}
    latest = capabilities_of(store).latest_events
    if latest is None:
        events = await store.load_events(session_id)
    else:
        limit, ask = 4, [*wanted, EventType.USER_MESSAGE]
        while True:
            events = await latest.load_latest_events(session_id, ask, limit)
            if len(events) < limit or any(e.type is EventType.USER_MESSAGE for e in events):
                break
            limit *= 4
    after = len(events)
    while after > 0 and events[after - 1].type is not EventType.USER_MESSAGE:
        after -= 1
    return [e for e in events[after:] if e.type in wanted]


async def newest_exchange(store: Store, session_id: str) -> list[Message]:
    """The transcript's newest part back to (and with) its last user message that is not a
    judge's correction, or all of it when there is none: where unanswered tool calls can be.
    Read back from the end in pages when the store can (``TranscriptWindowStore``)."""
    windows = capabilities_of(store).windows
    if windows is None:
        return await store.load_messages(session_id)
    end = await store.message_count(session_id)
    start, page = end, 16
    out: list[Message] = []
    while start > 0:
        older = max(0, start - page)
        out[:0] = await windows.load_message_range(session_id, older, start)
        start, page = older, page * 4
        if any(m.role == "user" and not m.metadata.get("judge_correction") for m in out):
            break
    return out

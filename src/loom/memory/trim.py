"""Cutting text and messages to a token allowance, masking old tool outputs, and standing
placeholders in for old media (a part is never cut: it is sent whole or replaced)."""

from __future__ import annotations

import re

from loom.content import Audio, File, Image, Media, describe
from loom.memory.tokens import MessageCounter
from loom.messages import Message

__all__ = [
    "MEDIA_DESCRIPTIONS",
    "has_media",
    "mask_placeholder",
    "media_placeholder",
    "shrink_message",
    "truncate_text",
    "without_media",
]

MEDIA_DESCRIPTIONS = "media_descriptions"
"""A message's metadata key for descriptions of its media (``{ref: text}``), written by
whoever produced one (a captioning hook, a tool); a placeholder quotes it."""

_REF = re.compile(r"get_tool_result\([^)]*\)|\b(?:ref|res|result|err)_[A-Za-z0-9]{6,}\w*")


def truncate_text(mc: MessageCounter, text: str, max_raw: int) -> str | None:
    """``text`` cut (with a marker) to at most ``max_raw`` tokens; None if nothing fits."""
    n = mc.text(text)
    if n <= max_raw:
        return text
    marker = f"\n[… truncated to fit the context window; {n} tokens in full]"
    m = mc.text(marker)
    if m > max_raw:
        short = "[…]"
        return short if mc.text(short) <= max_raw else None
    cut = int(len(text) * (max_raw - m) / n)
    while cut > 0:
        candidate = text[:cut] + marker
        if mc.text(candidate) <= max_raw:
            return candidate
        cut = int(cut * 0.9) - 1
    return marker


def mask_placeholder(msg: Message, tokens: int) -> str:
    """One line standing in for an old tool output; keeps any result reference."""
    refs = msg.metadata.get("result_ref") or msg.metadata.get("ref")
    found = [str(refs)] if refs else _REF.findall(msg.content)[:2]
    first = msg.content.strip().splitlines()[0][:80] if msg.content.strip() else ""
    ref = f"; ref {', '.join(found)}" if found else ""
    return f"[older {msg.name or 'tool'} output masked ({tokens} tokens){ref}; began: {first}]"


def shrink_message(mc: MessageCounter, msg: Message, room: int) -> Message:
    """``msg`` with its content (and, if needed, tool-call arguments) cut to ``room`` tokens;
    its parts are never cut (they count in the room, whole)."""
    if msg.tool_calls and mc.message(msg.model_copy(update={"content": ""})) > room // 2:
        calls = [
            c.model_copy(update={"arguments": {"truncated_arguments": "…"}, "raw_arguments": None})
            for c in msg.tool_calls
        ]
        msg = msg.model_copy(update={"tool_calls": calls})
    base = mc.message(msg.model_copy(update={"content": ""}))
    text = truncate_text(mc, msg.content, room - base) if room - base > 0 else None
    return msg.model_copy(update={"content": text or ""})


def has_media(msg: Message) -> bool:
    """True when ``msg`` holds an image, a file or audio."""
    return any(isinstance(p, Media) for p in msg.parts)


def media_placeholder(msg: Message, part: Image | File | Audio) -> str:
    """The line standing in for ``part`` when the context leaves it out: ``describe(part)``,
    and the description of it the message's metadata holds, if one was produced."""
    described = msg.metadata.get(MEDIA_DESCRIPTIONS)
    text = described.get(part.ref or part.url or "") if isinstance(described, dict) else None
    line = describe(part)
    return f"{line[:-1]}; described as: {text}]" if text else line


def without_media(msg: Message, content: str | None = None) -> Message:
    """``msg`` with its media replaced by placeholder lines after its text (``content``, when
    given, instead of its own); its reasoning stays."""
    media = [p for p in msg.parts if isinstance(p, Image | File | Audio)]
    lines = [media_placeholder(msg, p) for p in media]
    text = msg.content if content is None else content
    joined = "\n".join(([text] if text else []) + lines)
    kept = [p for p in msg.parts if not isinstance(p, Media)]
    return msg.model_copy(update={"content": joined, "parts": kept})

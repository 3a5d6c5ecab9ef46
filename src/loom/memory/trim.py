"""Cutting text and messages to a token allowance, and masking old tool outputs."""

from __future__ import annotations

import re

from loom.memory.tokens import MessageCounter
from loom.messages import Message

__all__ = ["mask_placeholder", "shrink_message", "truncate_text"]

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
    """``msg`` with its content (and, if needed, tool-call arguments) cut to ``room`` tokens."""
    if msg.tool_calls and mc.message(msg.model_copy(update={"content": ""})) > room // 2:
        calls = [
            c.model_copy(update={"arguments": {"truncated_arguments": "…"}, "raw_arguments": None})
            for c in msg.tool_calls
        ]
        msg = msg.model_copy(update={"tool_calls": calls})
    base = mc.message(msg.model_copy(update={"content": ""}))
    text = truncate_text(mc, msg.content, room - base) if room - base > 0 else None
    return msg.model_copy(update={"content": text or ""})

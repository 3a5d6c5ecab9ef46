"""What resuming a session reads: the memory tiers and the recent tail, not the whole history.

The segmented context builder (``loom.memory.builder``) sends ROM, MEMORY.md, the Kernel, the
L2 summaries and the conversation L2 does not cover yet (plus the latest user message, always
pinned). Everything older than the newest summary's ``covers_through`` only ever reaches the
model through that summary. So a runtime that has not seen a session reads:

1. its memory entries (system messages with ``metadata["loom"]``: summaries, Kernel keys,
   flush markers) through the store's index on them
   (``TranscriptWindowStore.load_system_messages``), from which the position where the
   uncovered conversation starts follows;
2. the messages from there to the end, read back from the end in pages, widened until the
   window holds the latest user message and starts at the beginning of a unit (never at a tool
   result, whose call would then look missing).

The builder folds the entries before the window (``TranscriptWindow.prelude``) and the window
itself into the same tiers the whole transcript gives (``SessionIndex.update``), so the context
a model sees is the same. A session with no summary yet is read whole: all of it is context.
"""

from __future__ import annotations

from collections.abc import Sequence

from loom.memory.segments import is_bookkeeping
from loom.messages import Message
from loom.store.base import TranscriptWindowStore
from loom.store.transcript import TranscriptWindow

__all__ = ["FIRST_PAGE", "covered_through", "load_window", "transcript_position"]

FIRST_PAGE = 64
"""Messages read from the end first; each further page back is twice the last."""


def covered_through(entries: Sequence[tuple[int, Message]]) -> int:
    """The conversation index the session's summaries cover through (-1: none), folded as
    ``SessionIndex`` folds them."""
    covered = -1
    for _, msg in entries:
        if msg.metadata.get("loom") == "summary":
            covered = max(covered, int(msg.metadata["covers_through"]))
    return covered


def transcript_position(conv_index: int, entry_positions: Sequence[int]) -> int:
    """The transcript position of conversation message ``conv_index`` (the transcript without
    its bookkeeping entries, which sit at the sorted ``entry_positions``)."""
    pos = conv_index
    for p in entry_positions:
        if p > pos:
            break
        pos += 1
    return pos


def _opens_window(messages: Sequence[Message]) -> bool:
    """True when the window can start here: it holds a user request (the message the builder
    pins and approvals look back to) and does not begin with a tool result."""
    if not messages or messages[0].role == "tool":
        return False
    return any(
        m.role == "user"
        and not (m.metadata.get("judge_correction") or m.metadata.get("output_correction"))
        for m in messages
    )


async def load_window(
    store: TranscriptWindowStore, session_id: str, count: int
) -> TranscriptWindow:
    """The part of session ``session_id``'s transcript (``count`` messages long) that its
    context needs, as a ``TranscriptWindow`` (see the module docstring)."""
    entries = [(p, m) for p, m in await store.load_system_messages(session_id) if is_bookkeeping(m)]
    covered = covered_through(entries)
    if covered < 0:  # nothing summarised: the whole transcript is the context's to budget
        return TranscriptWindow(await store.load_message_range(session_id, 0, count))
    first_pending = transcript_position(covered + 1, [p for p, _ in entries])
    start = max(0, min(first_pending, count - FIRST_PAGE))
    messages = await store.load_message_range(session_id, start, count)
    page = FIRST_PAGE
    while start > 0 and not _opens_window(messages):
        older_start = max(0, start - page)
        messages[:0] = await store.load_message_range(session_id, older_start, start)
        start, page = older_start, page * 2
    prelude = [(p, m) for p, m in entries if p < start]
    return TranscriptWindow(messages, offset=start, prelude=prelude)

"""The session's memory tiers, read from the persisted transcript.

The transcript is the only source of truth (DESIGN principle 1). Besides the conversation it
holds Loom's bookkeeping entries, system messages whose ``metadata["loom"]`` says what they are:

- ``"summary"``: an L2 summary covering conversation messages ``covers_from`` …
  ``covers_through`` (indices in the conversation, i.e. the transcript without bookkeeping
  entries). A summary with ``covers_from`` ≤ an older one's start supersedes it (a merge).
- ``"kernel"``: ``key`` set to ``value`` (``None`` removes the key). The ``remember`` tool's
  results set keys the same way.
- ``"memory_flush"``: the MEMORY_FLUSH for compaction cycle ``cycle`` happened.

``SessionIndex`` folds the transcript incrementally: the transcript is append-only, so each build
reads only the messages added since the last one (checked with a fingerprint of the last message
seen; on a mismatch the index is rebuilt). Token counts are taken once per message.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loom.content import Media
from loom.memory.tokens import MessageCounter
from loom.messages import Message
from loom.store.transcript import TranscriptWindow

__all__ = ["KERNEL_TOOL", "SessionIndex", "Summary", "is_bookkeeping"]

KERNEL_TOOL = "remember"


def is_bookkeeping(msg: Message) -> bool:
    return msg.role == "system" and "loom" in msg.metadata


@dataclass(slots=True)
class Summary:
    """One L2 entry."""

    covers_from: int
    covers_through: int
    text: str
    method: str = "summary"
    raw_tokens: int = 0


_NOT_READ = Message.system("[not read: covered by a summary]")


def _fingerprint(msg: Message) -> tuple[Any, ...]:
    return (msg.role, msg.timestamp, len(msg.content), msg.tool_call_id)


@dataclass
class SessionIndex:
    """Everything the builder needs from one session's transcript, kept up to date cheaply."""

    counter: MessageCounter
    seen: int = 0
    fingerprint: tuple[Any, ...] | None = None
    conv: list[Message] = field(default_factory=list)
    prefix: list[int] = field(default_factory=lambda: [0])  # raw token prefix sums over conv
    unit_starts: list[int] = field(default_factory=list)  # conv positions where units begin
    tool_positions: list[int] = field(default_factory=list)
    media_positions: list[int] = field(default_factory=list)  # messages with images, files, audio
    user_positions: list[int] = field(default_factory=list)
    orphans: set[int] = field(default_factory=set)  # tool results with no call before them
    summaries: list[Summary] = field(default_factory=list)
    covered: int = -1  # conversation index through which L2 covers
    kernel: dict[str, str] = field(default_factory=dict)
    kernel_version: int = 0
    l2_version: int = 0
    flushed_cycles: set[int] = field(default_factory=set)
    _open_calls: set[str] = field(default_factory=set)
    derived: dict[Any, Any] = field(default_factory=dict)  # per-position caches (masks)

    # -- folding ---------------------------------------------------------------------------------
    def update(self, history: Sequence[Message]) -> None:
        """Fold in the messages appended since the last call (or rebuild if history changed).

        ``history`` is the whole transcript, or a ``TranscriptWindow`` (its newest part, from
        position ``offset`` on, with the memory entries before it): positions stay those of the
        whole transcript either way."""
        offset = history.offset if isinstance(history, TranscriptWindow) else 0
        n = offset + len(history)
        if self.seen > offset and (
            n < self.seen or _fingerprint(history[self.seen - 1 - offset]) != self.fingerprint
        ):
            self.reset()
        if self.seen < offset:  # the index ends before the window starts: seed it from there
            assert isinstance(history, TranscriptWindow)
            self.reset()
            self._seed(history.prelude, offset)
        if n == self.seen:
            return
        for i in range(self.seen, n):
            self._add(history[i - offset])
        self.seen = n
        self.fingerprint = _fingerprint(history[n - 1 - offset])

    def _seed(self, prelude: Sequence[tuple[int, Message]], offset: int) -> None:
        """Start at transcript position ``offset`` from the memory entries before it: the
        tiers they set, and conversation positions counted as the whole transcript counts
        them. The conversation before ``offset`` is covered by L2, so the builder never reads
        it: it holds a placeholder with no tokens."""
        for _, msg in prelude:
            self._bookkeeping(msg)
        skipped = offset - len(prelude)
        self.conv = [_NOT_READ] * skipped
        self.prefix = [0] * (skipped + 1)
        self.seen = offset

    def reset(self) -> None:
        fresh = SessionIndex(self.counter)
        fresh.kernel_version = self.kernel_version + 1
        fresh.l2_version = self.l2_version + 1
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(fresh, name))

    def _add(self, msg: Message) -> None:
        if is_bookkeeping(msg):
            self._bookkeeping(msg)
            return
        pos = len(self.conv)
        self.conv.append(msg)
        raw = self.counter.message(msg)
        has_media = bool(msg.parts) and any(isinstance(p, Media) for p in msg.parts)
        if msg.role == "tool":
            if msg.tool_call_id in self._open_calls:
                self._open_calls.discard(msg.tool_call_id)
                self.tool_positions.append(pos)
                if msg.name == KERNEL_TOOL:
                    self._kernel_from_result(msg)
            else:
                self.orphans.add(pos)  # a provider would reject it; it is never sent
                raw = 0
                has_media = False
        else:
            self.unit_starts.append(pos)
            self._open_calls = {c.id for c in msg.tool_calls}
            # the pinned "latest user message" is the user's request, not a judge's or the
            # output check's correction (a user-role message too): pinning the correction let
            # a summary swallow the request itself
            meta = msg.metadata
            if msg.role == "user" and not (
                meta.get("judge_correction") or meta.get("output_correction")
            ):
                self.user_positions.append(pos)
        if has_media:
            self.media_positions.append(pos)
        self.prefix.append(self.prefix[-1] + raw)

    def _bookkeeping(self, msg: Message) -> None:
        meta = msg.metadata
        kind = meta.get("loom")
        if kind == "summary":
            start, end = int(meta.get("covers_from", 0)), int(meta["covers_through"])
            self.add_summary(Summary(start, end, msg.content, str(meta.get("method", "summary"))))
        elif kind == "kernel":
            self.set_kernel(str(meta.get("key", "")), meta.get("value"))
        elif kind == "memory_flush":
            self.flushed_cycles.add(int(meta.get("cycle", -1)))

    def add_summary(self, summary: Summary) -> None:
        summary.raw_tokens = self.counter.text(summary.text)
        self.summaries = [s for s in self.summaries if s.covers_from < summary.covers_from]
        self.summaries.append(summary)
        self.covered = max(self.covered, summary.covers_through)
        self.l2_version += 1

    def set_kernel(self, key: str, value: Any) -> None:
        if not key:
            return
        self.kernel.pop(key, None)  # a re-set key moves to the end (newest)
        if value is not None:
            self.kernel[key] = str(value)
        self.kernel_version += 1

    def _kernel_from_result(self, msg: Message) -> None:
        if not msg.content.startswith('{"kernel"'):
            return
        try:
            entry = json.loads(msg.content)["kernel"]
            self.set_kernel(str(entry["key"]), entry.get("value"))
        except (ValueError, KeyError, TypeError):
            return

    # -- queries ---------------------------------------------------------------------------------
    @property
    def cycle(self) -> int:
        """The compaction cycle: the conversation index the newest summary covers through."""
        return self.covered

    def units(self, first: int = 0) -> list[tuple[int, int]]:
        """Conversation ranges ``[start, end)`` of units from unit ``first`` on.

        A unit is a user message, an assistant message, or an assistant message with tool calls
        together with its tool results; eviction and masking never split one.
        """
        starts = self.unit_starts
        out = []
        for k in range(first, len(starts)):
            end = starts[k + 1] if k + 1 < len(starts) else len(self.conv)
            out.append((starts[k], end))
        return out

    def first_pending_unit(self) -> int:
        """Index (into ``unit_starts``) of the first unit L2 does not cover."""
        return bisect_right(self.unit_starts, self.covered)

    def raw(self, start: int, end: int) -> int:
        """Raw tokens of conversation messages ``[start, end)``."""
        return self.prefix[end] - self.prefix[start]

    def message_raw(self, pos: int) -> int:
        return self.prefix[pos + 1] - self.prefix[pos]

"""The segmented builder's side of prompt caching (``loom.models.cache``): where the tiers of
an assembled context end, which of its compaction steps changed which tier, and the
``CACHE_BUST`` note when the previous request's prefix broke."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loom.events import EventType
from loom.memory.assembly import Measure, Plan
from loom.messages import Message
from loom.models.cache import CacheCheck, PrefixTracker, Segments, tools_digest

__all__ = ["check_prefix"]

E = EventType
_TIER_OF = {
    "memory_file": "kernel",  # MEMORY.md sits before the Kernel, in its cached segment
    "kernel": "kernel",
    "summaries": "summaries",
    "history": "history",
    "current_turn": "history",
    "current_turn_media": "history",
}


def segments_of(
    plan: Plan, messages: Sequence[Message], decisions: Sequence[tuple[EventType, dict[str, Any]]]
) -> Segments:
    """The tier ends of ``messages`` as ``Plan.assemble`` laid them out: the ROM first, then
    MEMORY.md, the Kernel and the summaries, each when placed (not excluded)."""
    placed = {
        d["component"]
        for t, d in decisions
        if t is not E.CONTEXT_COMPONENT_EXCLUDED
        and d.get("component") in ("memory_file", "kernel", "summaries")
    }
    i = 0
    rom = kernel = summaries = None
    if plan.rom is not None and messages:
        rom, i = 0, 1
    for name in ("memory_file", "kernel"):
        if name in placed:
            kernel, i = i, i + 1
    if "summaries" in placed:
        summaries, i = i, i + 1
    return Segments(rom, kernel, summaries, min(i, len(messages)))


def reasons_of(
    measure: Measure,
    notes: Sequence[tuple[EventType, dict[str, Any]]],
    decisions: Sequence[tuple[EventType, dict[str, Any]]],
) -> dict[str, str]:
    """Per tier, the step of this build that may have changed what the previous request
    sent there."""
    reasons: dict[str, str] = {}
    for kind, data in decisions:
        tier = _TIER_OF.get(str(data.get("component")))
        if kind is not E.CONTEXT_COMPONENT_INCLUDED and tier is not None:
            reasons.setdefault(tier, "truncation")
        elif data.get("component") == "recall":  # this turn's memories, chosen by its message
            reasons.setdefault("kernel", "recall")
    if measure.masked or measure.stripped:
        reasons.setdefault("history", "masking")
    for kind, data in notes:
        if kind is E.COMPRESSION_COMPLETE:
            reasons["summaries"] = reasons["history"] = "compaction"
        elif kind is E.MEMORY_FLUSH and data.get("status") == "written":
            reasons["kernel"] = "memory_flush"
    return reasons


def check_prefix(
    tracker: PrefixTracker,
    key: object,
    *,
    plan: Plan,
    model: Any,
    tools: Any,
    messages: Sequence[Message],
    measure: Measure,
    notes: list[tuple[EventType, dict[str, Any]]],
    decisions: Sequence[tuple[EventType, dict[str, Any]]],
) -> CacheCheck:
    """Observe one assembled context in ``tracker``; a break of the previous prefix adds a
    ``CACHE_BUST`` note (``expected`` when a step of this build explains it)."""
    check = tracker.observe(
        key,
        model=str(getattr(model, "name", "") or type(model).__name__),
        tools=tools_digest(tools),
        messages=messages,
        segments=segments_of(plan, messages, decisions),
        reasons=reasons_of(measure, notes, decisions),
    )
    if check.broke:
        notes.append(
            (
                E.CACHE_BUST,
                {
                    "segment": check.segment,
                    "reason": check.reason,
                    "expected": not check.bust,
                    "position": check.broke_at,
                    "shared_messages": check.shared,
                    "previous_messages": check.previous,
                },
            )
        )
    return check

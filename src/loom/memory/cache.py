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

__all__ = ["check_prefix", "prefix_points"]

E = EventType
_TIER_OF = {
    "memory_file": "kernel",  # MEMORY.md sits before the Kernel, in its cached segment
    "kernel": "kernel",
    "summaries": "summaries",
    "history": "history",
    "current_turn": "history",
    "current_turn_media": "history",
}


# read once: an enum member looked up on its class costs a few hundred instructions, and these
# run on every build
_EXCLUDED = E.CONTEXT_COMPONENT_EXCLUDED
_INCLUDED = E.CONTEXT_COMPONENT_INCLUDED
_COMPRESSED = E.COMPRESSION_COMPLETE
_FLUSHED = E.MEMORY_FLUSH


_SEGMENTS: dict[tuple[int | None, int | None, int | None, int], Segments] = {}


def segments_of(
    plan: Plan, messages: Sequence[Message], decisions: Sequence[tuple[EventType, dict[str, Any]]]
) -> Segments:
    """The tier ends of ``messages`` as ``Plan.assemble`` laid them out: the ROM first, then
    MEMORY.md, the Kernel and the summaries, each when placed (not excluded)."""
    memory_file = kernel_placed = summaries_placed = False
    for t, d in decisions:
        if t is not _EXCLUDED:
            component = d.get("component")
            if component == "kernel":
                kernel_placed = True
            elif component == "memory_file":
                memory_file = True
            elif component == "summaries":
                summaries_placed = True
    i = 0
    rom = kernel = summaries = None
    if plan.rom is not None and messages:
        rom, i = 0, 1
    if memory_file:
        kernel, i = i, i + 1
    if kernel_placed:
        kernel, i = i, i + 1
    if summaries_placed:
        summaries, i = i, i + 1
    ends = (rom, kernel, summaries, min(i, len(messages)))
    hit = _SEGMENTS.get(ends)
    if hit is None:  # a handful of layouts: each built once (a frozen dataclass is slow to make)
        hit = _SEGMENTS[ends] = Segments(*ends)
    return hit


def reasons_of(
    measure: Measure,
    notes: Sequence[tuple[EventType, dict[str, Any]]],
    decisions: Sequence[tuple[EventType, dict[str, Any]]],
) -> dict[str, str]:
    """Per tier, the step of this build that may have changed what the previous request
    sent there."""
    reasons: dict[str, str] = {}
    for kind, data in decisions:
        component = data.get("component")
        if kind is not _INCLUDED:  # (most decisions include their component whole)
            tier = _TIER_OF.get(str(component))
            if tier is not None:
                reasons.setdefault(tier, "truncation")
                continue
        if component == "recall":  # this turn's memories, chosen by its message
            reasons.setdefault("kernel", "recall")
    if measure.masked or measure.stripped:
        reasons.setdefault("history", "masking")
    for kind, data in notes:
        if kind is _COMPRESSED:
            reasons["summaries"] = reasons["history"] = "compaction"
        elif kind is _FLUSHED and data.get("status") == "written":
            reasons["kernel"] = "memory_flush"
    return reasons


def _model_name(model: Any) -> str:
    return str(getattr(model, "name", "") or type(model).__name__)


def _note_break(check: CacheCheck, notes: list[tuple[EventType, dict[str, Any]]]) -> None:
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
        model=_model_name(model),
        tools=tools_digest(tools),
        messages=messages,
        segments=segments_of(plan, messages, decisions),
        reasons=reasons_of(measure, notes, decisions),
    )
    if check.broke:
        _note_break(check, notes)
    return check


def prefix_points(
    tracker: PrefixTracker,
    key: object,
    plan: Plan,
    model: Any,
    tools: Any,
    messages: Sequence[Message],
    measure: Measure,
    notes: list[tuple[EventType, dict[str, Any]]],
    decisions: Sequence[tuple[EventType, dict[str, Any]]],
) -> tuple[int, ...]:
    """:func:`check_prefix`'s cache points, the same note included, without building a
    :class:`CacheCheck` for a request that repeats the previous one whole (every build)."""
    found = tracker.points_or_break(
        key,
        _model_name(model),
        tools_digest(tools),
        messages,
        segments_of(plan, messages, decisions),
        reasons_of(measure, notes, decisions),
    )
    if isinstance(found, CacheCheck):
        if found.broke:
            _note_break(found, notes)
        return found.points
    return found

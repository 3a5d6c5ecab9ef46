"""Patterns in the loop: match once per turn, keep the result for every iteration of the turn."""

from __future__ import annotations

from typing import TYPE_CHECKING

from loom.events import EventType

if TYPE_CHECKING:
    from loom.loop import Turn
    from loom.patterns.library import PatternLibrary

__all__ = ["patterns_for_turn"]

_ATTR = "_loom_patterns_rom"


def patterns_for_turn(library: PatternLibrary, turn: Turn) -> list[str]:
    """ROM entries for this turn: the patterns matched to its user message.

    The first call of a turn takes the library's current snapshot, matches the user message,
    announces ``PATTERNS_MATCHED`` and remembers the texts on the turn; later iterations reuse
    them, so a reload in the middle of a turn does not change what that turn sees.
    """
    cached: list[str] | None = getattr(turn, _ATTR, None)
    if cached is not None:
        return cached
    index = library.snapshot()
    matches = index.match(turn.message, library.k, library.min_score)
    rom = [pattern.to_prompt() for pattern, _ in matches]
    setattr(turn, _ATTR, rom)
    turn._announce(
        EventType.PATTERNS_MATCHED,
        patterns=[{"name": p.name, "title": p.title, "score": s} for p, s in matches],
        library_version=index.version,
        library_size=len(index),
    )
    return rom

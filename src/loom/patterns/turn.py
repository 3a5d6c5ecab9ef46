"""Patterns in the loop: match once per turn; the turn keeps the result for every iteration."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loom.patterns.library import PatternLibrary

__all__ = ["match_patterns"]


def match_patterns(library: PatternLibrary, message: str) -> tuple[list[str], dict[str, Any]]:
    """ROM entries for a turn (the patterns matched to its user message) and the
    ``PATTERNS_MATCHED`` payload. Called once a turn on the library's current snapshot, so a
    reload in the middle of a turn does not change what that turn sees."""
    index = library.snapshot()
    matches = index.match(message, library.k, library.min_score)
    rom = [pattern.to_prompt() for pattern, _ in matches]
    payload = {
        "patterns": [{"name": p.name, "title": p.title, "score": s} for p, s in matches],
        "library_version": index.version,
        "library_size": len(index),
    }
    return rom, payload

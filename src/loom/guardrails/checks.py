"""Simple shipped checks: ``MaxLength`` and ``AllowedLanguages`` (input and output).

``AllowedLanguages`` uses ``langdetect`` (pure Python, Google's language-detection profiles;
``pip install 'loom-agents[guardrails]'``), seeded so the same text always gets the same
answer. Text shorter than ``min_chars`` is not judged: detection on a few words is noise.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from loom.errors import ConfigurationError, MissingDependencyError
from loom.guardrails.base import Decision, GuardrailContext

__all__ = ["AllowedLanguages", "MaxLength", "detect_language"]


class MaxLength:
    """Trips (or, with ``truncate=True``, cuts) a user message or an answer longer than
    ``max_chars``. ``input`` / ``output`` choose which it checks."""

    fatal = True
    parallel = False

    def __init__(
        self,
        max_chars: int,
        *,
        input: bool = True,
        output: bool = True,
        truncate: bool = False,
        name: str = "max_length",
    ) -> None:
        if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars <= 0:
            raise ConfigurationError(
                f"MaxLength: max_chars must be a positive int, got {max_chars!r}"
            )
        self.max_chars, self.input, self.output = max_chars, input, output
        self.truncate, self.name = truncate, name

    def _check(self, text: str, on: bool, what: str) -> Decision:
        if not on or len(text) <= self.max_chars:
            return Decision.allow()
        reason = f"the {what} is {len(text)} characters, over the limit of {self.max_chars}"
        if self.truncate:
            return Decision.fix(text[: self.max_chars], reason + " (truncated)")
        return Decision.trip(reason)

    async def check_input(self, text: str, ctx: GuardrailContext) -> Decision:
        return self._check(text, self.input, "message")

    async def check_output(self, text: str, ctx: GuardrailContext) -> Decision:
        return self._check(text, self.output, "answer")


_LOCK = threading.Lock()
_FACTORY: Any = None


def detect_language(text: str) -> str:
    """The ISO 639-1 code ``langdetect`` finds for ``text`` (``"unknown"`` if none)."""
    global _FACTORY
    try:
        from langdetect import DetectorFactory
        from langdetect.lang_detect_exception import (
            LangDetectException,
        )
    except ImportError:
        raise MissingDependencyError("langdetect", "guardrails", "AllowedLanguages") from None
    with _LOCK:  # its profile loading and seeding are global state
        if _FACTORY is None:
            factory = DetectorFactory()
            factory.load_profile(_profiles())
            factory.seed = 0  # deterministic answers
            _FACTORY = factory
        try:
            detector = _FACTORY.create()
            detector.append(text)
            return str(detector.detect())
        except LangDetectException:
            return "unknown"


def _profiles() -> str:
    import os

    import langdetect

    return os.path.join(os.path.dirname(langdetect.__file__), "profiles")


class AllowedLanguages:
    """Trips when a user message (``input``) or an answer (``output``) is not in one of
    ``languages`` (ISO 639-1 codes such as ``"en"``, ``"fr"``)."""

    fatal = True
    parallel = False

    def __init__(
        self,
        languages: Iterable[str],
        *,
        input: bool = True,
        output: bool = True,
        min_chars: int = 20,
        name: str = "language",
    ) -> None:
        self.languages = frozenset(languages)
        if not self.languages or not all(isinstance(x, str) for x in self.languages):
            raise ConfigurationError(
                "AllowedLanguages: give one or more ISO 639-1 codes, such as ['en', 'fr']"
            )
        self.input, self.output, self.min_chars, self.name = input, output, min_chars, name

    async def _check(self, text: str, on: bool, what: str) -> Decision:
        if not on or len(text.strip()) < self.min_chars:
            return Decision.allow()
        import asyncio

        lang = await asyncio.to_thread(detect_language, text)
        if lang in self.languages:
            return Decision.allow(f"language {lang}")
        allowed = ", ".join(sorted(self.languages))
        return Decision.trip(f"the {what} is in {lang!r}, not one of the allowed: {allowed}")

    async def check_input(self, text: str, ctx: GuardrailContext) -> Decision:
        return await self._check(text, self.input, "message")

    async def check_output(self, text: str, ctx: GuardrailContext) -> Decision:
        return await self._check(text, self.output, "answer")

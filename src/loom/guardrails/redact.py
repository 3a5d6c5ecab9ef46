"""PII and secret redaction: ``Redactor`` (a guardrail) and ``redact(text)``.

Built-in kinds: ``email``, ``phone`` (written with separators or in +E.164 form), ``card``
(13-19 digits that pass the Luhn check), ``api_key`` (``sk-…``, ``ghp_…``/``gho_…``/…,
``github_pat_…``, ``xox?-…``, ``AIza…``), ``aws_key`` (``AKIA…``/``ASIA…``), ``jwt``,
``private_key`` (PEM blocks), ``bearer`` (``Bearer <token>``) and ``credential``
(``password=…``, ``api_key: …``: the value only). Each match becomes ``[REDACTED:<kind>]``.

Extra patterns are ``{name: regex}``; a regex with a group named ``secret`` replaces only that
group. A pattern that does not compile raises ``RedactionPatternError`` naming it.

As a guardrail, a ``Redactor`` fixes the user's message, every model response (the final
answer, the text beside tool calls and the tool calls' arguments) and every tool result (text,
error message, metadata such as tracebacks) before they are stored, so the journal (messages,
events, the tool-call ledger), the error store and the large-result store never hold what it
matches. What is committed is what runs: a tool gets the redacted arguments, as the model
gets the redacted message and results (give a tool its real secrets through its own
configuration, never through the model). ``loom
sessions export`` redacts transcripts with it; ``redact(text)`` is the plain function for other
sinks (trace span attributes).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from loom.errors import RedactionPatternError
from loom.guardrails.base import Decision, GuardrailContext
from loom.messages import ModelResponse, ToolCall, ToolResult

__all__ = ["BUILTIN_PATTERNS", "Redactor", "luhn_ok", "redact", "redaction_count"]

BUILTIN_PATTERNS: dict[str, str] = {
    "private_key": r"-----BEGIN[A-Z ]*PRIVATE KEY-----[\s\S]*?-----END[A-Z ]*PRIVATE KEY-----",
    "jwt": r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}",
    "api_key": (
        r"\b(?:sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{20,}"
        r"|xox[abposr]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_-]{35})"
    ),
    "aws_key": r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
    "bearer": r"(?i)\bbearer\s+(?P<secret>[A-Za-z0-9._~+/-]{16,}=*)",
    "credential": (
        r"(?i)\b(?:password|passwd|pwd|secret|api[_-]?key|access[_-]?token|auth[_-]?token)"
        r"\b[\"']?\s*[:=]\s*[\"']?(?P<secret>[^\s\"',;]{6,})"
    ),
    "email": r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b",
    "card": r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])",
    # +CC then groups, (AAA) BBB-CCCC, AAA-BBB-CCCC: separators required, so ids, dates and
    # runs of digits are left alone
    "phone": (
        r"(?<![\w+.-])(?:\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]\d{2,4}){1,4}"
        r"|\+\d{10,15}|\(\d{3}\)[ .-]?\d{3}[ .-]\d{4}|\d{3}[.-]\d{3}[.-]\d{4})(?![\w.-])"
    ),
}
"""The built-in kinds, in the order they are applied (longest, most specific first)."""


def luhn_ok(digits: str) -> bool:
    """Whether a string of digits passes the Luhn checksum (card numbers do)."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _compile(name: str, pattern: str | re.Pattern[str]) -> re.Pattern[str]:
    if isinstance(pattern, re.Pattern):
        return pattern
    if not isinstance(pattern, str) or not pattern:
        raise RedactionPatternError(
            f"redaction pattern {name!r} must be a non-empty regular expression string, got "
            f"{pattern!r}",
            name=name,
        )
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise RedactionPatternError(
            f"redaction pattern {name!r} does not compile: {exc} (pattern {pattern!r}); fix "
            "the regular expression or remove it",
            name=name,
        ) from None


class Redactor:
    """Replaces PII and secrets with ``[REDACTED:<kind>]`` (see the module docstring).

    Args:
        patterns: Extra ``{name: regex}`` patterns (compiled now).
        kinds: Which built-in kinds to use (default all); ``()`` for only ``patterns``.
        input / output / tool_results: Which guardrail checks redact (all by default).
        tool_calls: Redact the model's tool-call arguments and the text beside them before
            they are committed (the tool runs with the redacted arguments).
        name: Label in ``GUARDRAIL`` events.
    """

    fatal = True
    parallel = False

    def __init__(
        self,
        patterns: Mapping[str, str | re.Pattern[str]] | None = None,
        *,
        kinds: Iterable[str] | None = None,
        input: bool = True,
        output: bool = True,
        tool_results: bool = True,
        tool_calls: bool = True,
        name: str = "redact",
    ) -> None:
        chosen = list(BUILTIN_PATTERNS) if kinds is None else list(kinds)
        unknown = [k for k in chosen if k not in BUILTIN_PATTERNS]
        if unknown:
            raise RedactionPatternError(
                f"unknown built-in redaction kind {unknown[0]!r}; known: "
                f"{', '.join(BUILTIN_PATTERNS)}",
                name=unknown[0],
            )
        self.patterns: list[tuple[str, re.Pattern[str]]] = [
            (k, re.compile(BUILTIN_PATTERNS[k])) for k in chosen
        ]
        for key, pattern in (patterns or {}).items():
            self.patterns.append((key, _compile(key, pattern)))
        self.input, self.output, self.tool_results = input, output, tool_results
        self.tool_calls = tool_calls
        self.name = name

    def findings(self, text: str) -> list[str]:
        """The kinds found in ``text`` (one entry per match), for reasons and tests."""
        found: list[str] = []
        self._sub(text, found)
        return found

    def redact(self, text: str) -> str:
        """``text`` with every match replaced."""
        return self._sub(text, None)

    def _sub(self, text: str, found: list[str] | None) -> str:
        if not text:
            return text
        for kind, rx in self.patterns:
            text = rx.sub(lambda m, k=kind: self._replace(m, k, found), text)  # type: ignore[misc]
        return text

    @staticmethod
    def _replace(m: re.Match[str], kind: str, found: list[str] | None) -> str:
        if kind == "card" and not luhn_ok(re.sub(r"\D", "", m.group(0))):
            return m.group(0)  # digits that are not a card number (an id, a timestamp)
        if found is not None:
            found.append(kind)
        mark = f"[REDACTED:{kind}]"
        if "secret" in m.re.groupindex and m.group("secret") is not None:
            start, end = m.span("secret")
            whole = m.group(0)
            return whole[: start - m.start()] + mark + whole[end - m.start() :]
        return mark

    def redact_value(self, value: Any) -> Any:
        """``value`` with every string inside it (dicts, lists, tuples) redacted."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {k: self.redact_value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self.redact_value(v) for v in value)
        return value

    def redact_response(self, response: ModelResponse) -> tuple[ModelResponse, list[str]]:
        """A response with tool calls, its text and the calls' arguments redacted (before the
        loop commits it), and the kinds found; unchanged when there is nothing to redact."""
        if not self.tool_calls or not response.tool_calls:
            return response, []
        found = self.findings(response.text)
        calls = []
        for call in response.tool_calls:
            args = self.redact_value(call.arguments)
            if args != call.arguments:
                found += self.findings(repr(call.arguments))
                call = call.model_copy(update={"arguments": args, "raw_arguments": None})
            calls.append(call)
        if not found:
            return response, []
        update = {"text": self.redact(response.text), "tool_calls": calls}
        return response.model_copy(update=update), found

    def _text(self, text: str, on: bool) -> Decision:
        if not on:
            return Decision.allow()
        found = self.findings(text)
        if not found:
            return Decision.allow()
        return Decision.fix(self.redact(text), f"redacted {_count(found)}")

    async def check_input(self, text: str, ctx: GuardrailContext) -> Decision:
        return self._text(text, self.input)

    async def check_output(self, text: str, ctx: GuardrailContext) -> Decision:
        return self._text(text, self.output)

    async def check_result(
        self, call: ToolCall, result: ToolResult, ctx: GuardrailContext
    ) -> Decision:
        if not self.tool_results:
            return Decision.allow()
        before = result.model_dump()
        fixed = {k: self.redact_value(before[k]) for k in ("data", "error_message", "metadata")}
        if fixed == {k: before[k] for k in fixed}:
            return Decision.allow()
        found = self.findings(
            repr(before["data"]) + repr(before["error_message"]) + repr(before["metadata"])
        )
        return Decision.fix(result.model_copy(update=fixed), f"redacted {_count(found)}")

    def __repr__(self) -> str:
        return f"Redactor({[k for k, _ in self.patterns]})"


def redaction_count(found: list[str]) -> str:
    """``found`` kinds summed up for a reason text: ``"2 email, 1 aws_key"``."""
    return _count(found)


def _count(found: list[str]) -> str:
    kinds: dict[str, int] = {}
    for k in found:
        kinds[k] = kinds.get(k, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in kinds.items()) or "matches"


_DEFAULT: Redactor | None = None


def redact(text: str, redactor: Redactor | None = None) -> str:
    """``text`` with PII and secrets replaced by the built-in patterns (or ``redactor``'s).
    For sinks outside the run (trace span attributes, logs)."""
    global _DEFAULT
    if redactor is None:
        redactor = _DEFAULT = _DEFAULT or Redactor()
    return redactor.redact(text)

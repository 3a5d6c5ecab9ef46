"""``Guardrails``: an agent's guardrails sorted by kind, run in order, decisions recorded.

``Agent(guardrails=[...])`` builds one. Each ``check_*`` method runs the guardrails of one kind
on a value and returns an ``Outcome``: the value after every fix, one ``Record`` per decision
(the loop commits each as a ``GUARDRAIL`` event) and the trip that stops the run, if any.
Guardrails of a kind run in the order given, each seeing the previous one's fix; the first
trip ends the check. A guardrail that raises is a trip with its exception recorded, or, when
it is marked ``fatal=False``, a ``warn`` record and a pass. Nothing here writes anything.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loom.errors import ConfigurationError
from loom.guardrails.base import METHODS, Decision, GuardrailContext, Kind
from loom.messages import ModelResponse, ToolCall, ToolResult

__all__ = ["Guardrails", "Outcome", "Record", "Tripped"]

_PREVIEW = 2000  # a fix's replacement is recorded up to this many characters


@dataclass(frozen=True, slots=True)
class Record:
    """One guardrail decision as the ``GUARDRAIL`` event records it."""

    guardrail: str
    kind: Kind
    action: str  # pass | fix | trip | warn (a non-fatal guardrail raised)
    reason: str = ""
    error: str | None = None  # the exception, when the guardrail raised
    tool_call_id: str | None = None
    replacement: Any = None  # a fix's new value (text clipped to 2000 characters)

    def data(self) -> dict[str, Any]:
        """The event payload."""
        return {
            "guardrail": self.guardrail,
            "kind": self.kind,
            "action": self.action,
            "reason": self.reason,
            "error": self.error,
            "tool_call_id": self.tool_call_id,
            "replacement": self.replacement,
        }


@dataclass(slots=True)
class Outcome:
    """What one check produced: the (possibly fixed) value, the decisions, the trip."""

    value: Any
    records: list[Record] = field(default_factory=list)
    trip: Record | None = None


class Tripped(Exception):
    """Raised inside the turn when a guardrail tripped: the loop ends the run with
    ``stop_reason="guardrail"`` and this reason."""

    def __init__(self, record: Record) -> None:
        super().__init__(record.reason)
        self.record = record

    @property
    def reason(self) -> str:
        r = self.record
        return f"guardrail {r.guardrail!r} ({r.kind}) tripped: {r.reason}"


def _name(g: Any) -> str:
    return str(getattr(g, "name", None) or type(g).__name__)


def _preview(value: Any) -> Any:
    if isinstance(value, ToolResult):
        value = value.to_content()
    if isinstance(value, str) and len(value) > _PREVIEW:
        return value[:_PREVIEW] + "..."
    return value


class Guardrails:
    """An agent's guardrails, sorted by the checks each implements (see the module docstring).

    Raises ``ConfigurationError`` for an item that implements no check.
    """

    def __init__(self, items: Sequence[Any]) -> None:
        self.items = tuple(items)
        self.by_kind: dict[Kind, list[Any]] = {k: [] for k in METHODS}
        self.parallel: list[Any] = []
        for g in self.items:
            kinds = [k for k, m in METHODS.items() if callable(getattr(g, m, None))]
            if not kinds:
                raise ConfigurationError(
                    f"guardrail {g!r} has none of check_input, check_output, check_call, "
                    "check_result; implement one of the loom.guardrails protocols or wrap a "
                    "function with input_guardrail / output_guardrail / tool_call_guardrail / "
                    "tool_result_guardrail"
                )
            for k in kinds:
                if k == "input" and getattr(g, "parallel", False):
                    self.parallel.append(g)
                else:
                    self.by_kind[k].append(g)

    def __bool__(self) -> bool:
        return bool(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Any:
        return iter(self.items)

    def has(self, kind: Kind) -> bool:
        """Whether any guardrail checks ``kind`` (parallel input guardrails not counted)."""
        return bool(self.by_kind[kind])

    @property
    def redactor(self) -> Any:
        """The first guardrail that can redact free text (has ``redact``), or None."""
        return next((g for g in self.items if callable(getattr(g, "redact", None))), None)

    def redact_response(self, response: ModelResponse) -> Outcome:
        """A response with tool calls as the redacting guardrail (``redactor``) commits it: its
        text and the calls' arguments redacted (what is stored is what runs)."""
        redactor = self.redactor
        fix = getattr(redactor, "redact_response", None)
        if fix is None:
            return Outcome(response)
        from loom.guardrails.redact import redaction_count

        fixed, found = fix(response)
        if not found:
            return Outcome(response)
        reason = f"redacted {redaction_count(found)} in the response and its tool calls"
        return Outcome(fixed, [Record(_name(redactor), "tool_call", "fix", reason)])

    async def _one(self, g: Any, kind: Kind, args: tuple[Any, ...]) -> Decision | Record:
        """Run one guardrail: its decision, or the record of a failure (trip or warn)."""
        try:
            out = await getattr(g, METHODS[kind])(*args)
            if not isinstance(out, Decision):
                from loom.guardrails.base import to_decision

                out = to_decision(out, f"guardrail {_name(g)!r}")
            if out.action not in ("pass", "fix", "trip"):
                raise TypeError(f"returned a Decision with unknown action {out.action!r}")
            return out
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            if getattr(g, "fatal", True):
                return Record(_name(g), kind, "trip", f"the guardrail raised {error}", error)
            return Record(
                _name(g),
                kind,
                "warn",
                f"the guardrail raised {error}; passed because it is not fatal",
                error,
            )

    async def _chain(
        self, kind: Kind, value: Any, args: Any, apply: Any, call_id: str | None = None
    ) -> Outcome:
        out = Outcome(value)
        for g in self.by_kind[kind]:
            got = await self._one(g, kind, args(out.value))
            if isinstance(got, Record):
                rec = Record(got.guardrail, got.kind, got.action, got.reason, got.error, call_id)
            elif got.action == "fix":
                try:
                    out.value = apply(out.value, got.replacement)
                except (TypeError, ValueError) as exc:
                    rec = Record(
                        _name(g),
                        kind,
                        "trip",
                        f"its fix is unusable: {exc}",
                        f"{type(exc).__name__}: {exc}",
                        call_id,
                    )
                else:
                    rec = Record(
                        _name(g),
                        kind,
                        "fix",
                        got.reason,
                        None,
                        call_id,
                        _preview(out.value if kind != "tool_call" else got.replacement),
                    )
            else:
                rec = Record(_name(g), kind, got.action, got.reason, None, call_id)
            out.records.append(rec)
            if rec.action == "trip":
                out.trip = rec
                break
        return out

    async def check_input(self, text: str, ctx: GuardrailContext) -> Outcome:
        """The sequential input guardrails on the user's message."""
        return await self._chain("input", text, lambda v: (v, ctx), _text_fix)

    async def check_parallel(self, text: str, ctx: GuardrailContext) -> Outcome:
        """The ``parallel=True`` input guardrails, together; a fix counts as a trip (the model
        already has the message)."""
        got = await asyncio.gather(*(self._one(g, "input", (text, ctx)) for g in self.parallel))
        out = Outcome(text)
        for g, d in zip(self.parallel, got, strict=True):
            if isinstance(d, Record):
                rec = d
            elif d.action == "fix":
                rec = Record(
                    _name(g),
                    "input",
                    "trip",
                    "a parallel input guardrail cannot fix "
                    f"the message (the model already has it); it asked to: {d.reason}",
                )
            else:
                rec = Record(_name(g), "input", d.action, d.reason)
            out.records.append(rec)
            if rec.action == "trip" and out.trip is None:
                out.trip = rec
        return out

    async def check_output(self, text: str, ctx: GuardrailContext) -> Outcome:
        """The output guardrails on the final answer."""
        return await self._chain("output", text, lambda v: (v, ctx), _text_fix)

    async def check_call(self, call: ToolCall, ctx: GuardrailContext) -> Outcome:
        """The tool-call guardrails on one call; a fix replaces its arguments."""
        return await self._chain("tool_call", call, lambda v: (v, ctx), _args_fix, call.id)

    async def check_result(
        self, call: ToolCall, result: ToolResult, ctx: GuardrailContext
    ) -> Outcome:
        """The tool-result guardrails on one result; a fix replaces it (or its text)."""
        return await self._chain(
            "tool_result", result, lambda v: (call, v, ctx), _result_fix, call.id
        )


def _text_fix(_old: str, new: Any) -> str:
    if not isinstance(new, str):
        raise TypeError(f"a text fix must be a str, got {type(new).__name__}")
    return new


def _args_fix(call: ToolCall, new: Any) -> ToolCall:
    if not isinstance(new, dict):
        raise TypeError(
            f"a tool-call fix must be the new arguments (a dict), got {type(new).__name__}"
        )
    return call.model_copy(update={"arguments": new, "raw_arguments": None})


def _result_fix(old: ToolResult, new: Any) -> ToolResult:
    if isinstance(new, ToolResult):
        return new
    if not isinstance(new, str):
        raise TypeError(f"a tool-result fix must be a ToolResult or str, got {type(new).__name__}")
    if old.success:
        return old.model_copy(update={"data": new})
    return old.model_copy(update={"error_message": new})

"""The guardrail protocols, their decisions, and function guardrails.

A guardrail looks at one thing a run is about to do and returns a ``Decision``: ``pass``,
``fix`` (a replacement, recorded) or ``trip`` (the run stops with ``stop_reason="guardrail"``).
Four checks, one protocol each; one object may implement several:

- ``InputGuardrail.check_input(text, ctx)``: the user's message; a fix is the new message.
- ``OutputGuardrail.check_output(text, ctx)``: the final answer; a fix is the new answer.
- ``ToolCallGuardrail.check_call(call, ctx)``: a call before it runs; a fix is its new
  arguments (a ``dict``).
- ``ToolResultGuardrail.check_result(call, result, ctx)``: a result before it is stored and
  the model sees it; a fix is a ``ToolResult`` or the text the model reads.

Optional attributes: ``name`` (labels its events; default the class name), ``fatal`` (default
True: a guardrail that raises trips the run with the exception recorded; False: the exception
is recorded as a warning and the check passes), ``parallel`` (input guardrails only: run
alongside the first model call and cancel it on a trip; such a guardrail may pass or trip, not
fix, because the model already has the message).

Guardrails take data and return decisions; the loop records and acts on them.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from loom.errors import ConfigurationError
from loom.messages import Message, ToolCall, ToolResult

__all__ = [
    "Action",
    "Decision",
    "FunctionGuardrail",
    "GuardrailContext",
    "InputGuardrail",
    "Kind",
    "OutputGuardrail",
    "ToolCallGuardrail",
    "ToolResultGuardrail",
    "input_guardrail",
    "output_guardrail",
    "tool_call_guardrail",
    "tool_result_guardrail",
]

Action = Literal["pass", "fix", "trip"]
Kind = Literal["input", "output", "tool_call", "tool_result"]
METHODS: dict[Kind, str] = {
    "input": "check_input",
    "output": "check_output",
    "tool_call": "check_call",
    "tool_result": "check_result",
}


@dataclass(frozen=True, slots=True)
class Decision:
    """What a guardrail decided. Build one with ``Decision.allow()``, ``Decision.fix(value,
    reason)`` or ``Decision.trip(reason)``."""

    action: Action
    reason: str = ""
    replacement: Any = None

    @classmethod
    def allow(cls, reason: str = "") -> Decision:
        """Let it through unchanged."""
        return cls("pass", reason)

    @classmethod
    def fix(cls, replacement: Any, reason: str) -> Decision:
        """Let it through as ``replacement`` (recorded with ``reason``)."""
        return cls("fix", reason, replacement)

    @classmethod
    def trip(cls, reason: str) -> Decision:
        """Stop the run (``stop_reason="guardrail"``) because of ``reason``."""
        return cls("trip", reason)


@dataclass(frozen=True, slots=True)
class GuardrailContext:
    """What a guardrail may look at besides the checked value."""

    agent_name: str = ""
    session_id: str = ""
    run_id: str = ""
    user_message: str = ""  # this turn's message (after input fixes)
    messages: Sequence[Message] = ()  # the session's transcript as committed so far
    deps: Any = None  # the run's deps (``run(deps=...)`` or ``Agent(deps=...)``)
    metadata: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class InputGuardrail(Protocol):
    """Checks the user's message before the model is called."""

    async def check_input(self, text: str, ctx: GuardrailContext) -> Decision:
        """Pass, fix (a new message) or trip."""
        ...


@runtime_checkable
class OutputGuardrail(Protocol):
    """Checks the final answer before it is committed and returned."""

    async def check_output(self, text: str, ctx: GuardrailContext) -> Decision:
        """Pass, fix (a new answer) or trip."""
        ...


@runtime_checkable
class ToolCallGuardrail(Protocol):
    """Checks a tool call's arguments before it runs (after permission hooks)."""

    async def check_call(self, call: ToolCall, ctx: GuardrailContext) -> Decision:
        """Pass, fix (new arguments, a dict) or trip."""
        ...


@runtime_checkable
class ToolResultGuardrail(Protocol):
    """Checks a tool's result before it is stored and before the model sees it."""

    async def check_result(
        self, call: ToolCall, result: ToolResult, ctx: GuardrailContext
    ) -> Decision:
        """Pass, fix (a ``ToolResult`` or the text the model reads) or trip."""
        ...


def to_decision(value: Any, who: str) -> Decision:
    """A guardrail's return value as a ``Decision``: ``None`` / ``True`` pass, ``False`` trips."""
    if isinstance(value, Decision):
        return value
    if value is None or value is True:
        return Decision.allow()
    if value is False:
        return Decision.trip(f"{who} returned False")
    raise TypeError(
        f"{who} returned {type(value).__name__} {value!r}; return a loom.guardrails.Decision "
        "(Decision.allow(), Decision.fix(value, reason), Decision.trip(reason)), True or None"
    )


class FunctionGuardrail:
    """A guardrail made of one function (sync or async) for one kind of check; built by
    ``input_guardrail``, ``output_guardrail``, ``tool_call_guardrail`` and
    ``tool_result_guardrail``. The function returns a ``Decision``, ``True``/``None`` (pass)
    or ``False`` (trip)."""

    def __init__(
        self,
        kind: Kind,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        fatal: bool = True,
        parallel: bool = False,
    ) -> None:
        if not callable(fn):
            raise ConfigurationError(f"a {kind} guardrail needs a callable, got {type(fn)!r}")
        if parallel and kind != "input":
            raise ConfigurationError(
                f"parallel=True is for input guardrails only (got a {kind} guardrail)"
            )
        self.kind, self.fn = kind, fn
        self.name = name or getattr(fn, "__name__", kind) or kind
        self.fatal, self.parallel = fatal, parallel
        # Only the one check method of its kind exists on the instance, so the engine files
        # it under that kind alone.
        setattr(self, METHODS[kind], self._check)

    async def _check(self, *args: Any) -> Decision:
        out = self.fn(*args)
        if inspect.isawaitable(out):
            out = await out
        return to_decision(out, f"guardrail {self.name!r}")

    def __repr__(self) -> str:
        return f"FunctionGuardrail({self.kind}, {self.name!r})"


def _decorator(kind: Kind) -> Callable[..., Any]:
    def make(
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        fatal: bool = True,
        parallel: bool = False,
    ) -> Any:
        def wrap(f: Callable[..., Any]) -> FunctionGuardrail:
            return FunctionGuardrail(kind, f, name=name, fatal=fatal, parallel=parallel)

        return wrap(fn) if fn is not None else wrap

    make.__name__ = f"{kind}_guardrail"
    make.__doc__ = (
        f"Make a {kind} guardrail from a function (usable as ``@{kind}_guardrail`` or "
        f"``@{kind}_guardrail(name=..., fatal=...)``)."
    )
    return make


GuardFn = Callable[..., Awaitable[Any] | Any]
input_guardrail = _decorator("input")
output_guardrail = _decorator("output")
tool_call_guardrail = _decorator("tool_call")
tool_result_guardrail = _decorator("tool_result")

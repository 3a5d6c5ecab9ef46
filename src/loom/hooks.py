"""Lifecycle hooks: the nine points of seed 002 plus seed 003's post-tools hook.

A hook is any object with some of these async (or sync) methods; implement only the points you
need. Hooks run in the order given to the agent. Order within one iteration::

    before_iteration_start → before_context_assembly → after_context_assembly
    → before_llm_call → after_llm_response
    → [per tool call] before_tool_execution → after_tool_execution
    → post_tools → before_recursion                (when the model called tools)
    → after_iteration_end                          (when the model answered)

Return values that matter:
- ``before_llm_call`` may return a list of messages to append *for this call only*.
- ``before_tool_execution`` may return ``Deny(reason)`` (the model gets a ``denied`` result)
  or ``ReplaceArguments({...})``; later hooks see the replaced arguments.

A public method whose name looks like a hook point but is not one (``before_tool_exec``,
``after_llm_responce``) would never be called: ``compile_hooks`` raises ``HookDefinitionError``
naming the closest hook point. Name helper methods with a leading ``_``.

A hook that raises stops the run with an ``ERROR`` event and ``stop_reason="error"``, unless
the hook object has ``fatal = False``, in which case the error is reported and the run goes on.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from loom.errors import HookDefinitionError, HookError
from loom.messages import Message, ModelResponse, RunResult, ToolCall, ToolResult, Usage

if TYPE_CHECKING:
    from loom.spec import AgentSpec

__all__ = [
    "HOOK_POINTS",
    "Deny",
    "HookContext",
    "Hooks",
    "LoggingHook",
    "MetricsHook",
    "ReplaceArguments",
    "RequireApproval",
    "ToolDecision",
]

HOOK_POINTS = (
    "before_iteration_start",
    "before_context_assembly",
    "after_context_assembly",
    "before_llm_call",
    "after_llm_response",
    "before_tool_execution",
    "after_tool_execution",
    "post_tools",
    "before_recursion",
    "after_iteration_end",
)


@dataclass(slots=True)
class HookContext:
    """What a hook sees: the run's identity, its iteration, this turn's tool table, the
    session's remembered permission decisions, and a dict hooks may share."""

    agent: AgentSpec
    run_id: str
    session_id: str
    iteration: int = 0
    state: str = ""
    messages: list[Message] = field(default_factory=list)
    shared: dict[str, Any] = field(default_factory=dict)
    tools: dict[str, Any] = field(default_factory=dict)
    remembered: list[Any] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Deny:
    """Refuse a tool call; the model reads ``reason``."""

    reason: str = "denied by policy"


@dataclass(frozen=True, slots=True)
class ReplaceArguments:
    """Run the tool call with these arguments instead."""

    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RequireApproval:
    """Pause the call until a human approves, rejects or edits it."""

    reason: str = "this call needs approval"


ToolDecision = Deny | ReplaceArguments | RequireApproval | None


class Hooks(Protocol):
    """Documentation of the hook methods; a hook implements any subset of them."""

    async def before_iteration_start(self, ctx: HookContext) -> None: ...
    async def before_context_assembly(self, ctx: HookContext) -> None: ...
    async def after_context_assembly(self, ctx: HookContext, messages: list[Message]) -> None: ...
    async def before_llm_call(
        self, ctx: HookContext, messages: list[Message]
    ) -> list[Message] | None: ...
    async def after_llm_response(self, ctx: HookContext, response: ModelResponse) -> None: ...
    async def before_tool_execution(self, ctx: HookContext, call: ToolCall) -> ToolDecision: ...
    async def after_tool_execution(
        self, ctx: HookContext, call: ToolCall, result: ToolResult
    ) -> None: ...
    async def post_tools(self, ctx: HookContext, results: list[ToolResult]) -> None: ...
    async def before_recursion(self, ctx: HookContext) -> None: ...
    async def after_iteration_end(self, ctx: HookContext, result: RunResult) -> None: ...


HookFn = Callable[..., Awaitable[Any]]


def _as_async(fn: Callable[..., Any]) -> HookFn:
    if inspect.iscoroutinefunction(fn):
        return fn

    async def call(*args: Any) -> Any:
        return fn(*args)

    return call


_HOOK_PREFIXES = ("before_", "after_", "post_", "on_")


@functools.lru_cache(maxsize=256)
def _misnamed(names: frozenset[str]) -> tuple[tuple[str, str], ...]:
    """(name, closest hook point) for each name that looks like a misspelled hook point."""
    found = []
    for name in sorted(names):
        if name in HOOK_POINTS or name.startswith("_"):
            continue
        close = difflib.get_close_matches(name, HOOK_POINTS, n=1, cutoff=0.8)
        if close or name.startswith(_HOOK_PREFIXES):
            best = close or difflib.get_close_matches(name, HOOK_POINTS, n=1, cutoff=0.0)
            found.append((name, best[0]))
    return tuple(found)


_CLASS_NAMES: dict[type, frozenset[str]] = {}


def _public_names(h: object) -> frozenset[str]:
    """``h``'s public attribute names, as ``dir(h)`` lists them: the class's (computed once
    per class) and the instance's own, unless the class customises ``__dir__``."""
    cls = type(h)
    if cls.__dir__ is not object.__dir__:
        return frozenset(n for n in dir(h) if not n.startswith("_"))
    names = _CLASS_NAMES.get(cls)
    if names is None:
        names = _CLASS_NAMES[cls] = frozenset(n for n in dir(cls) if not n.startswith("_"))
    own = getattr(h, "__dict__", None)
    if own:
        extra = [n for n in own if not n.startswith("_") and n not in names]
        if extra:
            return names.union(extra)
    return names


def _check_names(h: object) -> None:
    names = _public_names(h)
    for name, closest in _misnamed(names):
        if callable(getattr(h, name, None)):
            raise HookDefinitionError(
                f"hook {type(h).__name__} has a method {name!r}, which is not a hook point and "
                f"would never be called; did you mean {closest!r}? Hook points: "
                f"{', '.join(HOOK_POINTS)}. Rename a helper method to start with '_'."
            )


def compile_hooks(hooks: Sequence[object]) -> dict[str, list[tuple[HookFn, bool]]]:
    """Per hook point, the bound methods to call and whether each one is fatal.

    Raises ``HookDefinitionError`` for a public method named like a hook point that is not
    one (a misspelling would otherwise be ignored without a word).
    """
    table: dict[str, list[tuple[HookFn, bool]]] = {}
    for h in hooks:
        _check_names(h)
        fatal = bool(getattr(h, "fatal", True))
        for point in HOOK_POINTS:
            method = getattr(h, point, None)
            if method is not None and callable(method):
                table.setdefault(point, []).append((_as_async(method), fatal))
    return table


class LoggingHook:
    """Logs every hook point through ``logging`` (logger ``loom``)."""

    fatal = False

    def __init__(self, logger: logging.Logger | None = None, level: int = logging.INFO) -> None:
        self.log = logger or logging.getLogger("loom")
        self.level = level

    async def before_iteration_start(self, ctx: HookContext) -> None:
        self.log.log(self.level, "run %s iteration %d starts", ctx.run_id, ctx.iteration)

    async def before_llm_call(self, ctx: HookContext, messages: list[Message]) -> None:
        self.log.log(
            self.level, "run %s calls the model with %d messages", ctx.run_id, len(messages)
        )

    async def after_llm_response(self, ctx: HookContext, response: ModelResponse) -> None:
        self.log.log(
            self.level,
            "run %s model answered: %d chars, %d tool calls",
            ctx.run_id,
            len(response.text),
            len(response.tool_calls),
        )

    async def before_tool_execution(self, ctx: HookContext, call: ToolCall) -> None:
        self.log.log(self.level, "run %s tool %s(%s)", ctx.run_id, call.name, call.arguments)

    async def after_tool_execution(
        self, ctx: HookContext, call: ToolCall, result: ToolResult
    ) -> None:
        self.log.log(
            self.level,
            "run %s tool %s %s in %.1f ms",
            ctx.run_id,
            call.name,
            "ok" if result.success else f"failed ({result.error_code})",
            result.duration_ms,
        )

    async def after_iteration_end(self, ctx: HookContext, result: RunResult) -> None:
        self.log.log(self.level, "run %s finished: %s", ctx.run_id, result.stop_reason)


@dataclass
class RunMetrics:
    """Counts and durations of one run."""

    llm_calls: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    iterations: int = 0
    llm_seconds: float = 0.0
    tool_seconds: float = 0.0
    usage: Usage = field(default_factory=Usage)
    stop_reason: str = ""


class MetricsHook:
    """Collects per-run counts, durations and token usage in ``metrics[run_id]``."""

    fatal = False

    def __init__(self) -> None:
        self.metrics: dict[str, RunMetrics] = {}
        self._llm_started: dict[str, float] = {}

    def _m(self, ctx: HookContext) -> RunMetrics:
        m = self.metrics.get(ctx.run_id)
        if m is None:
            m = self.metrics[ctx.run_id] = RunMetrics()
        return m

    async def before_iteration_start(self, ctx: HookContext) -> None:
        self._m(ctx).iterations += 1

    async def before_llm_call(self, ctx: HookContext, messages: list[Message]) -> None:
        self._llm_started[ctx.run_id] = time.perf_counter()

    async def after_llm_response(self, ctx: HookContext, response: ModelResponse) -> None:
        m = self._m(ctx)
        m.llm_calls += 1
        m.llm_seconds += time.perf_counter() - self._llm_started.pop(
            ctx.run_id, time.perf_counter()
        )
        if response.usage is not None:
            m.usage = m.usage + response.usage

    async def after_tool_execution(
        self, ctx: HookContext, call: ToolCall, result: ToolResult
    ) -> None:
        m = self._m(ctx)
        m.tool_calls += 1
        m.tool_seconds += result.duration_ms / 1000
        if not result.success:
            m.tool_errors += 1

    async def after_iteration_end(self, ctx: HookContext, result: RunResult) -> None:
        self._m(ctx).stop_reason = result.stop_reason


class _Ready:
    """An awaitable that is already done: skipping hook points nobody uses costs ~nothing."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __await__(self) -> Generator[None, None, Any]:
        return self.value
        yield  # pragma: no cover - makes this a generator


_NO_RESULTS: Any = _Ready(())


class HookRunner:
    """Calls one run's compiled hooks; a non-fatal hook's failure goes to ``report``."""

    __slots__ = ("compiled", "ctx", "report")

    def __init__(
        self,
        compiled: dict[str, list[tuple[HookFn, bool]]],
        ctx: HookContext,
        report: Callable[[str], None],
    ) -> None:
        self.compiled, self.ctx, self.report = compiled, ctx, report

    def __call__(self, point: str, *args: Any) -> Awaitable[list[Any]]:
        """Run every hook of ``point``; their return values, in order."""
        hooks = self.compiled.get(point)
        return self._all(point, hooks, args) if hooks else _NO_RESULTS

    def at(self, point: str) -> list[tuple[HookFn, bool]]:
        return self.compiled.get(point, [])

    async def _all(self, point: str, hooks: Any, args: tuple[Any, ...]) -> list[Any]:
        return [await self.call(point, h, *args) for h in hooks]

    async def call(self, point: str, hook: tuple[HookFn, bool], *args: Any) -> Any:
        """Call one hook; a fatal hook's exception becomes ``HookError``."""
        fn, fatal = hook
        try:
            return await fn(self.ctx, *args)
        except Exception as exc:
            if fatal:
                raise HookError(f"hook {point} raised {type(exc).__name__}: {exc}") from exc
            self.report(f"non-fatal hook {point}: {exc}")
            return None

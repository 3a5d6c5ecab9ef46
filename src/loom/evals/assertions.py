"""Trajectory assertions: checks on what a run did, read from its journal events.

Each assertion is data (a pydantic model built from one mapping of a case's ``assertions``,
e.g. ``{"called": "add"}``) and checks a ``Trajectory`` (the tool calls, model calls, usage,
guardrail decisions and duration of one run) into a ``CheckResult`` with a message. Plugins
register their own kinds with ``register_assertion``; a check returns data, never raises for
a failing run.

| key | value | passes when |
| --- | --- | --- |
| ``called`` | a tool name, or ``{name, arguments?, arguments_regex?}`` | some call matches |
| ``not_called`` | a tool name | no call of that tool |
| ``called_in_order`` | a list of tool names or patterns | they were called in that order
  (others may come between) |
| ``called_any_order`` | a list of tool names or patterns | each was called |
| ``calls_at_most`` | ``{tool, times}`` | that tool ran at most ``times`` times |
| ``effects`` | ``{at_most_once: N}`` | calls of ``at_most_once`` tools are at most N |
| ``model_calls`` / ``tokens`` / ``cost`` / ``duration`` | ``{min?, max?}`` | inside the bounds |
| ``guardrail`` | ``{name?, kind?, tripped: bool}`` | a guardrail tripped (or not) |
| ``stop_reason`` | a stop reason | the run ended that way |
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

if TYPE_CHECKING:
    from loom.events import AgentEvent

__all__ = [
    "ASSERTIONS",
    "Assertion",
    "CheckResult",
    "ToolCallRecord",
    "Trajectory",
    "check_all",
    "matches_subset",
    "member_name",
    "parse_assertions",
    "register_assertion",
    "trajectory_from_events",
]


@dataclass(frozen=True, slots=True)
class ToolCallRecord:
    """One tool call of a run, as its journal recorded it."""

    name: str
    arguments: dict[str, Any]
    effect: str = "pure"


@dataclass(frozen=True, slots=True)
class Trajectory:
    """What one run did: read from its journal events (``trajectory_from_events``)."""

    tool_calls: tuple[ToolCallRecord, ...] = ()
    model_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = None
    duration: float = 0.0
    guardrails: tuple[dict[str, str], ...] = ()  # name, kind, action per decision
    stop_reason: str = ""
    output: str = ""

    @property
    def tokens(self) -> int:
        """Input plus output tokens of every model call."""
        return self.input_tokens + self.output_tokens

    def to_dict(self) -> dict[str, Any]:
        """JSON data, for the stored experiment."""
        return {
            "tool_calls": [
                {"name": c.name, "arguments": c.arguments, "effect": c.effect}
                for c in self.tool_calls
            ],
            "model_calls": self.model_calls,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost": self.cost,
            "duration": self.duration,
            "guardrails": list(self.guardrails),
            "stop_reason": self.stop_reason,
        }


def trajectory_from_events(
    events: Iterable[AgentEvent],
    *,
    effect_of: Callable[[str], str] | None = None,
    duration: float = 0.0,
    cost: float | None = None,
    stop_reason: str = "",
    output: str = "",
) -> Trajectory:
    """The trajectory of a run from its journal events (``Store.load_events(session, run)``);
    ``effect_of`` names each tool's effect (``Agent.effect_of``)."""
    from loom.events import EventType

    calls: list[ToolCallRecord] = []
    guardrails: list[dict[str, str]] = []
    model_calls = input_tokens = output_tokens = 0
    for event in events:
        data = event.data
        if event.type == EventType.TOOL_EXECUTION_START:
            name = str(data.get("tool_name", ""))
            effect = effect_of(name) if effect_of is not None else "pure"
            calls.append(ToolCallRecord(name, dict(data.get("arguments") or {}), str(effect)))
        elif event.type == EventType.LLM_COMPLETE:
            model_calls += 1
            usage = data.get("usage") or {}
            input_tokens += int(usage.get("input_tokens") or 0)
            output_tokens += int(usage.get("output_tokens") or 0)
        elif event.type == EventType.GUARDRAIL:
            guardrails.append(
                {
                    "name": str(data.get("guardrail", "")),
                    "kind": str(data.get("kind", "")),
                    "action": str(data.get("action", "")),
                }
            )
    return Trajectory(
        tuple(calls),
        model_calls,
        input_tokens,
        output_tokens,
        cost,
        duration,
        tuple(guardrails),
        stop_reason,
        output,
    )


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check's outcome: ``passed`` and a message that says what was seen."""

    name: str
    passed: bool
    message: str
    score: float | None = None  # a judge's score, when the check is one
    errored: bool = False  # the check could not be made (a judge's model was down)
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "passed": self.passed,
            "message": self.message,
            "score": self.score,
            "errored": self.errored,
            "details": self.details,
        }


def matches_subset(expected: Any, actual: Any) -> bool:
    """Whether ``actual`` contains ``expected`` (JSON subset: every key of a mapping with a
    matching value, lists equal item by item, scalars equal)."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and matches_subset(v, actual[k]) for k, v in expected.items()
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(expected) == len(actual)
            and all(matches_subset(e, a) for e, a in zip(expected, actual, strict=True))
        )
    return bool(expected == actual)


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CallPattern(_Spec):
    """A tool call to look for: its name and, optionally, arguments (a JSON subset) and a regex
    searched in the arguments' JSON."""

    name: str
    arguments: dict[str, Any] | None = None
    arguments_regex: str | None = None

    def matches(self, call: ToolCallRecord) -> bool:
        if call.name != self.name:
            return False
        if self.arguments is not None and not matches_subset(self.arguments, call.arguments):
            return False
        if self.arguments_regex is not None:
            text = json.dumps(call.arguments, sort_keys=True, ensure_ascii=False)
            return re.search(self.arguments_regex, text) is not None
        return True

    def describe(self) -> str:
        extra = ""
        if self.arguments is not None:
            extra += f" with arguments ⊇ {json.dumps(self.arguments, ensure_ascii=False)}"
        if self.arguments_regex is not None:
            extra += f" with arguments matching /{self.arguments_regex}/"
        return self.name + extra


def _pattern(value: str | CallPattern) -> CallPattern:
    return CallPattern(name=value) if isinstance(value, str) else value


def _seen(trajectory: Trajectory) -> str:
    return ", ".join(c.name for c in trajectory.tool_calls) or "no tool"


class Assertion(_Spec):
    """A trajectory check. ``key`` is its name in a case's ``assertions``; subclasses hold its
    value in ``value`` and implement ``check``."""

    key: ClassVar[str] = ""

    def check(self, trajectory: Trajectory) -> CheckResult:
        raise NotImplementedError

    def tool_names(self) -> list[str]:
        """The tools this assertion names (each must be one of the agent's)."""
        return []

    def result(self, passed: bool, message: str) -> CheckResult:
        return CheckResult(self.key, passed, message)


class Called(Assertion):
    key: ClassVar[str] = "called"
    value: str | CallPattern

    def tool_names(self) -> list[str]:
        return [_pattern(self.value).name]

    def check(self, trajectory: Trajectory) -> CheckResult:
        pattern = _pattern(self.value)
        ok = any(pattern.matches(c) for c in trajectory.tool_calls)
        return self.result(
            ok,
            f"called {pattern.describe()}"
            if ok
            else f"expected a call of {pattern.describe()}; the run called {_seen(trajectory)}",
        )


class NotCalled(Assertion):
    key: ClassVar[str] = "not_called"
    value: str | CallPattern

    def tool_names(self) -> list[str]:
        return [_pattern(self.value).name]

    def check(self, trajectory: Trajectory) -> CheckResult:
        pattern = _pattern(self.value)
        hits = sum(1 for c in trajectory.tool_calls if pattern.matches(c))
        return self.result(
            hits == 0,
            f"{pattern.describe()} not called"
            if hits == 0
            else f"expected no call of {pattern.describe()}; it was called {hits} time(s)",
        )


class CalledInOrder(Assertion):
    key: ClassVar[str] = "called_in_order"
    value: list[str | CallPattern] = Field(min_length=1)

    def tool_names(self) -> list[str]:
        return [_pattern(v).name for v in self.value]

    def check(self, trajectory: Trajectory) -> CheckResult:
        patterns = [_pattern(v) for v in self.value]
        at = 0
        for call in trajectory.tool_calls:
            if at < len(patterns) and patterns[at].matches(call):
                at += 1
        wanted = " → ".join(p.describe() for p in patterns)
        if at == len(patterns):
            return self.result(True, f"called in order: {wanted}")
        return self.result(
            False,
            f"expected calls in order {wanted}; {patterns[at].describe()} did not follow "
            f"(the run called {_seen(trajectory)})",
        )


class CalledAnyOrder(Assertion):
    key: ClassVar[str] = "called_any_order"
    value: list[str | CallPattern] = Field(min_length=1)

    def tool_names(self) -> list[str]:
        return [_pattern(v).name for v in self.value]

    def check(self, trajectory: Trajectory) -> CheckResult:
        missing = [
            _pattern(v).describe()
            for v in self.value
            if not any(_pattern(v).matches(c) for c in trajectory.tool_calls)
        ]
        if not missing:
            return self.result(True, f"called {len(self.value)} tool(s) in some order")
        return self.result(
            False, f"expected calls of {', '.join(missing)}; the run called {_seen(trajectory)}"
        )


class _Times(_Spec):
    tool: str
    times: int = Field(ge=0)


class CallsAtMost(Assertion):
    key: ClassVar[str] = "calls_at_most"
    value: _Times

    def tool_names(self) -> list[str]:
        return [self.value.tool]

    def check(self, trajectory: Trajectory) -> CheckResult:
        n = sum(1 for c in trajectory.tool_calls if c.name == self.value.tool)
        return self.result(
            n <= self.value.times,
            f"{self.value.tool} called {n} time(s), at most {self.value.times} allowed",
        )


class _Effects(_Spec):
    at_most_once: int = Field(ge=0)


class Effects(Assertion):
    key: ClassVar[str] = "effects"
    value: _Effects

    def check(self, trajectory: Trajectory) -> CheckResult:
        calls = [c.name for c in trajectory.tool_calls if c.effect == "at_most_once"]
        limit = self.value.at_most_once
        return self.result(
            len(calls) <= limit,
            f"{len(calls)} call(s) of at_most_once tools ({', '.join(calls) or 'none'}), "
            f"at most {limit} allowed",
        )


class Bounds(_Spec):
    """``min`` and ``max``, both optional and inclusive."""

    min: float | None = None
    max: float | None = None

    def holds(self, value: float) -> bool:
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)

    def describe(self) -> str:
        parts = [f">= {self.min:g}"] if self.min is not None else []
        parts += [f"<= {self.max:g}"] if self.max is not None else []
        return " and ".join(parts) or "any"


class _Bounded(Assertion):
    value: Bounds
    unit: ClassVar[str] = ""

    def measure(self, trajectory: Trajectory) -> float | None:
        raise NotImplementedError

    def check(self, trajectory: Trajectory) -> CheckResult:
        seen = self.measure(trajectory)
        if seen is None:
            return self.result(
                False, f"{self.key} is unknown for this run (no price for its model)"
            )
        return self.result(
            self.value.holds(seen),
            f"{self.key} {seen:g}{self.unit}, wanted {self.value.describe()}",
        )


class ModelCalls(_Bounded):
    key: ClassVar[str] = "model_calls"

    def measure(self, trajectory: Trajectory) -> float | None:
        return trajectory.model_calls


class Tokens(_Bounded):
    key: ClassVar[str] = "tokens"

    def measure(self, trajectory: Trajectory) -> float | None:
        return trajectory.tokens


class Cost(_Bounded):
    key: ClassVar[str] = "cost"
    unit: ClassVar[str] = " USD"

    def measure(self, trajectory: Trajectory) -> float | None:
        return trajectory.cost


class Duration(_Bounded):
    key: ClassVar[str] = "duration"
    unit: ClassVar[str] = " s"

    def measure(self, trajectory: Trajectory) -> float | None:
        return trajectory.duration


class _GuardrailSpec(_Spec):
    name: str | None = None
    kind: str | None = None
    tripped: bool = True


class Guardrail(Assertion):
    key: ClassVar[str] = "guardrail"
    value: _GuardrailSpec

    def check(self, trajectory: Trajectory) -> CheckResult:
        spec = self.value
        trips = [
            g
            for g in trajectory.guardrails
            if g["action"] == "trip"
            and (spec.name is None or g["name"] == spec.name)
            and (spec.kind is None or g["kind"] == spec.kind)
        ]
        which = " ".join(x for x in (spec.kind, spec.name) if x) or "any"
        if spec.tripped:
            return self.result(bool(trips), f"guardrail {which} tripped {len(trips)} time(s)")
        return self.result(not trips, f"guardrail {which} tripped {len(trips)} time(s), wanted 0")


class StopReason(Assertion):
    key: ClassVar[str] = "stop_reason"
    value: str

    def check(self, trajectory: Trajectory) -> CheckResult:
        return self.result(
            trajectory.stop_reason == self.value,
            f"stop reason {trajectory.stop_reason!r}, wanted {self.value!r}",
        )


ASSERTIONS: dict[str, type[Assertion]] = {
    kind.key: kind
    for kind in (
        Called,
        NotCalled,
        CalledInOrder,
        CalledAnyOrder,
        CallsAtMost,
        Effects,
        ModelCalls,
        Tokens,
        Cost,
        Duration,
        Guardrail,
        StopReason,
    )
}
"""Every assertion kind by its key; ``register_assertion`` adds one."""


def register_assertion(kind: type[Assertion]) -> type[Assertion]:
    """Add an assertion kind (a subclass of ``Assertion`` with a ``key`` and a ``value``
    field); usable as a class decorator."""
    if not kind.key or kind.key in ASSERTIONS:
        raise ValueError(f"assertion key {kind.key!r} is empty or taken")
    ASSERTIONS[kind.key] = kind
    return kind


def parse_assertions(raw: Sequence[dict[str, Any]]) -> list[Assertion]:
    """Build each assertion from its mapping (one key: the kind); ``ValueError`` names the
    first one that is wrong."""
    built: list[Assertion] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or len(item) != 1:
            raise ValueError(
                f"assertion {i}: write one mapping with one key (e.g. {{called: add}}), "
                f"got {item!r}"
            )
        ((key, value),) = item.items()
        kind = ASSERTIONS.get(key)
        if kind is None:
            raise ValueError(
                f"assertion {i}: unknown kind {key!r}; known: {', '.join(sorted(ASSERTIONS))}"
            )
        try:
            built.append(kind.model_validate({"value": value}))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"][1:] if not member_name(p))
            raise ValueError(
                f"assertion {i} ({key}{' ' + where if where else ''}): {first['msg']}"
            ) from None
    return built


def member_name(part: int | str) -> bool:
    """Whether a part of a validation error's path names a union member (``str``,
    ``SessionInput``, ``list[...]``), which is no field of the file."""
    if isinstance(part, int):
        return False
    return part[:1].isupper() or "[" in part or part in ("str", "int", "float", "bool", "dict")


def check_all(assertions: Sequence[Assertion], trajectory: Trajectory) -> list[CheckResult]:
    """Every assertion's result on ``trajectory``, in order."""
    return [a.check(trajectory) for a in assertions]

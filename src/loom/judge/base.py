"""The ``Judge`` protocol and the rule-based ``FunctionJudge``."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from loom.errors import ConfigurationError, JudgeError
from loom.messages import Message

__all__ = ["FunctionJudge", "Judge", "JudgeContext", "Judgement", "check_weight", "to_judgement"]


@dataclass(frozen=True, slots=True)
class Judgement:
    """A judge's score (0 = fails the criteria, 1 = fully meets them) and why."""

    score: float
    reason: str = ""


@dataclass(frozen=True, slots=True)
class JudgeContext:
    """What a judge may look at besides the question and the answer."""

    messages: Sequence[Message] = ()  # the session so far, answer included
    attempt: int = 1  # 1 for the first answer, 2 after the first correction, ...
    session_id: str = ""
    run_id: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Judge(Protocol):
    """Scores one answer. ``name`` labels it in verdicts; an optional ``weight`` attribute
    (default 1) counts for the ``weighted`` strategy.

    ``evaluate`` returns a ``Judgement`` with a score from 0 to 1. Raising, or returning a score
    outside 0..1, makes the judge *failing*: the panel scores it as configured (fail-closed by
    default) and records why; the run goes on.
    """

    name: str

    async def evaluate(self, question: str, answer: str, context: JudgeContext) -> Judgement:
        """Score ``answer`` to ``question``."""
        ...


def check_weight(weight: Any, who: str) -> float:
    if (
        isinstance(weight, bool)
        or not isinstance(weight, int | float)
        or not math.isfinite(weight)
        or weight <= 0
    ):
        raise ConfigurationError(f"{who}: weight must be a positive number, got {weight!r}")
    return float(weight)


def to_judgement(value: Any) -> Judgement:
    """Accept a ``Judgement``, a number, a bool, or a ``(score, reason)`` pair; check 0..1."""
    reason = ""
    if isinstance(value, Judgement):
        score, reason = value.score, value.reason
    elif isinstance(value, bool):
        score = 1.0 if value else 0.0
    elif isinstance(value, tuple) and len(value) == 2:
        score, reason = value
    else:
        score = value
    if isinstance(score, bool):
        score = 1.0 if score else 0.0
    if not isinstance(score, int | float):
        raise JudgeError(
            f"returned {type(value).__name__} {value!r}; return a score from 0 to "
            "1, a (score, reason) pair, a bool or a Judgement"
        )
    if not math.isfinite(score) or not 0.0 <= score <= 1.0:
        raise JudgeError(f"returned score {score!r}, outside 0..1")
    return Judgement(float(score), str(reason))


JudgeFunction = Callable[[str, str, JudgeContext], Any]


class FunctionJudge:
    """A rule-based judge: ``fn(question, answer, context)``, sync or async.

    ``fn`` returns a score from 0 to 1, a ``(score, reason)`` pair, a bool (pass/fail) or a
    ``Judgement``.

    ```python
    cites = FunctionJudge(lambda q, a, ctx: ("[source]" in a, "answers must cite a source"),
                          name="cites-source")
    ```
    A bool paired with a reason scores 1 or 0; the reason is kept either way.
    """

    def __init__(self, fn: JudgeFunction, *, name: str | None = None, weight: float = 1.0):
        if not callable(fn):
            raise ConfigurationError(f"FunctionJudge needs a callable, got {type(fn).__name__}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "function") or "function"
        if self.name == "<lambda>":
            self.name = "function"
        self.weight = check_weight(weight, f"judge {self.name!r}")

    async def evaluate(self, question: str, answer: str, context: JudgeContext) -> Judgement:
        out = self.fn(question, answer, context)
        if inspect.isawaitable(out):
            out = await out
        return to_judgement(out)

    def __repr__(self) -> str:
        return f"FunctionJudge({self.name!r}, weight={self.weight:g})"

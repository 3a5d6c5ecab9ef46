"""``JudgePanel``: run judges concurrently, aggregate their scores, decide pass or retry."""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

from loom.errors import ConfigurationError, JudgeError, JudgeTimeout
from loom.judge.base import Judge, JudgeContext, check_weight, to_judgement

__all__ = ["STRATEGIES", "JudgePanel", "JudgeScore", "Strategy", "Verdict", "aggregate"]

Strategy = Literal["mean", "median", "min", "max", "weighted", "vote"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)


@dataclass(frozen=True, slots=True)
class JudgeScore:
    """One judge's part of a verdict. ``error`` is set when the judge failed; ``score`` is then
    what the panel counted for it (0 fail-closed, 1 fail-open)."""

    name: str
    score: float
    reason: str
    passed: bool
    weight: float = 1.0
    error: str | None = None
    duration_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """The panel's decision on one answer."""

    passed: bool
    score: float
    strategy: str
    threshold: float
    judges: tuple[JudgeScore, ...]
    attempt: int = 1
    max_retries: int = 3
    duration_ms: float = 0.0

    @property
    def failures(self) -> tuple[JudgeScore, ...]:
        """Judges that scored below the threshold or failed."""
        return tuple(j for j in self.judges if not j.passed)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["judges"] = [asdict(j) for j in self.judges]
        return out


def aggregate(
    strategy: str, scores: Sequence[float], threshold: float, weights: Sequence[float] | None = None
) -> tuple[float, bool]:
    """Combine scores into ``(score, passed)``.

    mean / median / min / max / weighted (weighted mean) pass when the combined score reaches
    ``threshold``; ``vote`` scores the share of judges at or above ``threshold`` and passes
    when more than half are.
    """
    if not scores:
        raise ConfigurationError("cannot aggregate zero scores; give the panel at least one judge")
    if strategy == "mean":
        score = statistics.fmean(scores)
    elif strategy == "median":
        score = statistics.median(scores)
    elif strategy == "min":
        score = min(scores)
    elif strategy == "max":
        score = max(scores)
    elif strategy == "weighted":
        w = list(weights) if weights is not None else [1.0] * len(scores)
        if len(w) != len(scores):
            raise ConfigurationError(f"{len(w)} weights for {len(scores)} scores")
        score = sum(s * x for s, x in zip(scores, w, strict=True)) / sum(w)
    elif strategy == "vote":
        votes = sum(1 for s in scores if s >= threshold)
        return votes / len(scores), votes * 2 > len(scores)
    else:
        raise ConfigurationError(
            f"unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}"
        )
    return score, score >= threshold


class JudgePanel:
    """Judges that score each final answer; a failing aggregate makes the agent try again.

    Args:
        judges: ``Judge`` objects (``LLMJudge``, ``FunctionJudge`` or your own).
        strategy: mean | median | min | max | weighted | vote (see :func:`aggregate`).
        threshold: Score (0..1) an answer needs to pass; for ``vote``, each judge's pass mark.
        max_retries: Answers judged per turn at most (1-10), the first included; after the
            last one the agent returns that answer with its verdict.
        weights: Per-judge weights for ``weighted``; default each judge's ``weight`` (1).
        fail_open: A failing judge (raised, out-of-range score, timeout) counts as passing
            (score 1) instead of failing (score 0, the default).
        timeout: Seconds any one judge may take before it counts as failing.
    """

    def __init__(
        self,
        judges: Sequence[Judge],
        strategy: Strategy = "mean",
        threshold: float = 0.7,
        max_retries: int = 3,
        *,
        weights: Sequence[float] | None = None,
        fail_open: bool = False,
        timeout: float = 120.0,
    ) -> None:
        judges = list(judges) if not hasattr(judges, "evaluate") else [judges]  # type: ignore[list-item]
        if not judges:
            raise ConfigurationError("JudgePanel needs at least one judge")
        for j in judges:
            if not callable(getattr(j, "evaluate", None)):
                raise ConfigurationError(
                    f"{j!r} is not a judge: it has no evaluate(question, answer, context) method"
                )
        if strategy not in STRATEGIES:
            raise ConfigurationError(
                f"unknown judge strategy {strategy!r}; use one of {', '.join(STRATEGIES)}"
            )
        if (
            isinstance(threshold, bool)
            or not isinstance(threshold, int | float)
            or not math.isfinite(threshold)
            or not 0 <= threshold <= 1
        ):
            raise ConfigurationError(f"threshold must be a number from 0 to 1, got {threshold!r}")
        if (
            isinstance(max_retries, bool)
            or not isinstance(max_retries, int)
            or not (1 <= max_retries <= 10)
        ):
            raise ConfigurationError(
                f"max_retries must be an integer from 1 to 10, got {max_retries!r}"
            )
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigurationError(f"timeout must be positive seconds, got {timeout!r}")
        if weights is None:
            weights = [getattr(j, "weight", 1.0) for j in judges]
        elif len(weights) != len(judges):
            raise ConfigurationError(
                f"{len(weights)} weights for {len(judges)} judges; give one weight per judge"
            )
        self.weights = [
            check_weight(w, f"judge {self._name(j, i)!r}")
            for i, (j, w) in enumerate(zip(judges, weights, strict=True))
        ]
        self.judges = judges
        self.names = _unique([self._name(j, i) for i, j in enumerate(judges)])
        self.strategy: Strategy = strategy
        self.threshold = float(threshold)
        self.max_retries = max_retries
        self.fail_open = fail_open
        self.timeout = float(timeout)

    @staticmethod
    def _name(judge: Any, i: int) -> str:
        return str(getattr(judge, "name", "") or f"judge{i + 1}")

    async def _one(self, i: int, question: str, answer: str, context: JudgeContext) -> JudgeScore:
        name, weight = self.names[i], self.weights[i]
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout):
                raw = await self.judges[i].evaluate(question, answer, context)
            judgement = to_judgement(raw)
        except TimeoutError:
            error: str = str(JudgeTimeout(f"timed out after {self.timeout:g} s"))
        except JudgeError as exc:
            error = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # a judge's bug must not end the run
            error = f"raised {type(exc).__name__}: {exc}"
        else:
            ms = (time.perf_counter() - started) * 1000
            return JudgeScore(
                name,
                judgement.score,
                judgement.reason,
                judgement.score >= self.threshold,
                weight,
                None,
                ms,
            )
        ms = (time.perf_counter() - started) * 1000
        score = 1.0 if self.fail_open else 0.0
        mode = "fail-open" if self.fail_open else "fail-closed"
        return JudgeScore(
            name, score, f"judge failed ({mode}): {error}", self.fail_open, weight, error, ms
        )

    async def evaluate(
        self, question: str, answer: str, context: JudgeContext | None = None
    ) -> Verdict:
        """Run every judge concurrently on one answer and aggregate. Never raises for a judge."""
        context = context or JudgeContext()
        started = time.perf_counter()
        scores = await asyncio.gather(
            *(self._one(i, question, answer, context) for i in range(len(self.judges)))
        )
        score, passed = aggregate(
            self.strategy, [s.score for s in scores], self.threshold, self.weights
        )
        return Verdict(
            passed,
            round(score, 6),
            self.strategy,
            self.threshold,
            tuple(scores),
            context.attempt,
            self.max_retries,
            (time.perf_counter() - started) * 1000,
        )

    def correction(self, verdict: Verdict) -> str:
        """The message that asks the model to answer again, quoting the judges' reasons."""
        quoted = verdict.failures or verdict.judges
        reasons = "\n".join(
            f"- {j.name} (score {j.score:.2f}): {j.reason or 'no reason given'}" for j in quoted
        )
        return (
            f"Your previous answer did not pass review (score {verdict.score:.2f}, needed "
            f"{verdict.threshold:.2f}; strategy {verdict.strategy}). The reviewers said:\n"
            f"{reasons}\n\nWrite a new, complete answer to the original request that fixes "
            "these problems. Do not mention this review."
        )

    def __repr__(self) -> str:
        return (
            f"JudgePanel({self.names}, strategy={self.strategy!r}, "
            f"threshold={self.threshold:g}, max_retries={self.max_retries})"
        )


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}#{seen[n]}")
    return out

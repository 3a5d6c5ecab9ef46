"""The judge step of a turn, as a decision: score a final answer, say whether to go again.

``review_answer`` calls the panel and returns a ``Review``: the ``JUDGE_RESULT`` payload (the
verdict, with the score history) and, when the answer failed with attempts and iterations left,
the correction the model should read next. The loop commits both through its journal (the
correction becomes a ``role="user"`` message via the ``JUDGE_RETRY`` event).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loom.judge.base import JudgeContext
from loom.messages import Message

if TYPE_CHECKING:
    from loom.judge.panel import JudgePanel

__all__ = ["Review", "review_answer"]


@dataclass(slots=True)
class Review:
    """What the judges decided about one answer."""

    attempt: int
    verdict: dict[str, Any]  # the JUDGE_RESULT payload; ends up in RunResult.verdict
    retry: dict[str, Any] | None  # the JUDGE_RETRY payload (with "correction"), or None


async def review_answer(
    panel: JudgePanel,
    question: str,
    answer: str,
    history: Sequence[Message],
    previous: dict[str, Any] | None,
    *,
    can_iterate: bool,
    session_id: str,
    run_id: str,
) -> Review:
    """Judge ``answer`` (``previous`` is the turn's last verdict, if any)."""
    previous = previous or {}
    attempt = int(previous.get("attempt", 0)) + 1
    verdict = await panel.evaluate(
        question,
        answer,
        JudgeContext(messages=list(history), attempt=attempt, session_id=session_id, run_id=run_id),
    )
    data = verdict.to_dict()
    data["history"] = [*previous.get("history", []), verdict.score]
    can_retry = attempt < panel.max_retries and can_iterate
    data["final"] = verdict.passed or not can_retry
    if not verdict.passed and not can_retry:
        data["gave_up"] = "max_retries" if attempt >= panel.max_retries else "max_iterations"
    if data["final"]:
        return Review(attempt, data, None)
    retry = {
        "attempt": attempt,
        "next_attempt": attempt + 1,
        "score": verdict.score,
        "threshold": verdict.threshold,
        "correction": panel.correction(verdict),
    }
    return Review(attempt, data, retry)

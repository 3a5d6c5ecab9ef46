"""The judge step of a turn: score a final answer; on failure, add a correction and go again."""

from __future__ import annotations

from typing import TYPE_CHECKING

from loom.events import EventType
from loom.judge.base import JudgeContext
from loom.messages import Message

if TYPE_CHECKING:
    from loom.judge.panel import JudgePanel
    from loom.loop import Turn

__all__ = ["review_answer"]


async def review_answer(panel: JudgePanel, turn: Turn, answer: str) -> bool:
    """Judge ``answer``; return True when the loop should ask the model again.

    Emits ``JUDGE_START`` and ``JUDGE_RESULT`` (persisted, with the verdict). On a failing
    verdict with attempts and iterations left, commits a ``role="user"`` correction message
    (``metadata["judge_correction"]``) quoting the judges' reasons together with ``JUDGE_RETRY``.
    ``turn.verdict`` always holds the latest verdict, which ends up in ``RunResult.verdict``.
    """
    previous = turn.verdict or {}
    attempt = int(previous.get("attempt", 0)) + 1
    turn._announce(
        EventType.JUDGE_START,
        attempt=attempt,
        answer=answer,
        judges=list(panel.names),
        strategy=panel.strategy,
        threshold=panel.threshold,
    )
    verdict = await panel.evaluate(
        turn.message,
        answer,
        JudgeContext(
            messages=list(turn.history),
            attempt=attempt,
            session_id=turn.session_id,
            run_id=turn.run_id,
        ),
    )
    data = verdict.to_dict()
    data["history"] = [*previous.get("history", []), verdict.score]
    can_retry = attempt < panel.max_retries and turn.iteration < turn.agent.max_iterations
    data["final"] = verdict.passed or not can_retry
    if not verdict.passed and not can_retry:
        data["gave_up"] = "max_retries" if attempt >= panel.max_retries else "max_iterations"
    turn.verdict = data
    await turn._commit([turn._event(EventType.JUDGE_RESULT, data)])
    if data["final"]:
        return False
    correction = panel.correction(verdict)
    message = Message(
        role="user",
        content=correction,
        metadata={
            "judge_correction": True,
            "attempt": attempt,
            "score": verdict.score,
            "threshold": verdict.threshold,
        },
    )
    retry = turn._event(
        EventType.JUDGE_RETRY,
        {
            "attempt": attempt,
            "next_attempt": attempt + 1,
            "score": verdict.score,
            "threshold": verdict.threshold,
            "correction": correction,
        },
    )
    await turn._commit([retry], messages=[message])
    return True

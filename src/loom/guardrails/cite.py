"""``MustCite``: an output guardrail that asks a judge model whether the answer cites sources.

It reuses ``loom.judge.LLMJudge`` (prompt, JSON answer, validation, timeout): the answer trips
when the judge scores it below ``threshold``. An example of a guardrail that calls a model.
"""

from __future__ import annotations

from typing import Any

from loom.guardrails.base import Decision, GuardrailContext
from loom.judge.base import JudgeContext
from loom.judge.llm import LLMJudge

__all__ = ["MustCite"]

CRITERIA = (
    "Every factual claim in the answer names its source: a URL, a document or file name, or "
    "a tool result it came from. An answer with claims and no sources fails (score 0); an "
    "answer whose claims all cite sources passes (score 1)."
)


class MustCite:
    """Trips a final answer that a judge model finds without citations.

    Args:
        model: The judge's ``Model`` or model string.
        threshold: Lowest passing score (0..1).
        criteria: What "cites" means, if not the default.
        timeout: Seconds for the judge; a judge that fails trips the run unless
            ``fatal=False``.
    """

    parallel = False

    def __init__(
        self,
        model: Any,
        *,
        threshold: float = 0.5,
        criteria: str = CRITERIA,
        timeout: float = 60.0,
        fatal: bool = True,
        name: str = "must_cite",
    ) -> None:
        self.judge = LLMJudge(model, criteria, name=name, timeout=timeout)
        self.threshold, self.fatal, self.name = threshold, fatal, name

    async def check_output(self, text: str, ctx: GuardrailContext) -> Decision:
        got = await self.judge.evaluate(
            ctx.user_message,
            text,
            JudgeContext(ctx.messages, session_id=ctx.session_id, run_id=ctx.run_id),
        )
        if got.score >= self.threshold:
            return Decision.allow(got.reason)
        return Decision.trip(
            f"the answer does not cite its sources (score {got.score:g} < "
            f"{self.threshold:g}): {got.reason}"
        )

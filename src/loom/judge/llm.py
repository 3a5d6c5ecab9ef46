"""``LLMJudge``: a model scores an answer against stated criteria and answers in JSON."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loom.errors import ConfigurationError, JudgeOutputError, JudgeTimeout
from loom.judge.base import JudgeContext, Judgement, check_weight
from loom.messages import Message
from loom.models.base import Model, ModelSettings, complete

__all__ = ["JUDGE_SCHEMA", "LLMJudge", "parse_judgement"]


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore")

    score: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    reason: str = Field(min_length=1)


JUDGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "reason": {"type": "string"},
    },
    "required": ["score", "reason"],
    "additionalProperties": False,
}
"""The JSON the judge model must produce; sent as an OpenAI-style ``response_format``."""

SYSTEM_PROMPT = """You are a strict reviewer. You score an assistant's answer against the \
criteria you are given, from 0 (fails them) to 1 (fully meets them). Judge only what the \
criteria ask for. Reply with one JSON object and nothing else: \
{"score": <number from 0 to 1>, "reason": "<one or two sentences naming what is wrong or right>"}"""

_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


def parse_judgement(text: str) -> Judgement:
    """Read ``{"score": 0..1, "reason": "..."}`` from a model's answer (code fences and text
    around the object are tolerated); raise ``JudgeOutputError`` saying what was wrong."""
    found = _OBJECT.search(text or "")
    if found is None:
        raise JudgeOutputError(
            f"the judge model did not answer with a JSON object: {_clip(text)!r}"
        )
    try:
        data = json.loads(found.group(0))
    except json.JSONDecodeError as exc:
        raise JudgeOutputError(
            f"the judge model's JSON does not parse ({exc.msg}): {_clip(found.group(0))!r}"
        ) from None
    try:
        answer = _Answer.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(object)"
        raise JudgeOutputError(
            f"the judge model's JSON is invalid at {where!r}: {err['msg']} "
            f"(got {_clip(found.group(0))!r})"
        ) from None
    return Judgement(answer.score, answer.reason)


def _clip(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[:n] + "..."


class LLMJudge:
    """Asks a model to score answers against ``criteria``.

    Args:
        model: A ``Model`` or a model string (``"openai:gpt-4o-mini"``, ``"local"``, ...).
        criteria: What a good answer does, in plain words ("cites a source", "is polite").
        name: Label in verdicts (default ``"llm"``).
        weight: Weight for the ``weighted`` strategy.
        timeout: Seconds before the judge counts as failing (``JudgeTimeout``).
        settings: Model settings; default temperature 0 and a JSON-schema ``response_format``
            (providers that support constrained decoding enforce it; the answer is validated
            either way).
        include_context: How many of the conversation's last messages (before the answer) to
            show the judge, for criteria such as "uses the tool results".
    """

    def __init__(
        self,
        model: Model | str,
        criteria: str,
        *,
        name: str = "llm",
        weight: float = 1.0,
        timeout: float = 60.0,
        settings: ModelSettings | None = None,
        include_context: int = 0,
    ) -> None:
        if not isinstance(criteria, str) or not criteria.strip():
            raise ConfigurationError(
                "LLMJudge: criteria must be a non-empty string saying what a good answer does"
            )
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigurationError(f"LLMJudge: timeout must be positive seconds, got {timeout!r}")
        if isinstance(model, str):
            from loom.models import resolve_model

            model = resolve_model(model)
        elif not hasattr(model, "stream"):
            raise ConfigurationError(
                f"LLMJudge: model must be a Model or a model string, got {type(model).__name__}"
            )
        self.model = model
        self.criteria = criteria.strip()
        self.name = name
        self.weight = check_weight(weight, f"judge {name!r}")
        self.timeout = float(timeout)
        self.include_context = include_context
        self.settings = settings or ModelSettings(
            temperature=0.0,
            max_tokens=256,
            extra={
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "judgement", "schema": JUDGE_SCHEMA, "strict": True},
                }
            },
        )

    def prompt(self, question: str, answer: str, context: JudgeContext) -> list[Message]:
        """The messages sent to the judge model."""
        parts = [f"Criteria:\n{self.criteria}", f"Question:\n{question}"]
        if self.include_context > 0:
            earlier = [m for m in context.messages if m.role in ("user", "assistant", "tool")]
            shown = earlier[-self.include_context - 1 : -1]
            if shown:
                parts.append(
                    "Conversation before the answer:\n"
                    + "\n".join(f"[{m.role}] {m.content}" for m in shown)
                )
        parts.append(f"Answer to score:\n{answer}")
        parts.append('Reply with {"score": <0..1>, "reason": "..."} only.')
        return [Message.system(SYSTEM_PROMPT), Message.user("\n\n".join(parts))]

    async def evaluate(self, question: str, answer: str, context: JudgeContext) -> Judgement:
        try:
            async with asyncio.timeout(self.timeout):
                response = await complete(
                    self.model, self.prompt(question, answer, context), (), self.settings
                )
        except TimeoutError:
            raise JudgeTimeout(
                f"judge {self.name!r} got no answer from model "
                f"{getattr(self.model, 'name', '?')!r} within "
                f"{self.timeout:g} s"
            ) from None
        return parse_judgement(response.text)

    def __repr__(self) -> str:
        return f"LLMJudge({self.name!r}, model={getattr(self.model, 'name', '?')!r})"

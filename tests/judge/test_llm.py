"""LLMJudge: prompt, constrained JSON, validation of the model's answer, timeouts."""

from __future__ import annotations

import asyncio

import pytest

from loom.errors import ConfigurationError, JudgeOutputError, JudgeTimeout
from loom.judge import JUDGE_SCHEMA, JudgeContext, JudgePanel, LLMJudge, parse_judgement
from loom.messages import Message
from loom.testing import FunctionModel, ScriptedModel


async def test_llm_judge_sends_criteria_question_and_answer_and_parses_json() -> None:
    model = ScriptedModel(['{"score": 0.35, "reason": "does not cite a source"}'])
    judge = LLMJudge(model, "The answer cites a source.", name="cites")
    got = await judge.evaluate("Who wrote Dune?", "Frank Herbert.", JudgeContext())
    assert (got.score, got.reason) == (0.35, "does not cite a source")
    call = model.calls[0]
    assert call.messages[0].role == "system" and "JSON" in call.messages[0].content
    prompt = call.messages[1].content
    assert "The answer cites a source." in prompt
    assert "Who wrote Dune?" in prompt and "Frank Herbert." in prompt
    assert call.tools == []
    fmt = call.settings.extra["response_format"]  # type: ignore[union-attr]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"] == JUDGE_SCHEMA
    assert call.settings.temperature == 0.0  # type: ignore[union-attr]


async def test_include_context_shows_the_conversation_before_the_answer() -> None:
    model = ScriptedModel(['{"score": 1, "reason": "uses the tool result"}'])
    judge = LLMJudge(model, "Uses the tool result.", include_context=2)
    history = [
        Message.user("what time is it?"),
        Message(role="tool", content="12:00"),
        Message.assistant("It is noon."),
    ]
    await judge.evaluate("what time is it?", "It is noon.", JudgeContext(messages=history))
    prompt = model.calls[0].messages[1].content
    assert "[tool] 12:00" in prompt and "[user] what time is it?" in prompt


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ('{"score": 1, "reason": "ok"}', 1.0),
        ('```json\n{"score": 0.5, "reason": "half"}\n```', 0.5),
        ('Here you go: {"score": 0.25, "reason": "weak", "extra": true} thanks', 0.25),
    ],
)
def test_parse_tolerates_fences_and_surrounding_text(text: str, score: float) -> None:
    assert parse_judgement(text).score == score


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("I think it is good", "did not answer with a JSON object"),
        ('{"score": 0.5, "reason": }', "does not parse"),
        ('{"score": 1.7, "reason": "great"}', "invalid at 'score'"),
        ('{"score": -1, "reason": "bad"}', "invalid at 'score'"),
        ('{"score": "high", "reason": "x"}', "invalid at 'score'"),
        ('{"reason": "no score"}', "invalid at 'score'"),
        ('{"score": 0.9}', "invalid at 'reason'"),
        ('{"score": 0.9, "reason": ""}', "invalid at 'reason'"),
        ("", "did not answer with a JSON object"),
    ],
)
def test_bad_judge_output_raises_judge_output_error(text: str, message: str) -> None:
    with pytest.raises(JudgeOutputError, match=message):
        parse_judgement(text)


async def test_bad_output_counts_as_a_failing_judge_in_a_panel() -> None:
    panel = JudgePanel([LLMJudge(ScriptedModel(["Looks great to me!"]), "Is correct.")])
    verdict = await panel.evaluate("q", "a")
    judge = verdict.judges[0]
    assert not verdict.passed and judge.score == 0.0
    assert judge.error is not None and judge.error.startswith("JudgeOutputError")


async def test_a_judge_model_that_times_out_is_reported_and_fails() -> None:
    async def slow(messages: list[Message], tools: list) -> str:
        await asyncio.sleep(10)
        return '{"score": 1, "reason": "late"}'

    judge = LLMJudge(FunctionModel(slow, name="sleepy"), "Is correct.", timeout=0.2)
    with pytest.raises(JudgeTimeout, match=r"no answer from model 'sleepy' within 0\.2 s"):
        await judge.evaluate("q", "a", JudgeContext())
    verdict = await JudgePanel([judge]).evaluate("q", "a")
    assert verdict.judges[0].error is not None and "JudgeTimeout" in verdict.judges[0].error
    assert not verdict.passed


async def test_a_judge_model_that_errors_fails_without_crashing() -> None:
    panel = JudgePanel([LLMJudge(ScriptedModel([]), "Is correct.", name="empty")])
    verdict = await panel.evaluate("q", "a")
    assert verdict.judges[0].error is not None and "ran out of responses" in verdict.judges[0].error


def test_llm_judge_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="criteria must be a non-empty string"):
        LLMJudge(ScriptedModel([]), "  ")
    with pytest.raises(ConfigurationError, match="timeout must be positive"):
        LLMJudge(ScriptedModel([]), "x", timeout=0)
    with pytest.raises(ConfigurationError, match="must be a Model or a model string"):
        LLMJudge(42, "x")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="unknown model provider"):
        LLMJudge("nope:model", "x")

"""Aggregation strategies on fixed scores, failing judges, and panel configuration."""

from __future__ import annotations

import asyncio
import math

import pytest

from loom.errors import ConfigurationError
from loom.judge import FunctionJudge, JudgeContext, Judgement, JudgePanel, aggregate


def fixed(score: float, name: str, weight: float = 1.0) -> FunctionJudge:
    return FunctionJudge(lambda q, a, c: (score, f"{name} says {score}"), name=name, weight=weight)


SCORES = [0.9, 0.2, 0.8, 0.6]  # mean 0.625, median 0.7, min 0.2, max 0.9


@pytest.mark.parametrize(
    ("strategy", "score", "passed"),
    [
        ("mean", 0.625, False),
        ("median", 0.7, True),
        ("min", 0.2, False),
        ("max", 0.9, True),
        ("vote", 0.5, False),  # 2 of 4 at >= 0.7: not more than half
    ],
)
def test_aggregate_strategies_on_fixed_scores(strategy: str, score: float, passed: bool) -> None:
    got, ok = aggregate(strategy, SCORES, 0.7)
    assert got == pytest.approx(score)
    assert ok is passed


def test_weighted_uses_per_judge_weights() -> None:
    # (0.9*3 + 0.2*1) / 4 = 0.725
    got, ok = aggregate("weighted", [0.9, 0.2], 0.7, [3.0, 1.0])
    assert got == pytest.approx(0.725) and ok
    got, ok = aggregate("weighted", [0.9, 0.2], 0.7, [1.0, 3.0])
    assert got == pytest.approx(0.375) and not ok


def test_vote_passes_with_a_strict_majority() -> None:
    assert aggregate("vote", [0.8, 0.7, 0.1], 0.7) == (pytest.approx(2 / 3), True)
    assert aggregate("vote", [0.8, 0.1], 0.7)[1] is False  # a tie is not a majority


def test_threshold_is_inclusive() -> None:
    assert aggregate("mean", [0.7], 0.7)[1] is True
    assert aggregate("mean", [0.69999], 0.7)[1] is False


@pytest.mark.parametrize("strategy", ["mean", "median", "min", "max", "weighted", "vote"])
async def test_panel_reports_each_judge_and_the_aggregate(strategy: str) -> None:
    judges = [fixed(s, f"j{i}", weight=i + 1) for i, s in enumerate(SCORES)]
    panel = JudgePanel(judges, strategy=strategy)  # type: ignore[arg-type]
    verdict = await panel.evaluate("q", "a")
    expected, passed = aggregate(strategy, SCORES, 0.7, [1, 2, 3, 4])
    assert verdict.score == pytest.approx(expected)
    assert verdict.passed is passed
    assert [j.name for j in verdict.judges] == ["j0", "j1", "j2", "j3"]
    assert [j.score for j in verdict.judges] == SCORES
    assert [j.passed for j in verdict.judges] == [True, False, True, False]
    assert verdict.judges[1].reason == "j1 says 0.2"
    assert verdict.to_dict()["judges"][3]["weight"] == 4


async def test_panel_weights_argument_overrides_judge_weights() -> None:
    panel = JudgePanel(
        [fixed(1.0, "a", weight=5), fixed(0.0, "b")], strategy="weighted", weights=[1, 3]
    )
    assert (await panel.evaluate("q", "a")).score == pytest.approx(0.25)


async def test_judges_run_concurrently() -> None:
    async def slow(q: str, a: str, c: JudgeContext) -> float:
        await asyncio.sleep(0.3)
        return 1.0

    panel = JudgePanel([FunctionJudge(slow, name=f"s{i}") for i in range(5)])
    loop = asyncio.get_running_loop()
    started = loop.time()
    verdict = await panel.evaluate("q", "a")
    assert verdict.passed
    assert loop.time() - started < 0.9  # five 0.3 s judges in sequence would take 1.5 s


# -- failing judges -------------------------------------------------------------------------
def boom(q: str, a: str, c: JudgeContext) -> float:
    raise RuntimeError("backend down")


async def test_a_raising_judge_fails_closed_by_default() -> None:
    panel = JudgePanel([fixed(1.0, "good"), FunctionJudge(boom, name="boom")], strategy="min")
    verdict = await panel.evaluate("q", "a")
    bad = verdict.judges[1]
    assert bad.score == 0.0 and not bad.passed
    assert bad.error is not None and "RuntimeError" in bad.error and "backend down" in bad.error
    assert "fail-closed" in bad.reason
    assert verdict.score == 0.0 and not verdict.passed


async def test_fail_open_counts_a_failing_judge_as_passing() -> None:
    panel = JudgePanel(
        [fixed(1.0, "good"), FunctionJudge(boom, name="boom")], strategy="min", fail_open=True
    )
    verdict = await panel.evaluate("q", "a")
    assert verdict.judges[1].score == 1.0 and verdict.judges[1].passed
    assert verdict.judges[1].error is not None
    assert verdict.passed


@pytest.mark.parametrize("bad", [1.5, -0.1, math.nan, math.inf, "high", None])
async def test_out_of_range_or_non_numeric_scores_make_the_judge_fail(bad: object) -> None:
    panel = JudgePanel([FunctionJudge(lambda q, a, c: bad, name="odd")])
    verdict = await panel.evaluate("q", "a")
    judge = verdict.judges[0]
    assert judge.score == 0.0 and not verdict.passed
    assert judge.error is not None and ("outside 0..1" in judge.error or "returned" in judge.error)


async def test_a_judge_that_hangs_times_out_and_fails() -> None:
    async def hang(q: str, a: str, c: JudgeContext) -> float:
        await asyncio.sleep(30)
        return 1.0

    panel = JudgePanel([fixed(1.0, "ok"), FunctionJudge(hang, name="hang")], timeout=0.2)
    verdict = await panel.evaluate("q", "a")
    assert (
        verdict.judges[1].error is not None and "timed out after 0.2 s" in verdict.judges[1].error
    )
    assert verdict.score == pytest.approx(0.5) and not verdict.passed


async def test_judgement_and_bool_results_are_accepted() -> None:
    panel = JudgePanel(
        [
            FunctionJudge(lambda q, a, c: Judgement(0.8, "fine"), name="j"),
            FunctionJudge(lambda q, a, c: True, name="b"),
            FunctionJudge(lambda q, a, c: (False, "no source cited"), name="t"),
        ]
    )
    verdict = await panel.evaluate("q", "a")
    assert [(j.score, j.reason) for j in verdict.judges] == [
        (0.8, "fine"),
        (1.0, ""),
        (0.0, "no source cited"),
    ]


def test_correction_quotes_the_failing_judges_reasons() -> None:
    panel = JudgePanel([fixed(0.9, "style"), fixed(0.1, "facts")])
    verdict = asyncio.run(panel.evaluate("q", "a"))
    text = panel.correction(verdict)
    assert "facts (score 0.10): facts says 0.1" in text
    assert "style" not in text  # only the judges that failed are quoted
    assert "0.50" in text and "0.70" in text


# -- configuration ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"strategy": "average"}, "unknown judge strategy 'average'"),
        ({"threshold": 1.5}, "threshold must be a number from 0 to 1"),
        ({"threshold": -0.1}, "threshold must be a number from 0 to 1"),
        ({"max_retries": 0}, "max_retries must be an integer from 1 to 10"),
        ({"max_retries": 11}, "max_retries must be an integer from 1 to 10"),
        ({"max_retries": 2.5}, "max_retries must be an integer from 1 to 10"),
        ({"weights": [1, 2]}, "2 weights for 1 judges"),
        ({"weights": [0]}, "weight must be a positive number"),
        ({"timeout": 0}, "timeout must be positive"),
    ],
)
def test_bad_panel_configuration_is_a_configuration_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        JudgePanel([fixed(1.0, "j")], **kwargs)


def test_a_panel_needs_judges() -> None:
    with pytest.raises(ConfigurationError, match="at least one judge"):
        JudgePanel([])
    with pytest.raises(ConfigurationError, match="is not a judge"):
        JudgePanel([object()])  # type: ignore[list-item]


def test_defaults_follow_the_seed() -> None:
    panel = JudgePanel([fixed(1.0, "j")])
    assert (panel.strategy, panel.threshold, panel.max_retries, panel.fail_open) == (
        "mean",
        0.7,
        3,
        False,
    )


def test_duplicate_judge_names_are_made_unique() -> None:
    panel = JudgePanel([fixed(1.0, "j"), fixed(1.0, "j")])
    assert panel.names == ["j", "j#2"]

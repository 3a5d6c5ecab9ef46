"""Online evaluation (``loom.evals.online``): a deterministic sample of finished runs scored by
assertions and judge panels in a background job, once per run, off the turn path; a judge
that is down marks the run errored and is retried, a bounded number of times."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from loom import Agent, Message
from loom.engine.runtime import Runtime
from loom.errors import ConfigurationError, ModelUnavailable
from loom.evals.online import (
    ONLINE_NS,
    OnlineEvaluator,
    OnlineSettings,
    online_score,
    sampled,
    settings_from_env,
)
from loom.observability import OtelObserver
from loom.schedule import MaintenanceSettings, builtin_jobs
from loom.schedule.monitors import MonitorStore
from loom.schedule.storage import ScheduleStore
from loom.store import SQLiteStore
from loom.testing import FunctionModel


def echo(messages: list[Message], tools: Any) -> str:
    return "echo: " + messages[-1].content


def judge_says(score: float) -> FunctionModel:
    return FunctionModel(lambda m, t: json.dumps({"score": score, "reason": "seen"}), name="judge")


class Rig:
    def __init__(self, store: SQLiteStore, runtime: Runtime) -> None:
        self.store = store
        self.runtime = runtime
        self.agent = Agent(name="echo", model=FunctionModel(echo))

    async def turn(self, text: str, session: str = "s1") -> str:
        result = await self.runtime.run(self.agent, text, session_id=session)
        assert result.stop_reason == "completed"
        return result.run_id


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    store = SQLiteStore(tmp_path / "loom.db")
    runtime = Runtime(store=store)
    yield Rig(store, runtime)
    await runtime.aclose()
    await store.close()


def test_sampling_is_deterministic_and_near_the_rate() -> None:
    ids = [f"run_{i:05d}" for i in range(4000)]
    picked = [i for i in ids if sampled(i, 0.1)]
    assert picked == [i for i in ids if sampled(i, 0.1)]  # every process agrees
    assert 320 < len(picked) < 480
    assert all(sampled(i, 1.0) for i in ids[:50])
    assert not any(sampled(i, 0.0) for i in ids[:50])


async def test_sampled_runs_are_scored_once_with_assertions_and_a_rubric(rig: Rig) -> None:
    runs = [await rig.turn(f"question {i}") for i in range(3)]
    calls: list[str] = []

    def judge(messages: list[Message], tools: Any) -> str:
        calls.append(messages[-1].content)
        return json.dumps({"score": 0.9, "reason": "polite"})

    settings = OnlineSettings.from_mapping(
        {
            "sample": 1.0,
            "evaluators": [
                {"stop_reason": "completed"},
                {"model_calls": {"max": 1}},
                {"not_called": "delete_account"},
                {"rubric": "The answer is polite.", "judge_model": FunctionModel(judge)},
            ],
        }
    )
    evaluator = OnlineEvaluator(rig.store, settings)
    report = await evaluator.run()
    assert report.scored == 3 and report.errored == 0
    for run_id in runs:
        record = await online_score(rig.store, run_id)
        assert record is not None
        assert record["status"] == "scored" and record["passed"] is True
        assert record["score"] == pytest.approx((1 + 1 + 1 + 0.9) / 4)
        assert [c["name"] for c in record["checks"]] == [
            "stop_reason",
            "model_calls",
            "not_called",
            "rubric",
        ]
    assert len(calls) == 3
    # a second run (a retry, another process's tick, a restart) scores nothing again
    again = await OnlineEvaluator(rig.store, settings).run()
    assert again.scored == 0 and len(calls) == 3
    # a new turn is picked up, and only it
    newer = await rig.turn("one more")
    third = await evaluator.run()
    assert third.scored == 1 and len(calls) == 4
    assert (await online_score(rig.store, newer)) is not None


async def test_only_the_sample_and_the_named_agents_are_scored(rig: Rig) -> None:
    runs = [await rig.turn(f"q{i}", session=f"s{i}") for i in range(40)]
    settings = OnlineSettings.from_mapping(
        {"sample": 0.3, "evaluators": [{"stop_reason": "completed"}]}
    )
    report = await OnlineEvaluator(rig.store, settings).run()
    scored = {r for r in runs if await online_score(rig.store, r) is not None}
    assert scored == {r for r in runs if sampled(r, 0.3)}
    assert report.scored == len(scored) and report.skipped == 40 - len(scored)
    other = OnlineSettings.from_mapping(
        {"sample": 1.0, "agents": ["someone_else"], "evaluators": [{"tokens": {"max": 10**6}}]}
    )
    assert (await OnlineEvaluator(rig.store, other).run()).scored == 0


async def test_an_experiments_case_runs_are_left_to_the_experiment(rig: Rig) -> None:
    from loom.evals import parse_dataset, run_experiment

    dataset = parse_dataset("cases:\n  - {id: one, input: hi, script: [hello]}\n")
    experiment = await run_experiment(dataset, rig.agent, store=rig.store)
    live = await rig.turn("a live turn")
    settings = OnlineSettings.from_mapping(
        {"sample": 1.0, "evaluators": [{"stop_reason": "completed"}]}
    )
    report = await OnlineEvaluator(rig.store, settings).run()
    assert report.scored == 1 and await online_score(rig.store, live) is not None
    assert await online_score(rig.store, experiment.results[0].run_id) is None


async def test_a_turn_completes_while_the_judge_is_blocked(rig: Rig) -> None:
    """The evaluation runs in the job, never in the turn: a judge stuck on its model does not
    hold up a turn of the same session."""
    first = await rig.turn("first")
    judging = asyncio.Event()
    release = asyncio.Event()

    async def blocked(messages: list[Message], tools: Any) -> str:
        judging.set()
        await release.wait()
        return json.dumps({"score": 1, "reason": "fine"})

    settings = OnlineSettings.from_mapping(
        {
            "sample": 1.0,
            "evaluators": [{"rubric": "fine", "judge_model": FunctionModel(blocked)}],
        }
    )
    job = asyncio.create_task(OnlineEvaluator(rig.store, settings).run())
    await judging.wait()
    second = await asyncio.wait_for(rig.turn("second"), timeout=30)  # completes meanwhile
    assert second != first and not job.done()
    assert await online_score(rig.store, first) is None  # not scored yet: the judge is blocked
    release.set()
    report = await job
    assert report.scored >= 1
    assert (await online_score(rig.store, first))["status"] == "scored"  # type: ignore[index]


async def test_a_judge_that_is_down_errors_the_run_and_is_retried_bounded(rig: Rig) -> None:
    run_id = await rig.turn("hello")
    state = {"up": False, "calls": 0}

    def judge(messages: list[Message], tools: Any) -> str:
        state["calls"] += 1
        if not state["up"]:
            raise ModelUnavailable("connection refused")
        return json.dumps({"score": 1, "reason": "fine"})

    settings = OnlineSettings.from_mapping(
        {
            "sample": 1.0,
            "attempts": 3,
            "evaluators": [
                {"stop_reason": "completed"},
                {"rubric": "fine", "judge_model": FunctionModel(judge)},
            ],
        }
    )
    evaluator = OnlineEvaluator(rig.store, settings)
    first = await evaluator.run()
    record = await online_score(rig.store, run_id)
    assert first.errored == 1 and first.scored == 0
    assert record is not None and record["status"] == "errored" and record["attempts"] == 1
    assert "connection refused" in record["error"] and record["score"] is None
    state["up"] = True  # the model is back: the next run retries and scores it
    second = await evaluator.run()
    assert second.scored == 1
    record = await online_score(rig.store, run_id)
    assert record is not None and record["status"] == "scored" and record["attempts"] == 2

    # down for good: tried `attempts` times, then left alone
    other = await rig.turn("again", session="s2")
    state["up"] = False
    for _ in range(5):
        await evaluator.run()
    record = await online_score(rig.store, other)
    assert record is not None and record["status"] == "gave_up" and record["attempts"] == 3
    before = state["calls"]
    await evaluator.run()
    assert state["calls"] == before


async def test_the_score_is_a_loom_eval_span_in_the_runs_trace(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    store = SQLiteStore(tmp_path / "loom.db")
    runtime = Runtime(store=store, observers=[OtelObserver(tracer_provider=provider)])
    try:
        agent = Agent(name="echo", model=FunctionModel(echo))
        result = await runtime.run(agent, "hi", session_id="s1")
        settings = OnlineSettings.from_mapping(
            {
                "sample": 1.0,
                "evaluators": [
                    {"stop_reason": "completed"},
                    {"rubric": "fine", "judge_model": judge_says(0.5)},
                ],
            }
        )
        await OnlineEvaluator(store, settings, tracer_provider=provider).run()
    finally:
        await runtime.aclose()
        await store.close()
    spans = exporter.get_finished_spans()
    run_span = next(s for s in spans if s.name.startswith("invoke_agent"))
    evals = [s for s in spans if s.name == "loom.eval"]
    assert len(evals) == 1
    span = evals[0]
    assert span.attributes is not None and run_span.context is not None
    assert span.context is not None
    assert span.context.trace_id == run_span.context.trace_id
    assert span.parent is not None and span.parent.span_id == run_span.context.span_id
    assert [link.context.span_id for link in span.links] == [run_span.context.span_id]
    assert span.attributes["loom.run_id"] == result.run_id
    assert span.attributes["loom.eval.status"] == "scored"
    assert span.attributes["loom.eval.score"] == pytest.approx(0.75)
    assert span.attributes["loom.eval.passed"] is False  # the rubric's 0.5 is under 0.7
    assert span.attributes["loom.eval.rubric.score"] == pytest.approx(0.5)


async def test_the_job_is_registered_from_settings_and_env(rig: Rig, tmp_path: Path) -> None:
    schedules = ScheduleStore(rig.store)
    monitors = MonitorStore(rig.store)
    online = OnlineSettings.from_mapping(
        {"sample": 0.5, "every": 120, "evaluators": [{"stop_reason": "completed"}]}
    )
    jobs = builtin_jobs(rig.store, schedules, monitors, MaintenanceSettings(online=online))
    job = next(j for j in jobs if j.name == "evaluate")
    assert job.every == 120
    run_id = await rig.turn("hi")
    summary = await job.run()
    assert summary["scored"] + summary["skipped"] == 1
    assert (await online_score(rig.store, run_id) is not None) == sampled(run_id, 0.5)
    assert "evaluate" not in {j.name for j in builtin_jobs(rig.store, schedules, monitors)}

    file = tmp_path / "online.yaml"
    file.write_text("online:\n  sample: 0.1\n  evaluators:\n    - {cost: {max: 0.01}}\n")
    from_env = settings_from_env({"LOOM_EVAL_ONLINE": str(file)})
    assert from_env is not None and from_env.sample == 0.1
    file.write_text("sample: 0.1\nevaluators:\n  - {called: add}\n")
    with pytest.raises(ConfigurationError, match=r"LOOM_EVAL_ONLINE.*'called' needs a dataset"):
        settings_from_env({"LOOM_EVAL_ONLINE": str(file)})


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"evaluators": [{"stop_reason": "completed"}]}, "sample"),
        ({"sample": 2, "evaluators": [{"stop_reason": "completed"}]}, "from 0 to 1"),
        ({"sample": 0.1, "evaluators": []}, "at least one evaluator"),
        ({"sample": 0.1, "evaluators": [{"rubric": "x"}]}, "judge_model"),
        ({"sample": 0.1, "evaluators": [{"tokens": {"maximum": 3}}]}, "online.evaluators"),
        ({"sample": 0.1, "rate": 1, "evaluators": [{"cost": {"max": 1}}]}, "unknown field"),
    ],
)
def test_bad_settings_say_what_is_wrong(data: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        OnlineSettings.from_mapping(data)


def test_the_record_namespace_is_documented() -> None:
    assert ONLINE_NS == "loom.evals.online"


AGENT_FILE = """\
---
name: helper
model: demo
online:
  sample: 1.0
  evaluators:
    - {stop_reason: completed}
    - {tokens: {max: 100000}}
---
You help.
"""


async def test_an_agent_files_online_block_scores_its_runs(rig: Rig, tmp_path: Path) -> None:
    from loom.errors import AgentDefinitionError

    path = tmp_path / "helper.md"
    path.write_text(AGENT_FILE)
    helper = Agent.from_file(path)
    mine = (await rig.runtime.run(helper, "hello", session_id="h1")).run_id
    other = await rig.turn("not helper's")  # the echo agent: no settings, not scored
    jobs = builtin_jobs(
        rig.store,
        ScheduleStore(rig.store),
        MonitorStore(rig.store),
        agents={"helper": helper, "echo": rig.agent},
    )
    job = next(j for j in jobs if j.name == "evaluate")
    summary = await job.run()
    assert summary["scored"] == 1
    record = await online_score(rig.store, mine)
    assert record is not None and [c["name"] for c in record["checks"]] == ["stop_reason", "tokens"]
    assert await online_score(rig.store, other) is None

    path.write_text(AGENT_FILE.replace("sample: 1.0", "sample: 7"))
    with pytest.raises(AgentDefinitionError, match=r"online.*from 0 to 1"):
        Agent.from_file(path)

"""The judge step in the loop: retry with a correction, events, verdict, persistence."""

from __future__ import annotations

from typing import Any

from loom import Agent, EventType, ModelResponse, ToolCall, tool
from loom.judge import FunctionJudge, JudgeContext, JudgePanel
from loom.store.memory import MemoryStore
from loom.testing import ScriptedModel

E = EventType
seen: list[tuple[str, str, JudgeContext]] = []


def mentions_paris(q: str, a: str, ctx: JudgeContext) -> tuple[float, str]:
    seen.append((q, a, ctx))
    if "Paris" in a:
        return 1.0, "names the capital"
    return 0.0, "the answer must name the capital of France"


def agent_with(model: ScriptedModel, max_retries: int = 3, **kw: Any) -> Agent:
    panel = JudgePanel([FunctionJudge(mentions_paris, name="capital")], max_retries=max_retries)
    return Agent("geo", "You answer geography questions.", model=model, judges=panel, **kw)


async def run_events(agent: Agent, message: str, **kw: Any) -> list:
    return [e async for e in agent.stream(message, **kw)]


async def test_a_passing_answer_is_judged_once() -> None:
    model = ScriptedModel(["Paris."])
    agent = agent_with(model)
    result = await agent.run("Capital of France?")
    assert result.output == "Paris." and len(model.calls) == 1
    assert result.verdict is not None
    assert result.verdict["passed"] is True and result.verdict["attempt"] == 1
    assert result.verdict["judges"][0]["reason"] == "names the capital"


async def test_a_failing_answer_is_retried_with_a_correction_quoting_the_reasons() -> None:
    seen.clear()
    model = ScriptedModel(["Lyon.", "Paris."])
    store = MemoryStore()
    agent = agent_with(model, store=store)
    events = await run_events(agent, "Capital of France?", session_id="s")
    result_types = [e.type for e in events if e.type.name.startswith("JUDGE")]
    assert result_types == [
        E.JUDGE_START,
        E.JUDGE_RESULT,
        E.JUDGE_RETRY,
        E.JUDGE_START,
        E.JUDGE_RESULT,
    ]

    # What the model was sent the second time: the first answer, then the correction.
    second = model.calls[1].messages
    assert [m.role for m in second[-3:]] == ["user", "assistant", "user"]
    assert second[-2].content == "Lyon."
    correction = second[-1]
    assert "the answer must name the capital of France" in correction.content
    assert "capital (score 0.00)" in correction.content
    assert correction.metadata["judge_correction"] is True and correction.metadata["attempt"] == 1

    # The judge saw the question, each answer and the attempt number.
    assert [(q, a, c.attempt) for q, a, c in seen] == [
        ("Capital of France?", "Lyon.", 1),
        ("Capital of France?", "Paris.", 2),
    ]
    assert seen[0][2].messages[-1].content == "Lyon."

    finish = events[-1]
    assert finish.type is E.AGENT_FINISH and finish.data["output"] == "Paris."
    assert finish.data["iterations"] == 2  # the retry is a loop iteration

    # Persisted: the correction message, the JUDGE_RESULT events and the run's verdict.
    stored = await store.load_messages("s")
    assert [m.role for m in stored] == ["user", "assistant", "user", "assistant"]
    assert stored[2].metadata["judge_correction"] is True
    journal = await store.load_events("s")
    results = [e.data for e in journal if e.type is E.JUDGE_RESULT]
    assert [(r["attempt"], r["passed"], r["score"]) for r in results] == [
        (1, False, 0.0),
        (2, True, 1.0),
    ]
    assert any(e.type is E.JUDGE_RETRY for e in journal)
    run = (await store.list_runs("s"))[-1]
    assert run.status == "completed"
    assert run.data["verdict"]["passed"] is True and run.data["verdict"]["history"] == [0.0, 1.0]


async def test_after_the_last_attempt_the_last_answer_is_returned_with_its_scores() -> None:
    model = ScriptedModel(["Lyon.", "Nice.", "Marseille.", "never asked"])
    result = await agent_with(model, max_retries=3).run("Capital of France?")
    assert len(model.calls) == 3
    assert result.output == "Marseille." and result.stop_reason == "completed"
    v = result.verdict
    assert v is not None
    assert (v["passed"], v["attempt"], v["max_retries"], v["gave_up"]) == (
        False,
        3,
        3,
        "max_retries",
    )
    assert v["history"] == [0.0, 0.0, 0.0] and v["judges"][0]["score"] == 0.0
    corrections = [m for m in result.messages if m.metadata.get("judge_correction")]
    assert len(corrections) == 2  # no correction after the last attempt


async def test_max_retries_one_means_no_retry() -> None:
    model = ScriptedModel(["Lyon.", "Paris."])
    result = await agent_with(model, max_retries=1).run("Capital of France?")
    assert len(model.calls) == 1 and result.output == "Lyon."
    assert result.verdict is not None and result.verdict["gave_up"] == "max_retries"


async def test_retries_stop_at_the_agents_iteration_limit() -> None:
    model = ScriptedModel(["Lyon.", "Nice.", "Paris."])
    result = await agent_with(model, max_retries=10, max_iterations=2).run("Capital of France?")
    assert len(model.calls) == 2 and result.output == "Nice."
    assert result.verdict is not None and result.verdict["gave_up"] == "max_iterations"
    assert result.stop_reason == "completed"


async def test_a_raising_judge_never_crashes_the_run() -> None:
    def broken(q: str, a: str, c: JudgeContext) -> float:
        raise ValueError("judge bug")

    model = ScriptedModel(["first", "second"])
    panel = JudgePanel([FunctionJudge(broken, name="broken")], max_retries=2)
    result = await Agent("a", "x", model=model, judges=panel).run("hi")
    assert result.stop_reason == "completed" and result.output == "second"
    assert result.verdict is not None
    assert "ValueError: judge bug" in result.verdict["judges"][0]["error"]
    # The correction tells the model what the failing judge reported.
    assert "judge bug" in model.calls[1].messages[-1].content


async def test_only_final_answers_are_judged_and_retries_may_use_tools() -> None:
    @tool
    def capital(country: str) -> str:
        """Look up a capital."""
        return {"France": "Paris"}.get(country, "unknown")

    model = ScriptedModel(
        [
            "Probably Lyon.",
            ModelResponse(tool_calls=[ToolCall(name="capital", arguments={"country": "France"})]),
            "It is Paris.",
        ]
    )
    agent = agent_with(model, tools=[capital])
    events = await run_events(agent, "Capital of France?")
    types = [e.type for e in events]
    assert types.count(E.JUDGE_START) == 2 and types.count(E.JUDGE_RETRY) == 1
    # The tool ran between the retry and the second judgement.
    assert types.index(E.TOOL_RESULT) > types.index(E.JUDGE_RETRY)
    assert events[-1].data["output"] == "It is Paris."


async def test_without_judges_nothing_changes() -> None:
    model = ScriptedModel(["Lyon."])
    events = await run_events(Agent("a", "x", model=model), "hi")
    assert not any(e.type.name.startswith("JUDGE") for e in events)
    result = await Agent("a", "x", model=ScriptedModel(["Lyon."])).run("hi")
    assert result.verdict is None


async def test_judges_may_be_given_as_a_list() -> None:
    model = ScriptedModel(["Paris"])
    agent = Agent("a", "x", model=model, judges=[FunctionJudge(mentions_paris)])
    assert agent.judges is not None and agent.judges.strategy == "mean"
    assert (await agent.run("q")).verdict["passed"]  # type: ignore[index]

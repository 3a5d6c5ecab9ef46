"""Experiments in process: trajectory assertions read from the journal, expected answers, judge
panels (a judge whose model is down marks the case errored), per-run model overrides, typed
errors before anything runs, stored results and resume."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from loom import Agent, ModelResponse, ToolCall
from loom.errors import ConfigurationError, InputError, ModelUnavailable
from loom.evals import (
    Dataset,
    UnknownCaseTool,
    list_experiments,
    load_experiment,
    parse_dataset,
    run_experiment,
)
from loom.evals.report import compare
from loom.guardrails import Decision, tool_call_guardrail
from loom.messages import Message, ToolSpec
from loom.store.memory import MemoryStore
from loom.store.sqlite import SQLiteStore
from loom.testing import FunctionModel, ScriptedModel


class Sum(BaseModel):
    total: int


def dataset(text: str) -> Dataset:
    return parse_dataset(text, "test.yaml")


CALC = dataset(
    """
name: calc
cases:
  - id: add
    input: what is 2 + 3?
    script: [{tool: add, arguments: {a: 2, b: 3}}, "5"]
    expected: {text: "5"}
    assertions:
      - called: {name: add, arguments: {a: 2}, arguments_regex: '"b": 3'}
      - not_called: multiply
      - called_in_order: [add]
      - called_any_order: [add]
      - calls_at_most: {tool: add, times: 1}
      - effects: {at_most_once: 0}
      - model_calls: {min: 2, max: 2}
      - tokens: {max: 0}
      - duration: {max: 60}
      - guardrail: {tripped: false}
      - stop_reason: completed
  - id: wrong-tool
    input: what is 2 * 3?
    script: [{tool: add, arguments: {a: 2, b: 3}}, "5"]
    assertions:
      - called: multiply
      - called_in_order: [multiply, add]
      - not_called: add
      - model_calls: {max: 1}
"""
)


def calc_agent(**kw: Any) -> Agent:
    return Agent("calc", "You add.", model="demo", tools=["add", "multiply"], **kw)


async def test_assertions_read_the_runs_journal_and_say_what_they_saw() -> None:
    store = MemoryStore()
    exp = await run_experiment(CALC, calc_agent(), store=store)
    by_id = {r.case_id: r for r in exp.results}
    good, bad = by_id["add"], by_id["wrong-tool"]
    assert good.status == "passed" and good.score == 1.0, good.checks
    assert bad.status == "failed" and bad.score == 0.0
    messages = [c["message"] for c in bad.checks]
    assert messages[0] == "expected a call of multiply; the run called add"
    assert "multiply did not follow" in messages[1]
    assert messages[2] == "expected no call of add; it was called 1 time(s)"
    assert messages[3] == "model_calls 2, wanted <= 1"
    assert bad.trajectory["tool_calls"] == [
        {"name": "add", "arguments": {"a": 2, "b": 3}, "effect": "pure"}
    ]
    assert exp.record.passed == 1 and exp.record.failed == 1 and exp.record.score == 0.5
    assert exp.record.status == "finished" and exp.ran == 2


async def test_a_tripped_guardrail_and_an_at_most_once_effect_are_seen() -> None:
    from loom import tool

    @tool(effect="at_most_once")
    def pay(amount: int) -> str:
        """Pay."""
        return "paid"

    @tool_call_guardrail
    def no_big_payments(call: ToolCall, ctx: Any) -> Decision:
        if call.arguments.get("amount", 0) > 100:
            return Decision.trip("too much")
        return Decision.allow()

    agent = Agent("payer", "Pay.", model="demo", tools=[pay], guardrails=[no_big_payments])
    data = dataset(
        """
cases:
  - id: pays-twice
    input: pay
    script:
      - {tool: pay, arguments: {amount: 5}}
      - {tool: pay, arguments: {amount: 7}}
      - {tool: pay, arguments: {amount: 500}}
    assertions:
      - guardrail: {name: no_big_payments, kind: tool_call, tripped: true}
      - effects: {at_most_once: 1}
      - stop_reason: guardrail
"""
    )
    exp = await run_experiment(data, agent, store=MemoryStore())
    (result,) = exp.results
    checks = {c["name"]: c for c in result.checks}
    assert checks["guardrail"]["passed"], checks
    assert not checks["effects"]["passed"]
    assert checks["stop_reason"]["passed"]  # the trip ended the run; its call never ran
    assert "2 call(s) of at_most_once tools (pay, pay)" in checks["effects"]["message"]


async def test_a_case_naming_a_tool_the_agent_lacks_fails_before_anything_runs() -> None:
    calls: list[int] = []

    def model(messages: list[Message], tools: list[ToolSpec]) -> str:
        calls.append(1)
        return "hi"

    agent = Agent("calc", "x", model=FunctionModel(model), tools=["add"])
    store = MemoryStore()
    with pytest.raises(UnknownCaseTool, match="'multiply', which agent 'calc' does not have"):
        await run_experiment(CALC, agent, store=store)
    assert calls == [] and await list_experiments(store) == []
    # a tool the case adds for its run (RunOptions.extra_tools) is the agent's for that run
    data = dataset(
        """
cases:
  - id: a
    input: "2 + 3"
    tools: [multiply]
    script: [{tool: multiply, arguments: {a: 2, b: 3}}, "6"]
    assertions: [{called: multiply}]
"""
    )
    exp = await run_experiment(data, agent, store=store)
    assert exp.results[0].status == "passed" and "multiply" not in agent.tools


async def test_the_model_is_overridden_per_run_and_the_agent_stays_as_built() -> None:
    seen: list[str] = []

    def counting(messages: list[Message], tools: list[ToolSpec]) -> str:
        seen.append("agent's model")
        return "mine"

    agent = calc_agent().replace(model=FunctionModel(counting))
    data = dataset("cases:\n  - {id: a, input: 2 + 3, expected: {contains: 'add returned: 5'}}\n")
    exp = await run_experiment(data, agent, store=MemoryStore(), model="demo")
    assert exp.results[0].status == "passed" and seen == []
    assert exp.record.model == "demo"
    exp = await run_experiment(data, agent, store=MemoryStore(), model="test")
    assert exp.results[0].trajectory["tool_calls"][0]["name"] in {"add", "multiply"}
    exp = await run_experiment(data, agent, store=MemoryStore())
    assert seen == ["agent's model"] and exp.results[0].status == "failed"


@pytest.mark.parametrize(
    ("expected", "answer", "ok"),
    [
        ({"json_schema": {"type": "object", "required": ["total"]}}, '{"total": 5}', True),
        ({"json_schema": {"type": "object", "required": ["total"]}}, '{"sum": 5}', False),
        ({"json_schema": {"type": "object"}}, "not json", False),
        ({"type": "tests.evals.test_experiment:Sum"}, '{"total": 5}', True),
        ({"type": "tests.evals.test_experiment:Sum"}, '{"total": "five"}', False),
        ({"contains": "5"}, "it is 5", True),
        ({"text": "5"}, " 5 ", True),
        ({"text": "5"}, "6", False),
    ],
)
async def test_expected_answers(expected: dict[str, Any], answer: str, ok: bool) -> None:
    case = {"id": "a", "input": "q", "script": [answer], "expected": expected}
    data = Dataset.model_validate({"cases": [case]})
    exp = await run_experiment(data, calc_agent(), store=MemoryStore())
    assert (exp.results[0].status == "passed") is ok, exp.results[0].checks


async def test_an_expected_type_that_does_not_import_is_an_error_before_running() -> None:
    data = Dataset.model_validate(
        {"cases": [{"id": "a", "input": "q", "expected": {"type": "nowhere:Nothing"}}]}
    )
    with pytest.raises(Exception, match="does not import"):
        await run_experiment(data, calc_agent(), store=MemoryStore())


RUBRIC = dataset(
    """
cases:
  - id: judged
    input: q
    script: ["a fine answer"]
    expected: {rubric: [is fine, is short], strategy: min, threshold: 0.5}
"""
)


async def test_a_rubric_is_scored_by_a_judge_panel() -> None:
    def judge(messages: list[Message], tools: list[ToolSpec]) -> str:
        short = "is short" in messages[-1].content
        return json.dumps({"score": 0.6 if short else 0.9, "reason": "ok"})

    exp = await run_experiment(
        RUBRIC, calc_agent(), store=MemoryStore(), judge_model=FunctionModel(judge)
    )
    (result,) = exp.results
    assert result.status == "passed" and result.score == 0.6  # strategy min
    assert result.checks[0]["details"]["strategy"] == "min"


async def test_a_judge_whose_model_is_down_marks_the_case_errored_not_failed() -> None:
    def down(messages: list[Message], tools: list[ToolSpec]) -> str:
        raise ModelUnavailable("the judge's server is down")

    exp = await run_experiment(
        RUBRIC, calc_agent(), store=MemoryStore(), judge_model=FunctionModel(down)
    )
    (result,) = exp.results
    assert result.status == "errored", result
    assert "server is down" in result.checks[0]["message"]
    assert exp.record.errored == 1 and exp.record.failed == 0


async def test_a_rubric_without_a_judge_model_is_an_error_before_running() -> None:
    with pytest.raises(ConfigurationError, match="judge model"):
        await run_experiment(RUBRIC, calc_agent(), store=MemoryStore())


async def test_a_model_that_is_down_for_the_agent_marks_the_case_errored() -> None:
    def down(messages: list[Message], tools: list[ToolSpec]) -> str:
        raise ModelUnavailable("down")

    data = dataset("cases:\n  - {id: a, input: q, expected: {text: x}}\n")
    agent = calc_agent().replace(model=FunctionModel(down))
    exp = await run_experiment(data, agent, store=MemoryStore())
    assert exp.results[0].status == "errored"


async def test_a_case_continues_a_stored_session_from_a_checkpoint(tmp_path: Any) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    model = ScriptedModel(["first answer", "second answer"])
    agent = calc_agent(store=store).replace(model=model)
    await agent.run("one", session_id="s1")
    await agent.run("two", session_id="s1")
    seen: list[list[str]] = []

    def look(messages: list[Message], tools: list[ToolSpec]) -> str:
        seen.append([m.content for m in messages if m.role in ("user", "assistant")])
        return "continued"

    data = dataset("cases:\n  - {id: a, input: {session: s1, checkpoint: 1, message: three}}\n")
    exp = await run_experiment(data, agent.replace(model=FunctionModel(look)), store=store)
    assert exp.results[0].status == "passed", exp.results[0]
    assert seen == [["one", "first answer", "three"]]
    # the stored session is untouched: the case ran in a fork
    assert [m.content for m in await store.load_messages("s1") if m.role == "user"] == [
        "one",
        "two",
    ]
    await store.close()


async def test_results_are_stored_and_an_unfinished_experiment_resumes(tmp_path: Any) -> None:
    store = SQLiteStore(tmp_path / "e.db")
    calls: list[str] = []

    def model(messages: list[Message], tools: list[ToolSpec]) -> str:
        calls.append(messages[-1].content)
        return "ok"

    agent = calc_agent().replace(model=FunctionModel(model))
    data = dataset("cases:\n" + "".join(f"  - {{id: c{i}, input: q{i}}}\n" for i in range(4)))
    first = await run_experiment(data, agent, store=store, concurrency=1, max_cost=0.0)
    assert first.record.status == "budget_exhausted" and first.ran == 0  # budget 0: none ran
    stored = await load_experiment(store, first.record.id)
    assert stored.results == []
    second = await run_experiment(data, agent, store=store, concurrency=2)
    assert second.record.id == first.record.id and second.ran == 4
    assert second.record.status == "finished" and sorted(calls) == ["q0", "q1", "q2", "q3"]
    with pytest.raises(InputError, match="another dataset, agent revision or model"):
        await run_experiment(data, agent, store=store, resume=first.record.id, model="demo")
    third = await run_experiment(data, agent, store=store)  # finished: a new experiment
    assert third.record.id != first.record.id
    assert [r.case_id for r in (await load_experiment(store, first.record.id)).results] == [
        "c0",
        "c1",
        "c2",
        "c3",
    ]
    rows = compare(second, third)
    assert [r.change for r in rows] == ["same"] * 4
    await store.close()


async def test_compare_says_better_worse_and_same() -> None:
    store = MemoryStore()
    script = ScriptedModel(
        [ModelResponse(tool_calls=[ToolCall(name="multiply", arguments={"a": 2, "b": 3})]), "6"]
    )
    good = Agent("calc", "x", model=script, tools=["add", "multiply"])
    data = dataset(
        """
cases:
  - {id: m, input: 2 * 3, assertions: [{called: multiply}]}
  - {id: n, input: hi, script: ["hello"]}
"""
    )
    a = await run_experiment(data, calc_agent(), store=store, model="demo")
    b = await run_experiment(data, good, store=store)
    rows = {r.case_id: r for r in compare(a, b)}
    assert rows["m"].change == "better" and rows["m"].delta == 1.0
    assert rows["n"].change == "same"
    assert {r.case_id: r.change for r in compare(b, a)}["m"] == "worse"


async def test_max_cost_stops_starting_cases_and_a_resume_finishes_them() -> None:
    from loom.messages import Usage

    def priced(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        usage = Usage(input_tokens=1_000_000, output_tokens=0, requests=1)
        return ModelResponse(text="ok", usage=usage)

    agent = calc_agent().replace(model=FunctionModel(priced, name="openai:gpt-4o-mini"))
    data = dataset(
        """
cases:
  - {id: a, input: q, assertions: [{cost: {min: 0.1, max: 0.2}}]}
  - {id: b, input: q, assertions: [{cost: {max: 0.01}}]}
  - {id: c, input: q}
"""
    )
    store = MemoryStore()
    first = await run_experiment(data, agent, store=store, concurrency=1, max_cost=0.1)
    assert first.record.status == "budget_exhausted" and first.ran == 1
    (a,) = first.results
    assert a.cost is not None and 0.1 <= a.cost <= 0.2 and a.status == "passed", a.checks
    again = await run_experiment(data, agent, store=store, concurrency=1, max_cost=0.1)
    assert again.ran == 0  # what the first attempt spent counts against the same budget
    last = await run_experiment(data, agent, store=store, concurrency=1)
    assert last.record.id == first.record.id and last.ran == 2
    statuses = {r.case_id: r.status for r in last.results}
    assert statuses == {"a": "passed", "b": "failed", "c": "passed"}
    assert last.record.status == "finished" and last.record.cost >= 0.3

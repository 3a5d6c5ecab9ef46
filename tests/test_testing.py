"""The test models that ship in loom.testing."""

from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from loom import Agent, ModelResponse, tool
from loom.errors import InputError, ModelResponseError
from loom.memory.tokens import EstimateCounter, counter_for_model
from loom.messages import Message, Usage
from loom.models import complete, reports_real_usage
from loom.models.base import TextDelta
from loom.policy.approval import Reject
from loom.sample import sample
from loom.testing import FunctionModel, ScriptedModel, TestModel
from loom.tools.basic import add


async def test_scripted_model_streams_in_deltas_and_records_calls() -> None:
    model = ScriptedModel(["hello there world"])
    parts = [p async for p in model.stream([Message.user("hi")], [])]
    assert [p.text for p in parts if isinstance(p, TextDelta)] == ["hello ", "there ", "world"]
    assert isinstance(parts[-1], ModelResponse)
    assert parts[-1].usage == Usage(requests=1)  # one request; no invented token counts
    assert model.calls[0].messages[0].content == "hi"
    model.assert_all_consumed()


async def test_scripted_model_running_out_is_a_clear_error() -> None:
    model = ScriptedModel(["one"])
    await complete(model, [Message.user("a")])
    with pytest.raises(ModelResponseError, match="ran out of responses after 1"):
        await complete(model, [Message.user("b")])


def test_unconsumed_responses_fail_the_check() -> None:
    model = ScriptedModel(["a", "b"])
    Agent(model=model).run_sync("x")
    with pytest.raises(AssertionError, match="1 of 2 responses unused"):
        model.assert_all_consumed()


async def test_function_model_sync_and_async() -> None:
    async def answer(messages: list[Message], tools: object) -> str:
        return f"{len(messages)} messages"

    assert (await complete(FunctionModel(answer), [Message.user("a")])).text == "1 messages"
    sync = FunctionModel(lambda m, t: ModelResponse(text="sync"))
    assert (await complete(sync, [])).text == "sync"


async def test_bad_arguments_and_returns() -> None:
    with pytest.raises(InputError):
        ScriptedModel("just a string")  # type: ignore[arg-type]
    with pytest.raises(InputError):
        FunctionModel(42)  # type: ignore[arg-type]
    with pytest.raises(ModelResponseError, match="return a ModelResponse"):
        await complete(FunctionModel(lambda m, t: 42), [])  # type: ignore[arg-type,return-value]


LONG = " ".join(f"Sentence number {i} talks about the weather and the sea." for i in range(40))


def estimator_of(agent: Agent) -> EstimateCounter:
    counter = agent.runtime.builder_for(agent).counter_for(agent, agent.model).counter
    assert isinstance(counter, EstimateCounter)
    return counter


async def test_a_function_model_run_reports_no_tokens_and_leaves_the_estimator_alone() -> None:
    agent = Agent(model=FunctionModel(lambda m, t: "a fairly long answer " * 20))
    for _ in range(3):
        result = await agent.run(LONG, session_id="s")
        assert (result.usage.input_tokens, result.usage.output_tokens) == (0, 0)
        assert result.usage.requests == 1
    counter = estimator_of(agent)
    assert (counter.observations, counter.scale) == (0, 1.0)


async def test_usage_a_script_gives_is_reported_but_never_calibrates_the_estimator() -> None:
    given = Usage(input_tokens=9000, output_tokens=7, requests=1)
    agent = Agent(model=ScriptedModel([ModelResponse(text="ok", usage=given)] * 3))
    for _ in range(3):
        result = await agent.run(LONG, session_id="s")
        assert result.usage == given  # passed through as scripted
    counter = estimator_of(agent)
    assert (counter.observations, counter.scale) == (0, 1.0)


def test_the_estimator_learns_from_real_models_only() -> None:
    class RealModel:
        name = "some-provider:some-model"

    assert not reports_real_usage(ScriptedModel([]))
    assert not reports_real_usage(FunctionModel(lambda m, t: ""))
    assert reports_real_usage(RealModel())  # a model need not declare it
    assert counter_for_model(ScriptedModel([])).calibrate is False  # type: ignore[attr-defined]
    assert counter_for_model(RealModel()).calibrate is True  # type: ignore[attr-defined]
    est = EstimateCounter()
    est.observe(1000, 2000, source=FunctionModel(lambda m, t: ""))
    assert (est.observations, est.scale) == (0, 1.0)
    est.observe(1000, 2000, source=RealModel())
    assert est.observations == 1 and est.scale == 2.0


# -- TestModel: answers from schemas alone -----------------------------------------------------
EXAMPLES = sorted((Path(__file__).parent.parent / "examples" / "agents").glob("*.md"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
async def test_test_model_runs_every_example_agent_without_a_script(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the examples start MCP servers with `python -m ...`: this interpreter's, with Loom on it
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    model = TestModel()
    agent = Agent.from_file(path, model=model, approval_handler=lambda p: Reject("smoke test"))
    async with agent:
        result = await agent.run("hello")
    assert result.stop_reason == "completed", result.error
    assert result.warnings == []  # every MCP server started
    offered = {t.name for t in model.calls[0].tools}
    called = [m.name for m in result.messages if m.role == "tool"]
    assert sorted(called) == sorted(offered)  # each offered tool, once
    assert offered >= set(agent.tools)
    if agent.toolsets:  # the MCP servers' tools were offered and called too
        assert any(n.startswith("time_") for n in called)
    assert result.output.startswith("success")


class Town(BaseModel):
    name: str = Field(min_length=3, max_length=5)
    population: int = Field(gt=10, le=20)
    kind: Literal["village", "city"]
    founded: dt.date
    tags: list[str] = Field(min_length=2)


class Region(BaseModel):
    towns: list[Town]
    capital: Town | None
    ratio: float = Field(ge=0.5, lt=0.6, multiple_of=0.25)


@pytest.mark.parametrize(
    "output_type",
    [
        Region,
        list[Town],
        Town | Region,
        {"type": "object", "properties": {"n": {"enum": [3, 4]}}, "required": ["n"]},
    ],
)
async def test_test_model_answers_with_an_object_that_fits_the_output_type(
    output_type: Any,
) -> None:
    model = TestModel()
    result = await Agent(model=model, output_type=output_type, output_retries=0).run("x")
    assert result.stop_reason == "completed", result.error
    assert len(model.calls) == 1  # it fitted the first time


async def test_test_model_calls_tools_with_arguments_that_fit_their_schemas() -> None:
    seen: list[tuple[int, str, list[int]]] = []

    @tool
    def book(nights: int, guest: str, rooms: list[int]) -> str:
        """Book rooms."""
        seen.append((nights, guest, rooms))
        return "booked"

    model = TestModel(call_tools=["book"], text="done")
    result = await Agent(model=model, tools=[book, add]).run("book it")
    assert result.output == "done"
    assert seen == [(1, "a", [1])]
    assert [m.name for m in result.messages if m.role == "tool"] == ["book"]


def test_sample_respects_the_constraints_it_knows() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "exclusiveMinimum": 5},
            "b": {"type": "number", "maximum": -2},
            "c": {"type": "string", "minLength": 4},
            "d": {"anyOf": [{"type": "null"}, {"type": "boolean"}]},
            "e": {"type": "array", "items": {"$ref": "#/$defs/X"}, "minItems": 2},
            "f": {"const": "k"},
            "g": {"type": "string", "format": "email"},
        },
        "$defs": {"X": {"type": "object", "properties": {"y": {"enum": ["p", "q"]}}}},
    }
    assert sample(schema) == {
        "a": 6,
        "b": -2.0,
        "c": "aaaa",
        "d": True,
        "e": [{"y": "p"}, {"y": "p"}],
        "f": "k",
        "g": "user@example.com",
    }


def test_test_model_rejects_a_bad_call_tools() -> None:
    with pytest.raises(InputError, match="call_tools"):
        TestModel(call_tools="add")

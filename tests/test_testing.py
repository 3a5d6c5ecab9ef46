"""The test models that ship in loom.testing."""

from __future__ import annotations

import pytest

from loom import Agent, ModelResponse
from loom.errors import InputError, ModelResponseError
from loom.memory.tokens import EstimateCounter, counter_for_model
from loom.messages import Message, Usage
from loom.models import complete, reports_real_usage
from loom.models.base import TextDelta
from loom.testing import FunctionModel, ScriptedModel


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

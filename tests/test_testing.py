"""The test models that ship in loom.testing."""

from __future__ import annotations

import pytest

from loom import Agent, ModelResponse
from loom.errors import InputError, ModelResponseError
from loom.messages import Message
from loom.models import complete
from loom.models.base import TextDelta
from loom.testing import FunctionModel, ScriptedModel


async def test_scripted_model_streams_in_deltas_and_records_calls() -> None:
    model = ScriptedModel(["hello there world"])
    parts = [p async for p in model.stream([Message.user("hi")], [])]
    assert [p.text for p in parts if isinstance(p, TextDelta)] == ["hello ", "there ", "world"]
    assert isinstance(parts[-1], ModelResponse) and parts[-1].usage is not None
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

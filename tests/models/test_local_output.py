"""The embedded model with an ``output_type``: constrained decoding under the output schema, so
every answer parses and validates, alone and after a tool round (the bundled SmolLM2-135M)."""

from __future__ import annotations

from enum import StrEnum

import pytest
from pydantic import BaseModel, Field

from loom import Agent
from loom.events import EventType
from loom.models.local import LocalModel
from loom.tools.basic import add

pytestmark = pytest.mark.slow


class Color(StrEnum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


class Address(BaseModel):
    city: str = Field(max_length=16)
    zip: int


class Person(BaseModel):
    name: str = Field(max_length=16)
    age: int
    favorite: Color
    address: Address
    tags: list[str] = Field(max_length=2)


PROMPTS = [
    "Alice is 30, lives in Paris 75001 and likes red.",
    "Bob, 41, Oslo 0150, a fan of blue.",
    "Make up a person.",
]


async def test_every_answer_is_a_valid_nested_model(local_model: LocalModel) -> None:
    agent = Agent(model=local_model, output_type=Person, instructions="Extract the person.")
    for prompt in PROMPTS:
        events = [e async for e in agent.stream(prompt)]
        finish = events[-1]
        assert finish.data["stop_reason"] == "completed", (prompt, finish.data)
        person = Person.model_validate_json(finish.data["output"])
        assert not any(e.type == EventType.OUTPUT_RETRY for e in events)  # right first time
        partials = [e.data["output"] for e in events if e.type == EventType.OUTPUT_PARTIAL]
        assert partials and partials[-1] == person.model_dump(mode="json")


async def test_a_tool_round_then_a_typed_answer(local_model: LocalModel) -> None:
    class Sum(BaseModel):
        total: int
        explanation: str = Field(max_length=40)

    result = await Agent(model=local_model, tools=[add], output_type=Sum).run("What is 17 + 25?")
    assert result.stop_reason == "completed", result.error
    assert isinstance(result.output, Sum)
    assert [m.name for m in result.messages if m.role == "tool"] == ["add"]

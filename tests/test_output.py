"""Typed answers (``output_type``, loom.output): validation, corrections, giving up, every
supported kind of type, per-run types, partial values while streaming, and bad types. The loop
logic runs on ScriptedModel / FunctionModel; the providers' native mechanisms are proven in
tests/models (test_local_output, test_openai, test_anthropic)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field
from typing_extensions import TypedDict  # pydantic needs it on Python < 3.12

from loom import Agent
from loom.engine.journal import transcript
from loom.errors import AgentDefinitionError, ConfigurationError
from loom.events import AgentEvent, EventType, OutputRetry
from loom.messages import Message, ToolSpec
from loom.store.memory import MemoryStore
from loom.testing import FunctionModel, ScriptedModel


class Address(BaseModel):
    city: str
    zip: int


class Person(BaseModel):
    """Someone mentioned in the text."""

    name: str
    age: int = Field(ge=0)
    address: Address


GOOD = '{"name": "Ana", "age": 31, "address": {"city": "Lisbon", "zip": 1100}}'
ANA = Person(name="Ana", age=31, address=Address(city="Lisbon", zip=1100))


async def test_bad_answers_are_corrected_with_their_errors_until_one_fits() -> None:
    store = MemoryStore()
    model = ScriptedModel(["Ana, 31, Lisbon", '{"name": "Ana", "age": -1}', GOOD])
    agent = Agent(model=model, output_type=Person, store=store)
    result = await agent.run("who?", session_id="s")
    assert result.stop_reason == "completed"
    assert result.output == ANA and isinstance(result.output, Person)
    assert json.loads(result.text) == json.loads(GOOD)
    model.assert_all_consumed()
    # every call carried the output schema to the model
    assert all(c.settings is not None and c.settings.output is not None for c in model.calls)
    assert model.calls[0].settings.output.schema == Person.model_json_schema()  # type: ignore[union-attr]
    # the second and third calls saw the corrections, naming what was wrong
    first, second = model.calls[1].messages[-1], model.calls[2].messages[-1]
    assert first.role == "user" and "not valid JSON" in first.content
    assert "age: Input should be greater than or equal to 0" in second.content
    assert "address: Field required" in second.content
    # the attempts are journaled: two OUTPUT_RETRY steps, their corrections in the transcript
    events = await store.load_events("s")
    retries = [e for e in events if e.type == EventType.OUTPUT_RETRY]
    assert [e.data["attempt"] for e in retries] == [1, 2]
    assert {"loc": "age", "msg": "Input should be greater than or equal to 0"} in retries[1].data[
        "errors"
    ]
    messages = await store.load_messages("s")
    assert messages == transcript(events)
    assert [m.metadata.get("output_correction") for m in messages if m.role == "user"] == [
        None,
        True,
        True,
    ]


async def test_it_gives_up_after_output_retries_with_its_own_stop_reason() -> None:
    store = MemoryStore()
    model = ScriptedModel(["no", "still no"])
    agent = Agent(model=model, output_type=Person, output_retries=1, store=store)
    result = await agent.run("who?", session_id="s")
    assert result.stop_reason == "output_invalid"
    assert result.output is None and result.text == "still no"
    assert "after 2 attempts (output_retries=1)" in (result.error or "")
    model.assert_all_consumed()
    events = await store.load_events("s")
    assert [e.type for e in events].count(EventType.OUTPUT_RETRY) == 1
    finish = events[-1]
    assert finish.type == EventType.AGENT_FINISH and finish.data["stop_reason"] == "output_invalid"
    errors = [e for e in events if e.type == EventType.ERROR]
    assert errors and "output type Person" in errors[-1].data["error"]


async def test_an_answer_cut_at_the_token_limit_is_not_retried() -> None:
    """A typed answer that stopped at max_tokens (finish_reason "length") would grow into the
    same limit again: the run ends at once with output_invalid, saying what to change."""
    from loom import ModelResponse

    cut = ModelResponse(text="[1, 2, 3, 4, 5, 6", finish_reason="length")
    model = ScriptedModel([cut, "[1, 2]"])
    result = await Agent(model=model, output_type=list[int], output_retries=3).run("numbers")
    assert result.stop_reason == "output_invalid"
    assert "cut at the model's token limit" in (result.error or "")
    assert "max_tokens" in (result.error or "")
    assert len(model.calls) == 1  # no correction sent


async def test_no_retries_means_the_first_bad_answer_ends_the_run() -> None:
    result = await Agent(model=ScriptedModel(["{}"]), output_type=Person, output_retries=0).run("x")
    assert result.stop_reason == "output_invalid"


@dataclass
class Point:
    x: int
    y: int


class Movie(TypedDict):
    title: str
    year: int


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


RAW = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 1}},
    "required": ["n"],
    "title": "Count",
}

KINDS: list[tuple[str, Any, str, str, Any]] = [
    # (id, output_type, a bad answer, a good answer, the value it becomes)
    ("pydantic", Person, '{"name": "Ana"}', GOOD, ANA),
    ("dataclass", Point, '{"x": 1}', '{"x": 1, "y": 2}', Point(1, 2)),
    (
        "typeddict",
        Movie,
        '{"title": "Up", "year": "soon"}',
        '{"title": "Up", "year": 2009}',
        {"title": "Up", "year": 2009},
    ),
    (
        "union",
        Cat | Dog,
        '{"kind": "cow"}',
        '{"kind": "dog", "good": true}',
        Dog(kind="dog", good=True),
    ),
    (
        "list",
        list[Point],
        '[{"x": 1, "y": "b"}]',
        '{"response": [{"x": 1, "y": 2}]}',
        [Point(1, 2)],
    ),
    ("list-bare", list[int], '["a"]', "[1, 2]", [1, 2]),
    ("schema", RAW, '{"n": 0}', '{"n": 3}', {"n": 3}),
    (
        "schema-array",
        {"type": "array", "items": {"type": "string"}},
        "[1]",
        '{"response": ["a"]}',
        ["a"],
    ),
]


@pytest.mark.parametrize(
    ("output_type", "bad", "good", "value"), [k[1:] for k in KINDS], ids=[k[0] for k in KINDS]
)
async def test_each_kind_of_output_type(output_type: Any, bad: str, good: str, value: Any) -> None:
    model = ScriptedModel([bad, good])
    agent = Agent(model=model, output_type=output_type)
    result = await agent.run("go")
    assert result.stop_reason == "completed", result.error
    assert result.output == value and type(result.output) is type(value)
    schema = model.calls[0].settings.output.schema  # type: ignore[union-attr]
    assert schema["type"] == "object"  # providers always get an object (wrapped if need be)
    assert agent.output_spec is not None
    assert (agent.output_spec.wrapped) == ("response" in schema.get("properties", {}))


async def test_a_fenced_answer_is_accepted() -> None:
    result = await Agent(model=ScriptedModel([f"```json\n{GOOD}\n```"]), output_type=Person).run(
        "x"
    )
    assert result.output == ANA


async def test_a_run_can_choose_its_own_output_type() -> None:
    model = ScriptedModel(['{"x": 1, "y": 2}', "plain words", GOOD])
    agent = Agent(model=model, output_type=Person)
    assert (await agent.run("a", output_type=Point)).output == Point(1, 2)
    text = await agent.run("b", output_type=str)  # str: a plain text answer
    assert text.output == "plain words" and text.stop_reason == "completed"
    assert model.calls[1].settings is None or model.calls[1].settings.output is None
    assert (await agent.run("c")).output == ANA  # the agent's own type again
    plain = Agent(model=ScriptedModel(["hi"]))
    result = await plain.run("x")
    assert (result.output, result.text) == ("hi", "hi")  # untyped: output is the text


class Item(BaseModel):
    n: int


async def test_streaming_yields_each_partial_value_once_it_validates() -> None:
    store = MemoryStore()
    answer = '[{"n": 1}, {"n": 2}, {"n": 3}]'
    agent = Agent(model=ScriptedModel([answer]), output_type=list[Item], store=store)
    events = [e async for e in agent.stream("count", session_id="s")]
    partials = [e for e in events if e.type == EventType.OUTPUT_PARTIAL]
    # word-sized deltas: each finished item makes a new valid list; nothing repeats
    assert [p.data["output"] for p in partials] == [
        [{"n": 1}],
        [{"n": 1}, {"n": 2}],
        [{"n": 1}, {"n": 2}, {"n": 3}],
    ]
    for p in partials:  # the stable JSON form, both ways
        assert AgentEvent.from_dict(json.loads(json.dumps(p.to_dict())), validate=True) == p
    stored = {e.type for e in await store.load_events("s")}
    assert EventType.OUTPUT_PARTIAL not in stored  # shown as it streams, never journaled
    assert events[-1].data["output"] == answer


async def test_partials_keep_unfinished_strings() -> None:
    class Note(BaseModel):
        title: str
        body: str = ""

    agent = Agent(
        model=ScriptedModel(['{"title": "hello world", "body": "a b c"}']), output_type=Note
    )
    outs = [e.data["output"] async for e in agent.stream("x") if e.type == EventType.OUTPUT_PARTIAL]
    assert outs[0] == {"title": "hello ", "body": ""}  # valid as soon as the title starts
    assert outs[-1] == {"title": "hello world", "body": "a b c"}


def test_the_output_retry_event_round_trips_and_carries_its_message() -> None:
    ev = OutputRetry(
        run_id="r", session_id="s", attempt=2, errors=[{"loc": "a", "msg": "m"}], correction="fix a"
    )
    back = AgentEvent.from_dict(json.loads(json.dumps(ev.to_dict())), validate=True)
    assert back == ev
    message = back.message()
    assert isinstance(message, Message)
    assert (message.role, message.content, message.metadata["attempt"]) == ("user", "fix a", 2)


class NotPydantic:
    def __init__(self, x: int) -> None:
        self.x = x


class HasOpaque(BaseModel):
    model_config = {"arbitrary_types_allowed": True}
    thing: NotPydantic


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        (NotPydantic, "NotPydantic"),
        (HasOpaque, "HasOpaque"),
        (3, "3"),
        ({"type": "nope"}, "not a valid JSON schema"),
        ({"type": "object", "required": "n"}, "not a valid JSON schema"),
    ],
)
def test_a_type_without_a_schema_is_a_configuration_error_naming_it(bad: Any, named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        Agent(model=ScriptedModel([]), output_type=bad)


async def test_a_bad_per_run_output_type_fails_before_the_run() -> None:
    model = ScriptedModel(["x"])
    with pytest.raises(ConfigurationError, match="NotPydantic"):
        await Agent(model=model).run("x", output_type=NotPydantic)
    assert model.calls == []


def test_output_retries_must_be_a_non_negative_integer() -> None:
    for bad in (-1, 1.5, True):
        with pytest.raises(AgentDefinitionError, match="output_retries"):
            Agent(model=ScriptedModel([]), output_retries=bad)


def test_an_agent_file_declares_its_output_schema(tmp_path: Path) -> None:
    path = tmp_path / "AGENT.md"
    path.write_text(
        "---\nname: counter\noutput_retries: 1\noutput_schema:\n  type: object\n"
        "  properties: {n: {type: integer}}\n  required: [n]\n---\nCount.\n"
    )
    agent = Agent.from_file(path, model=ScriptedModel(['{"n": "x"}', '{"n": 4}']))
    assert agent.output_retries == 1
    assert agent.run_sync("go").output == {"n": 4}
    again = agent.to_definition()
    assert again.output_schema == {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
    }
    typed = Agent(model=ScriptedModel([]), output_type=Person).to_definition()
    assert typed.output_schema == Person.model_json_schema()
    (tmp_path / "bad.md").write_text("---\nname: b\noutput_schema: {type: nope}\n---\nx\n")
    with pytest.raises(AgentDefinitionError, match=r"bad\.md"):
        Agent.from_file(tmp_path / "bad.md")


async def test_tools_then_a_typed_answer() -> None:
    def fn(messages: list[Message], tools: list[ToolSpec]) -> Any:
        from loom.messages import ModelResponse, ToolCall

        if messages[-1].role == "user":
            return ModelResponse(tool_calls=[ToolCall(name="add", arguments={"a": 1, "b": 2})])
        return json.dumps({"x": int(messages[-1].content), "y": 0})

    from loom.tools.basic import add

    result = await Agent(model=FunctionModel(fn), tools=[add], output_type=Point).run("1+2")
    assert result.output == Point(3, 0)

"""Prompt rendering, the tool-choice schema and the answer streamer of the local model."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loom.messages import Message, ToolCall, ToolResult
from loom.models.local_prompt import (
    ANSWER_NUDGE,
    AnswerStream,
    ToolMode,
    parse_constrained,
    render_messages,
    tool_rounds_since_user,
    tools_schema,
)
from loom.tools.base import ToolSpec

NESTED = ToolSpec(
    "book",
    "Book a room.",
    {
        "type": "object",
        "properties": {"guest": {"$ref": "#/$defs/Guest"}},
        "required": ["guest"],
        "$defs": {"Guest": {"type": "object", "properties": {"name": {"type": "string"}}}},
    },
)
ADD = ToolSpec(
    "add",
    "Add two numbers.",
    {
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"],
    },
)


def test_schema_offers_each_tool_and_the_answer_and_hoists_defs() -> None:
    schema = tools_schema([ADD, NESTED], ToolMode.CHOICE)
    branches = schema["anyOf"]
    assert [b["properties"].get("tool", {}).get("const") for b in branches] == ["add", "book", None]
    assert branches[2]["properties"] == {"answer": {"type": "string"}}
    guest = branches[1]["properties"]["arguments"]["properties"]["guest"]
    assert guest == {"$ref": "#/$defs/t1_Guest"}
    assert "t1_Guest" in schema["$defs"]
    assert "$defs" not in branches[1]["properties"]["arguments"]


def test_required_mode_has_no_answer_branch() -> None:
    schema = tools_schema([ADD], ToolMode.REQUIRED)
    assert all("tool" in b["properties"] for b in schema["anyOf"])


def test_the_schema_compiles_to_a_llama_grammar() -> None:
    llama_grammar = pytest.importorskip("llama_cpp.llama_grammar")
    grammar = llama_grammar.LlamaGrammar.from_json_schema(
        json.dumps(tools_schema([ADD, NESTED], ToolMode.CHOICE)), verbose=False
    )
    assert "add" in grammar._grammar and "answer" in grammar._grammar


def test_parse_constrained() -> None:
    assert parse_constrained('{"answer": "hi"}') == ("hi", None)
    text, call = parse_constrained('{ "tool": "add", "arguments": {"a": 1, "b": 2} }')
    assert text == "" and call is not None
    assert (call.name, call.arguments) == ("add", {"a": 1, "b": 2})
    with pytest.raises(ValueError):
        parse_constrained('{"tool": "add", "argu')


def test_tool_results_are_folded_into_the_assistant_turn_with_a_nudge() -> None:
    call = ToolCall(name="add", arguments={"a": 17, "b": 25})
    messages = [
        Message.system("Be brief."),
        Message.user("What is 17 + 25?"),
        Message.assistant(tool_calls=[call]),
        Message.tool(ToolResult(tool_call_id=call.id, name="add", data=42)),
    ]
    assert tool_rounds_since_user(messages) == 1
    chat = render_messages(messages, [ADD], ToolMode.TEXT)
    assert chat == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 17 + 25?"},
        {"role": "assistant", "content": "add(a=17, b=25) = 42"},
        {"role": "user", "content": ANSWER_NUDGE},
    ]
    with_tools = render_messages(messages[:2], [ADD], ToolMode.CHOICE)
    assert "- add(a: number, b: number): Add two numbers." in with_tools[0]["content"]
    assert '{"answer": "text"}' in with_tools[0]["content"]


@given(st.text(max_size=60), st.lists(st.integers(1, 5), max_size=40))
def test_answer_stream_yields_exactly_the_answer_however_it_is_split(
    answer: str, cuts: list[int]
) -> None:
    raw = '{ "answer": ' + json.dumps(answer) + " }"
    stream, out, i = AnswerStream(), [], 0
    for n in [*cuts, len(raw)]:
        out.append(stream.feed(raw[i : i + n]))
        i += n
    assert "".join(out) == answer


def test_answer_stream_shows_nothing_of_a_tool_call() -> None:
    stream = AnswerStream()
    raw = '{"tool": "add", "arguments": {"answer": "x"}}'
    assert "".join(stream.feed(ch) for ch in raw) == ""

"""JSONL transcript export and the tolerant reader."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from loom.errors import TranscriptError
from loom.messages import Message, ToolCall
from loom.store.transcript import read_jsonl, write_jsonl


def _build() -> list[Message]:
    call = ToolCall(name="add", arguments={"a": 1, "b": 2})
    return [
        Message.user("hi ✓"),
        Message.assistant("", [call]),
        Message(role="tool", content="3", tool_call_id=call.id, name="add"),
        Message(
            role="tool",
            content="Error (x): y",
            tool_call_id="c2",
            name="add",
            metadata={"success": False, "error_code": "x"},
        ),
        Message.assistant("3"),
    ]


MESSAGES = _build()


def _messages() -> list[Message]:
    return list(MESSAGES)


def test_round_trip(tmp_path: Path) -> None:
    buf = io.StringIO()
    assert write_jsonl(_messages(), buf) == 5
    path = tmp_path / "t.jsonl"
    path.write_text(buf.getvalue())
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith('{"role": "user", "content": "hi ✓", "timestamp": ')
    assert '"tool_call_id"' in lines[2] and '"tool_calls"' in lines[1]
    read = read_jsonl(path)
    assert read.messages == _messages() and not read.truncated


def test_truncated_last_line_is_dropped(tmp_path: Path) -> None:
    buf = io.StringIO()
    write_jsonl(_messages(), buf)
    text = buf.getvalue()
    path = tmp_path / "t.jsonl"
    path.write_text(text[: len(text) - 20])  # the writer died in the middle of the last line
    read = read_jsonl(path)
    assert read.truncated and read.messages == _messages()[:4]


def test_malformed_line_reports_its_number(tmp_path: Path) -> None:
    buf = io.StringIO()
    write_jsonl(_messages(), buf)
    lines = buf.getvalue().splitlines()
    lines[2] = lines[2][:30]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TranscriptError, match=r"t.jsonl:3: not a transcript message") as info:
        read_jsonl(path)
    assert info.value.line == 3
    path.write_text('{"role": "robot", "content": "x"}\n')
    with pytest.raises(TranscriptError, match=r":1: .*role") as info:
        read_jsonl(path)
    assert info.value.line == 1
    with pytest.raises(TranscriptError, match="cannot read"):
        read_jsonl(tmp_path / "missing.jsonl")

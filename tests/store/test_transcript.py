"""JSONL transcript export and the tolerant reader."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from loom.errors import TranscriptError
from loom.events import EventType, make_event
from loom.messages import Message, ToolCall
from loom.store.transcript import newest_exchange, read_jsonl, since_last_request, write_jsonl


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


# -- reading the newest exchange (pending approvals and queries) ---------------------------------


@pytest.fixture(params=["memory", "sqlite"])
async def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    from loom.store import MemoryStore, SQLiteStore

    store = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "t.db")
    yield store
    await store.close()


def _event(kind: EventType, run: str, seq: int) -> Any:
    return make_event(kind, run, "s", 0, seq, {"n": seq})


async def test_since_last_request_pages_back_to_the_last_user_message(any_store: Any) -> None:
    required, decided = EventType.APPROVAL_REQUIRED, EventType.APPROVAL_DECISION
    older = [_event(EventType.USER_MESSAGE, "r1", 0), _event(required, "r1", 1)]
    newest = [_event(EventType.USER_MESSAGE, "r2", 0)]
    newest += [_event(required if i % 3 else decided, "r2", i) for i in range(1, 30)]
    await any_store.append("s", events=older)
    await any_store.append("s", events=[_event(EventType.ITERATION_START, "r1", 2)])
    await any_store.append("s", events=newest)
    await any_store.append("t", events=[_event(required, "r9", 0)])
    got = await since_last_request(any_store, "s", [required, decided])
    assert [(e.run_id, e.sequence) for e in got] == [("r2", i) for i in range(1, 30)]
    assert await since_last_request(any_store, "nobody", [required]) == []


async def test_since_last_request_without_any_user_message(any_store: Any) -> None:
    query = EventType.SERVER_QUERY
    await any_store.append("s", events=[_event(query, "r1", i) for i in range(9)])
    got = await since_last_request(any_store, "s", [query])
    assert [e.sequence for e in got] == list(range(9))


async def test_newest_exchange_reads_back_to_the_last_request(any_store: Any) -> None:
    old = [Message.user("old"), Message.assistant("a")]
    correction = Message(role="user", content="fix it", metadata={"judge_correction": True})
    newest = [Message.user("new"), *[Message.assistant(f"x{i}") for i in range(40)], correction]
    await any_store.append("s", messages=old + newest)
    got = await newest_exchange(any_store, "s")
    assert got[-len(newest) :] == newest  # pages back past the correction to the request
    assert await newest_exchange(any_store, "nobody") == []

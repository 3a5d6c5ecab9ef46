"""One serialisation for every store (issue #12 item 2); store capabilities (#11 item 8)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from loom.errors import SerializationError, StoreError
from loom.events import EventType, make_event
from loom.messages import Message, ToolResult
from loom.store import MemoryStore, SQLiteStore, codec
from loom.store.base import (
    LedgerEntry,
    StoreCapabilities,
    StoredError,
    StoredResult,
    capabilities_of,
    new_error_id,
)

LONE = chr(0xDC80)  # os.fsdecode(b"\x80"): a file name byte that is not UTF-8


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    s: Any = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "l.db")
    yield s
    await s.close()


def test_scrub_text_escapes_lone_surrogates_and_joins_pairs() -> None:
    assert codec.scrub_text("plain") == "plain"
    assert codec.scrub_text("café ✓") == "café ✓"
    assert codec.scrub_text("a" + LONE + "b") == "a\\udc80b"
    assert codec.scrub_text(chr(0xD800)) == "\\ud800"
    assert codec.scrub_text(chr(0xD83D) + chr(0xDE00)) == "😀"  # a pair split in two
    assert codec.scrub_text(chr(0xDE00) + chr(0xD83D)) == "\\ude00\\ud83d"  # wrong order
    assert codec.scrub_text("x" + LONE).encode() == b"x\\udc80"  # valid UTF-8 now


def test_encode_value_round_trips_json_and_escapes_surrogates() -> None:
    value = {"k" + LONE: ["v" + LONE, 1, 2.5, None, True], "when": datetime(2024, 1, 2, tzinfo=UTC)}
    text = codec.encode_value(value, "x")
    text.encode()  # valid UTF-8
    assert codec.decode_value(text) == {
        "k\\udc80": ["v\\udc80", 1, 2.5, None, True],
        "when": "2024-01-02T00:00:00Z",
    }


def test_refusals_name_the_field() -> None:
    class Opaque:
        pass

    with pytest.raises(SerializationError, match=r"tool result\.data\['rows'\]\[1\] has no JSON"):
        codec.encode_value(
            ToolResult(tool_call_id="c", name="t", data={"rows": [1, Opaque()]}), "tool result"
        )
    assert issubclass(SerializationError, StoreError)


async def test_failures_are_identical_on_both_stores(tmp_path: Path) -> None:
    # The same bad value must fail with the same typed error and message on every store.
    class Opaque:
        pass

    loop: list[Any] = []
    loop.append(loop)
    bad_values: list[Any] = [Opaque(), loop, b"\xff", _deep(500)]
    memory, sqlite = MemoryStore(), SQLiteStore(tmp_path / "l.db")
    for bad in bad_values:
        steps: list[dict[str, Any]] = [
            {"messages": [Message(role="tool", content="x", metadata={"v": bad})]},
            {"events": [make_event(EventType.TOOL_RESULT, "r", "s", 0, 0, {"v": bad})]},
            {
                "ledger": [
                    LedgerEntry(
                        "r",
                        "s",
                        "c",
                        "t",
                        "completed",
                        {},
                        "idempotent",
                        ToolResult(tool_call_id="c", name="t", data=bad),
                    )
                ]
            },
        ]
        for step in steps:
            errors = []
            for s in (memory, sqlite):
                with pytest.raises(SerializationError) as info:
                    await s.append("s", **{"messages": [Message.user("ok")], **step})
                errors.append(str(info.value))
            assert errors[0] == errors[1]
    for s in (memory, sqlite):
        assert await s.load_messages("s") == []
        assert await s.load_events("s") == []
    await sqlite.close()


def _deep(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = {"d": value}
    return value


async def test_tool_result_round_trips_identically(store: Any) -> None:
    when = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    result = ToolResult(
        tool_call_id="c",
        name="ls",
        data={"files": ["a" + LONE], "when": when, "deep": _deep(150), "set": {3}},
        metadata={"path": LONE},
    )
    # A started entry carrying a result: open_tool_calls reads it back on every store.
    entry = LedgerEntry("r", "s", "c", "ls", "started", {"p": LONE}, "pure", result)
    await store.append("s", ledger=[entry])
    (back,) = await store.open_tool_calls("s")
    assert back.result is not None
    assert back.result.data == {
        "files": ["a\\udc80"],
        "when": "2024-05-06T07:08:09.123456Z",
        "deep": _deep(150),
        "set": [3],
    }
    assert back.result.metadata == {"path": "\\udc80"} and back.arguments == {"p": "\\udc80"}
    assert back == codec.decode_ledger("s", codec.encode_ledger(entry))


async def test_sqlite_error_and_result_stores_take_surrogates(tmp_path: Path) -> None:
    s = SQLiteStore(tmp_path / "l.db")
    err = StoredError(new_error_id(), "s", "ls" + LONE, {"message": "no " + LONE}, "x" + LONE)
    await s.save_error(err)
    got = await s.get_error(err.id)
    assert got is not None and got.raw_error == {"message": "no \\udc80"}
    assert got.short_summary == "x\\udc80" and got.tool_name == "ls\\udc80"
    await s.save_result(StoredResult("res_1", "s", "cat", "body " + LONE))
    res = await s.get_result("res_1")
    assert res is not None and res.content == "body \\udc80"
    with pytest.raises(SerializationError, match=r"value mem/k\['v'\] has no JSON form"):
        await s.put_value("mem", "k", {"v": object()})
    assert await s.get_value("mem", "k") is None
    await s.close()


async def test_memory_store_keeps_no_live_objects() -> None:
    # What MemoryStore returns is decoded from its stored text: changing the objects given
    # to it (or the ones it returned) changes nothing stored, as on SQLite.
    s = MemoryStore()
    msg = Message(role="user", content="hi", metadata={"tags": ["a"]})
    await s.append("s", messages=[msg])
    msg.metadata["tags"].append("changed")
    got = await s.load_messages("s")
    assert got[0].metadata == {"tags": ["a"]}
    got[0].metadata["tags"].append("again")
    assert (await s.load_messages("s"))[0].metadata == {"tags": ["a"]}


# -- capabilities ------------------------------------------------------------------------------
async def test_capabilities_checked_once_per_store(tmp_path: Path) -> None:
    memory = MemoryStore()
    caps = capabilities_of(memory)
    assert caps == StoreCapabilities(
        runs=memory,
        typed_events=memory,
        windows=memory,
        latest_events=memory,
        blobs=memory,
        branches=memory,
        items=memory,
    )
    assert capabilities_of(memory) is caps  # cached
    sqlite = SQLiteStore(tmp_path / "l.db")
    full = capabilities_of(sqlite)
    assert full.errors is full.results is full.runs is full.kv is full.typed_events is sqlite
    assert full.windows is full.latest_events is full.blobs is full.items is sqlite
    await sqlite.close()


def test_capabilities_of_a_store_without_weakref_support() -> None:
    class Slotted:
        __slots__ = ()

        async def open_runs(self, session_id: str) -> list[Any]:
            return []

    caps = capabilities_of(Slotted())  # type: ignore[arg-type]
    assert caps.runs is not None and caps.errors is None


async def test_events_read_back_identically_on_both_stores(tmp_path: Path) -> None:
    # MemoryStore packs a commit's events with one to_json call (the fast path) and falls
    # back to encode_event for unusual values; either way it must read back exactly what
    # SQLite reads back, and keep no live object.
    when = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
    steps = [
        [
            make_event(EventType.STATE_CHANGE, "r1", "s", 1, 0, {"from": "a", "to": "b"}),
            make_event(
                EventType.LLM_COMPLETE,
                "r1",
                "s",
                1,
                1,
                {
                    "answer": "",
                    "tool_calls": [{"id": "c", "name": "add", "arguments": {"a": 1}}],
                    "usage": {"input_tokens": 1},
                    "more": {3},
                },
            ),
            make_event("from_a_newer_loom", "r1", "s", 1, 2, {"x": [1, 2], "when": when}),
        ],
        [  # surrogates: encode_event's path (scrubbed), in the same store
            make_event(
                EventType.TOOL_RESULT,
                "r2",
                "s",
                2,
                0,
                {"content": "a" + LONE, "nan": float("nan"), "inf": float("inf")},
            ),
            make_event(EventType.ERROR, "r" + LONE, "s", 2, 1, {"error": "x"}),
        ],
        [make_event(EventType.WARNING, "r1", "s", 3, 3, {"deep": _deep(150)})],
    ]
    memory, sqlite = MemoryStore(), SQLiteStore(tmp_path / "l.db")
    for step in steps:
        for s in (memory, sqlite):
            await s.append("s", events=step)
    step = steps[0]
    step[1].tool_calls[0]["arguments"]["a"] = 99  # type: ignore[attr-defined]
    for run_id in (None, "r1", "r2"):
        got = [(await s.load_events("s", run_id)) for s in (memory, sqlite)]
        assert len(got[0]) == len(got[1]) > 0
        for a, b in zip(*got, strict=True):
            assert type(a) is type(b)
            assert repr(a) == repr(b)  # repr: NaN != NaN would fail a plain ==
    events = await memory.load_events("s", "r1")
    assert events[1].tool_calls[0]["arguments"] == {"a": 1}  # type: ignore[attr-defined]
    await sqlite.close()


def test_encode_events_writes_the_rows_encode_event_writes() -> None:
    """The step's batch encoder (built from each event's payload tuple) and the per-event
    encoder agree on every row, the unusual ones too (which take the per-event path)."""
    deep: Any = []
    for _ in range(150):  # past the bracket count that makes a trial read: still readable
        deep = [deep]
    cases = [
        make_event(EventType.ITERATION_START, "r", "s", 1, 0, {}),
        make_event(EventType.STATE_CHANGE, "r", "s", 1, 1, {"from": "a", "to": "b"}),
        make_event(EventType.USER_MESSAGE, "r", "s", 1, 2, {"content": "café ✓", "x": 1}),
        make_event(EventType.TOOL_RESULT, "r", "s", 1, 3, {"content": "a" + LONE, "success": True}),
        make_event(EventType.LLM_COMPLETE, "r", "s", 1, 4, {"text": "", "usage": {"n": 1.5}}),
        make_event(EventType.WARNING, "r", "s", 1, 5, {"warning": "w"}, parent_run_id="p"),
        make_event(EventType.WARNING, "r" + LONE, "s", 1, 6, {"warning": "w"}),
        make_event(EventType.WARNING, "r", "s", 1, 7, {"warning": "w", "nan": float("nan")}),
        make_event(EventType.WARNING, "r", "s", 1, 8, {"warning": "w", "deep": deep[0][0]}),
        make_event("some_future_type", "r", "s", 1, 9, {"k": [1, 2]}),
    ]
    assert codec.encode_events(cases) == [codec.encode_event(e) for e in cases]
    with pytest.raises(SerializationError) as batch:
        codec.encode_events([make_event(EventType.WARNING, "r", "s", 1, 0, {"x": object()})])
    with pytest.raises(SerializationError) as single:
        codec.encode_event(make_event(EventType.WARNING, "r", "s", 1, 0, {"x": object()}))
    assert str(batch.value) == str(single.value)


# -- stored JSON stays small: an empty ``parts`` is not stored (issue #27 on issue #26's figure) --
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40


def _part_events(parts: list[Any]) -> list[Any]:
    return [
        make_event(EventType.USER_MESSAGE, "r1", "s", 0, 0, {"content": "hi", "parts": parts}),
        make_event(EventType.LLM_COMPLETE, "r1", "s", 1, 1, {"text": "yo", "parts": parts}),
        make_event(
            EventType.TOOL_RESULT,
            "r1",
            "s",
            1,
            2,
            {"tool_name": "t", "tool_call_id": "c", "content": "ok", "parts": parts},
        ),
    ]


def test_an_empty_parts_is_left_out_of_stored_messages_and_events() -> None:
    text = codec.encode_message(Message.user("hi"))
    assert '"parts"' not in text
    assert codec.decode_messages([text])[0].parts == []
    events = _part_events([])
    rows = codec.encode_events(events)
    assert rows == [codec.encode_event(e) for e in events]  # both paths agree
    assert all('"parts"' not in r.data for r in rows)
    back = [codec.decode_event("s", r) for r in rows]
    assert [e.parts for e in back] == [[], [], []]  # type: ignore[attr-defined]
    packed = codec.pack_commit(events, [])
    assert packed is not None and packed.events is not None
    rows_kept = json.loads(packed.blob)[0]  # payload fields and extra, in PAYLOAD order
    assert [len(r) for r in rows_kept] == [len(type(e).PAYLOAD) for e in events]  # no parts
    assert [e.data for e in codec.unpack_events("s", packed.events, None)] == [e.data for e in back]


def test_stored_parts_hold_a_reference_and_never_the_bytes() -> None:
    from loom.content import Image, media_ref

    image = Image.from_bytes(PNG, name="chart.png")
    text = codec.encode_message(Message.user(["look", image]))
    stored_part = json.loads(text)["parts"][0]
    assert stored_part == {  # no bytes, and no empty fields either
        "kind": "image",
        "media_type": "image/png",
        "ref": media_ref(PNG),
        "size": len(PNG),
        "name": "chart.png",
    }
    assert len(text) < 400  # 10 KB of bytes: none of them in the JSON
    part = codec.decode_messages([text])[0].parts[0]
    assert isinstance(part, Image)
    assert (part.ref, part.size, part.name, part.data) == (
        media_ref(PNG),
        len(PNG),
        "chart.png",
        None,
    )
    rows = codec.encode_events(_part_events([image]))
    assert all(media_ref(PNG) in r.data and len(r.data) < 400 for r in rows)
    packed = codec.pack_commit(_part_events([image]), [])
    assert packed is not None and packed.events is not None
    again = codec.unpack_events("s", packed.events, None)
    assert [p.ref for e in again for p in e.message().parts] == [media_ref(PNG)] * 3  # type: ignore[union-attr]

"""The ``Store`` contract as a pytest suite that any backend runs against itself.

```python
# tests/test_my_store.py
import pytest
from loom.store.conformance import StoreContract

class TestMyStore(StoreContract):
    @pytest.fixture
    async def store(self, tmp_path):
        s = MyStore(tmp_path / "db")
        yield s
        await s.close()
```

Each test gets a fresh, empty store from your ``store`` fixture. Tests of the optional
capabilities (``RunStore``, ``ErrorStore``, ``ResultStore``, ``KVStore``, ``EventTypeStore``,
``TranscriptWindowStore``, ``LatestEventStore``, ``BlobStore``) skip when the store
does not have them (``loom.store.base.capabilities_of``). Needs pytest and pytest-asyncio
(``asyncio_mode = "auto"``).

Besides the basics the contract checks leases with fencing (a stale token cannot write, and
the refused write commits nothing), bounded transcript reads, and that values go through
``loom.store.codec``: lone surrogates are escaped, non-JSON values read back as their JSON
form, and a value that cannot be stored raises ``SerializationError`` before any commit.
A ``BlobStore`` must keep media bytes once however many sessions name them, delete them with
the last session naming them, refuse bytes over ``loom.content.MAX_MEDIA_BYTES`` and hand them
back to a new ``Runtime`` on the same store; a store that also has ``blob_usage()`` (how many
media it holds, and their bytes) is checked to hold each image once.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from loom.content import MAX_MEDIA_BYTES, Blob, Image, media_ref
from loom.embedding import EmbedderUnavailable, EmbeddingDimensionMismatch, HashEmbedder
from loom.engine.run_inputs import AtTurn, Edit, Regenerate, Rewind
from loom.errors import (
    ContentError,
    InputError,
    LeaseLost,
    MediaTooLarge,
    SerializationError,
    StoreError,
)
from loom.events import AgentEvent, EventType, SessionBranch, make_event
from loom.messages import Message, ToolCall, ToolResult, Usage, utcnow
from loom.store.base import (
    Lease,
    LedgerEntry,
    LedgerStatus,
    RunRecord,
    StoreCapabilities,
    StoredError,
    StoredResult,
    capabilities_of,
    new_error_id,
)
from loom.store.items import MAX_LIMIT, ItemOwned
from loom.store.items_vectors import RRF_K

__all__ = ["CountingStore", "FailingBlobs", "StoreContract"]


_PROTOCOLS = {
    "errors": "ErrorStore",
    "results": "ResultStore",
    "runs": "RunStore",
    "kv": "KVStore",
    "typed_events": "EventTypeStore",
    "windows": "TranscriptWindowStore",
    "latest_events": "LatestEventStore",
    "blobs": "BlobStore",
    "branches": "BranchStore",
    "items": "ItemStore",
    "schedules": "ScheduleTables",
}


class _Attempts(HashEmbedder):
    """Counts every ``embed`` call, answered or not (``attempts``)."""

    attempts = 0

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.attempts += 1
        return await super().embed(texts)


class _Misdeclared(HashEmbedder):
    """Declares ``dimensions`` but answers vectors one shorter (a misconfigured model)."""

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [v[:-1] for v in await super().embed(texts)]


def _needs(store: Any, capability: str) -> None:
    caps: StoreCapabilities = capabilities_of(store)
    if getattr(caps, capability) is None:
        pytest.skip(f"{type(store).__name__} is not a {_PROTOCOLS[capability]}")


async def _until_expired(lease: Lease) -> None:
    # Waiting for a ttl to run out is the one wait these tests need: it is what they test.
    await asyncio.sleep(max(lease.expires_at - time.time(), 0) + 0.01)
    assert time.time() > lease.expires_at


async def _until_past(moment: datetime) -> None:
    # As ``_until_expired``: the time to wait is read from the clock, not fixed.
    await asyncio.sleep(max(moment.timestamp() - time.time(), 0) + 0.005)
    assert datetime.now(UTC) > moment


def _deep(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = [value]
    return value


async def _nothing_stored(store: Any, session_id: str) -> None:
    assert await store.load_messages(session_id) == []
    assert await store.load_events(session_id) == []
    assert await store.open_tool_calls(session_id) == []
    caps = capabilities_of(store)
    if caps.runs is not None:
        assert await caps.runs.open_runs(session_id) == []


def _ev(run: str, seq: int, kind: EventType = EventType.ITERATION_START, **data: Any) -> AgentEvent:
    return make_event(kind, run, "s", 1, seq, data)


def _started(run: str, call: str, name: str = "t") -> LedgerEntry:
    return LedgerEntry(run, "s", call, name, "started", {"x": 1}, "idempotent")


def _ended(entry: LedgerEntry, status: LedgerStatus = "completed") -> LedgerEntry:
    result = ToolResult(tool_call_id=entry.tool_call_id, name=entry.name, data={"ok": True})
    return entry.ended(status, result)


class StoreContract:
    """Subclass as ``TestXxx`` and provide a ``store`` fixture (a fresh, empty store)."""

    # -- sessions ---------------------------------------------------------------------------------
    async def test_unknown_session_is_none_and_empty(self, store: Any) -> None:
        assert await store.get_session("nope") is None
        assert await store.load_messages("nope") == []
        assert await store.load_events("nope") == []
        assert await store.open_tool_calls("nope") == []

    async def test_create_session_is_idempotent(self, store: Any) -> None:
        first = await store.create_session("s", agent_name="a", metadata={"k": [1, 2]})
        again = await store.create_session("s", agent_name="other")
        assert first.id == again.id == "s"
        assert again.agent_name == "a" and again.metadata == {"k": [1, 2]}
        got = await store.get_session("s")
        assert got is not None and got.agent_name == "a" and got.message_count == 0

    async def test_create_session_names_an_unnamed_session(self, store: Any) -> None:
        await store.create_session("t", metadata={"k": 1})  # a thread before its first run
        named = await store.create_session("t", agent_name="calc")
        assert named.agent_name == "calc" and named.metadata == {"k": 1}
        assert (await store.create_session("t", agent_name="other")).agent_name == "calc"
        assert (await store.get_session("t")).agent_name == "calc"

    async def test_list_sessions_newest_first_with_limit(self, store: Any) -> None:
        for sid in ("a", "b", "c"):
            await store.create_session(sid)
            await store.append(sid, messages=[Message.user(sid)])
            await asyncio.sleep(0.002)
        await store.append("a", messages=[Message.user("again")])
        assert [i.id for i in await store.list_sessions()] == ["a", "c", "b"]
        assert [i.id for i in await store.list_sessions(limit=2)] == ["a", "c"]

    # -- messages ---------------------------------------------------------------------------------
    async def test_messages_round_trip_in_order(self, store: Any) -> None:
        call = ToolCall(name="add", arguments={"a": 1, "b": [2, {"c": "é"}]})
        msgs = [
            Message.user("hi"),
            Message.assistant("", [call]),
            Message(
                role="tool",
                content="3",
                tool_call_id=call.id,
                name="add",
                metadata={"success": False, "error_code": "x"},
            ),
            Message.assistant("done ✓"),
        ]
        await store.append("s", messages=msgs[:1])
        await store.append("s", messages=msgs[1:3])
        await store.append("s", messages=msgs[3:])
        assert await store.load_messages("s") == msgs
        info = await store.get_session("s")
        assert info is not None and info.message_count == 4

    async def test_sessions_are_isolated(self, store: Any) -> None:
        await store.append("a", messages=[Message.user("for a")], events=[_ev("r1", 0)])
        await store.append("b", messages=[Message.user("for b")])
        assert [m.content for m in await store.load_messages("a")] == ["for a"]
        assert [m.content for m in await store.load_messages("b")] == ["for b"]
        assert await store.load_events("b") == []

    # -- events -----------------------------------------------------------------------------------
    async def test_events_in_emission_order_and_by_run(self, store: Any) -> None:
        await store.append(
            "s",
            events=[
                _ev("r1", 0, EventType.AGENT_START, message="m"),
                _ev("r1", 1, note={"nested": [1]}),
            ],
        )
        await store.append("s", events=[_ev("r2", 0), _ev("r1", 2, EventType.AGENT_FINISH)])
        every = await store.load_events("s")
        assert [(e.run_id, e.sequence) for e in every] == [
            ("r1", 0),
            ("r1", 1),
            ("r2", 0),
            ("r1", 2),
        ]
        assert every[0].type is EventType.AGENT_START and every[0].data["message"] == "m"
        assert every[1].data == {"note": {"nested": [1]}}
        assert [e.sequence for e in await store.load_events("s", "r1")] == [0, 1, 2]

    async def test_events_of_some_types(self, store: Any) -> None:
        _needs(store, "typed_events")
        decided = EventType.APPROVAL_DECISION
        await store.append("s", events=[_ev("r1", 0, EventType.AGENT_START), _ev("r1", 1, decided)])
        await store.append("t", events=[_ev("r9", 0, decided)])  # another session's
        await store.append(
            "s",
            events=[_ev("r2", 0, EventType.APPROVAL_REQUIRED, x=1), _ev("r2", 1, decided, y=2)],
        )
        of = store.load_events_of_type
        assert [(e.run_id, e.sequence) for e in await of("s", [decided])] == [("r1", 1), ("r2", 1)]
        both = await of("s", [decided, EventType.APPROVAL_REQUIRED])
        assert [(e.type, e.run_id, e.sequence) for e in both] == [
            (decided, "r1", 1),
            (EventType.APPROVAL_REQUIRED, "r2", 0),
            (decided, "r2", 1),
        ]
        assert both[1].data.get("x") == 1 and both[2].data.get("y") == 2
        assert [e.sequence for e in await of("s", [EventType.AGENT_START])] == [0]
        assert await of("s", []) == [] and await of("nobody", [decided]) == []

    async def test_events_keep_parent_run_id(self, store: Any) -> None:
        # a crew member's events name the crew run that started theirs (docs/architecture.md)
        child = make_event(
            EventType.AGENT_START, "r2", "s", 0, 0, {"message": "m"}, parent_run_id="crew-run"
        )
        tool = make_event(
            EventType.TOOL_RESULT, "r2", "s", 1, 1, {"tool_name": "t"}, parent_run_id="crew-run"
        )
        await store.append("s", events=[_ev("r1", 0), child])
        await store.append("s", events=[tool])
        every = await store.load_events("s")
        assert [e.parent_run_id for e in every] == [None, "crew-run", "crew-run"]
        assert every[1].data["message"] == "m"
        assert all("parent_run_id" not in k for e in every for k in e.data)  # not in the payload
        assert every[1].extra == {} and every[2].extra == {}
        assert [e.parent_run_id for e in await store.load_events("s", "r2")] == [
            "crew-run",
            "crew-run",
        ]

    # -- ledger and runs --------------------------------------------------------------------------
    async def test_ledger_open_calls(self, store: Any) -> None:
        a, b, c = _started("r1", "c1"), _started("r1", "c2"), _started("r2", "c1")
        await store.append("s", ledger=[a, b])
        await store.append("s", ledger=[c])
        opened = await store.open_tool_calls("s")
        assert [(e.run_id, e.tool_call_id) for e in opened] == [
            ("r1", "c1"),
            ("r1", "c2"),
            ("r2", "c1"),
        ]
        assert opened[0].arguments == {"x": 1} and opened[0].effect == "idempotent"
        await store.append("s", ledger=[_ended(a)])
        await store.append("s", ledger=[_ended(c, "interrupted")])
        assert [(e.run_id, e.tool_call_id) for e in await store.open_tool_calls("s")] == [
            ("r1", "c2")
        ]
        await store.append("s", ledger=[_ended(b, "failed")])
        assert await store.open_tool_calls("s") == []

    async def test_run_end_adds_usage(self, store: Any) -> None:
        await store.append("s", run=RunRecord("r1", "s", "running"))
        await store.append(
            "s",
            run=RunRecord(
                "r1", "s", "completed", Usage(input_tokens=10, output_tokens=3, requests=1)
            ),
        )
        await store.append("s", run=RunRecord("r2", "s", "running"))
        await store.append("s", run=RunRecord("r2", "s", "error", Usage(input_tokens=5)))
        info = await store.get_session("s")
        assert info is not None
        assert (info.usage.input_tokens, info.usage.output_tokens) == (15, 3)

    async def test_open_runs(self, store: Any) -> None:
        _needs(store, "runs")
        await store.append("s", run=RunRecord("r1", "s", "running"))
        await store.append("s", run=RunRecord("r2", "s", "running"))
        await store.append("s", run=RunRecord("r1", "s", "completed"))
        assert [r.run_id for r in await store.open_runs("s")] == ["r2"]
        await store.append("s", run=RunRecord("r2", "s", "crashed"))
        assert await store.open_runs("s") == []

    # -- bounded reads ----------------------------------------------------------------------------
    async def test_load_messages_from_a_position(self, store: Any) -> None:
        msgs = [Message.user(f"m{i}") for i in range(7)]
        await store.append("s", messages=msgs[:3])
        await store.append("s", messages=msgs[3:])
        await store.append("other", messages=[Message.user("elsewhere")])
        assert await store.load_messages("s", 0) == msgs
        assert await store.load_messages("s", 4) == msgs[4:]
        assert await store.load_messages("s", start=6) == msgs[6:]
        assert await store.load_messages("s", 7) == []
        assert await store.load_messages("s", 100) == []
        assert await store.load_messages("nope", 2) == []
        with pytest.raises(InputError, match="start"):
            await store.load_messages("s", -1)

    async def test_message_count(self, store: Any) -> None:
        assert await store.message_count("s") == 0
        await store.append("s", messages=[Message.user("a"), Message.assistant("b")])
        await store.append("s", events=[_ev("r1", 0)])  # no messages: count unchanged
        await store.append("other", messages=[Message.user("c")])
        assert await store.message_count("s") == 2
        await store.append("s", messages=[Message.user("d")])
        assert await store.message_count("s") == 3
        assert await store.message_count("other") == 1

    async def test_message_range(self, store: Any) -> None:
        _needs(store, "windows")
        msgs = [Message.user(f"m{i}") for i in range(7)]
        await store.append("s", messages=msgs[:4])
        await store.append("other", messages=[Message.user("elsewhere")])
        await store.append("s", messages=msgs[4:])
        read = store.load_message_range
        assert await read("s", 0, 7) == msgs
        assert await read("s", 2, 5) == msgs[2:5]
        assert await read("s", 5, 100) == msgs[5:]
        assert await read("s", 3, 3) == [] and await read("s", 4, 2) == []
        assert await read("s", 7, 9) == [] and await read("nope", 0, 5) == []
        with pytest.raises(InputError, match="start"):
            await read("s", -1, 2)

    async def test_system_messages_with_their_positions(self, store: Any) -> None:
        _needs(store, "windows")
        summary = Message(
            role="system", content="so far", metadata={"loom": "summary", "covers_through": 1}
        )
        plain = Message.system("a system message of the conversation")
        await store.append("s", messages=[Message.user("a"), Message.assistant("b"), summary])
        await store.append("other", messages=[Message.system("elsewhere")])
        await store.append("s", messages=[Message.user("c"), plain, Message.assistant("d")])
        found = await store.load_system_messages("s")
        assert [p for p, _ in found] == [2, 4]
        assert [m for _, m in found] == [summary, plain]
        assert found[0][1].metadata["loom"] == "summary"
        assert await store.load_system_messages("nope") == []

    async def test_latest_events_of_some_types(self, store: Any) -> None:
        _needs(store, "latest_events")
        user, query = EventType.USER_MESSAGE, EventType.SERVER_QUERY
        await store.append("s", events=[_ev("r1", 0, user), _ev("r1", 1), _ev("r1", 2, query)])
        await store.append("t", events=[_ev("r9", 0, query)])  # another session's
        await store.append("s", events=[_ev("r2", 0, user, n=2), _ev("r2", 1), _ev("r2", 2)])
        latest = store.load_latest_events
        got = await latest("s", [user, query], 2)
        assert [(e.type, e.run_id, e.sequence) for e in got] == [(query, "r1", 2), (user, "r2", 0)]
        assert got[1].data.get("n") == 2
        assert [e.run_id for e in await latest("s", [user], 1)] == ["r2"]
        assert [e.run_id for e in await latest("s", [user, query], 10)] == ["r1", "r1", "r2"]
        assert await latest("s", [EventType.APPROVAL_DECISION], 3) == []
        assert await latest("nobody", [user], 3) == [] and await latest("s", [], 3) == []
        with pytest.raises(InputError, match="limit"):
            await latest("s", [user], 0)

    async def test_latest_events_far_back_in_the_journal(self, store: Any) -> None:
        _needs(store, "latest_events")
        user = EventType.USER_MESSAGE
        await store.append("s", events=[_ev("r1", 0, user), _ev("r1", 1, user)])
        await store.append("s", events=[_ev("r2", i) for i in range(3000)])
        got = await store.load_latest_events("s", [user], 5)
        assert [(e.run_id, e.sequence) for e in got] == [("r1", 0), ("r1", 1)]

    # -- leases -----------------------------------------------------------------------------------
    async def test_lease_excludes_other_runs_until_released(self, store: Any) -> None:
        first = await store.acquire_lease("s", "r1", 60)
        assert first is not None and (first.session_id, first.run_id) == ("s", "r1")
        assert first.expires_at > time.time() + 50
        assert await store.acquire_lease("s", "r2", 60) is None
        again = await store.acquire_lease("s", "r1", 60)  # the holder may take it again...
        assert again is not None and again.token > first.token  # ...with a new token
        other = await store.acquire_lease("other", "r2", 60)  # leases are per session
        assert other is not None
        stale = Lease("s", "r2", again.token + 5, time.time() + 60)
        await store.release_lease(stale)  # not the holder: no effect
        await store.release_lease(first)  # an old token of the holder: no effect either
        assert await store.acquire_lease("s", "r3", 60) is None
        await store.release_lease(again)
        third = await store.acquire_lease("s", "r3", 60)
        assert third is not None and third.token > again.token

    async def test_tokens_increase_across_releases(self, store: Any) -> None:
        tokens = []
        for i in range(4):
            lease = await store.acquire_lease("s", f"r{i}", 60)
            assert lease is not None
            tokens.append(lease.token)
            await store.release_lease(lease)
        assert tokens == sorted(set(tokens)), tokens
        released = Lease("s", "r3", tokens[-1], time.time() + 60)
        with pytest.raises(LeaseLost):  # a released lease writes no more
            await store.append("s", messages=[Message.user("late")], lease=released)
        with pytest.raises(LeaseLost):
            await store.renew_lease(released, 60)

    async def test_renew_extends_and_keeps_the_token(self, store: Any) -> None:
        lease = await store.acquire_lease("s", "r1", 0.2)
        assert lease is not None
        renewed = await store.renew_lease(lease, 60)
        assert renewed.token == lease.token and renewed.run_id == "r1"
        assert renewed.expires_at > lease.expires_at + 50
        await _until_expired(lease)  # the first expiry passed; the renewal holds
        assert await store.acquire_lease("s", "r2", 60) is None
        await store.append("s", messages=[Message.user("still mine")], lease=renewed)
        await store.append("s", messages=[Message.user("old copy")], lease=lease)  # same token
        assert [m.content for m in await store.load_messages("s")] == ["still mine", "old copy"]

    async def test_expired_lease_is_taken_over_and_fenced(self, store: Any) -> None:
        old = await store.acquire_lease("s", "r1", 0.05)
        assert old is not None
        await store.append("s", messages=[Message.user("before")], lease=old)
        await _until_expired(old)
        new = await store.acquire_lease("s", "r2", 60)
        assert new is not None and new.token > old.token
        assert await store.acquire_lease("s", "r1", 60) is None  # the old holder is out
        started = _started("r1", "c1")
        with pytest.raises(LeaseLost, match="r1"):
            await store.append(
                "s",
                messages=[Message.user("stale")],
                events=[_ev("r1", 0)],
                ledger=[started],
                run=RunRecord("r1", "s", "running"),
                lease=old,
            )
        with pytest.raises(LeaseLost):
            await store.renew_lease(old, 60)
        # Nothing of the refused step was committed.
        assert [m.content for m in await store.load_messages("s")] == ["before"]
        assert await store.message_count("s") == 1
        assert await store.load_events("s") == []
        assert await store.open_tool_calls("s") == []
        caps = capabilities_of(store)
        if caps.runs is not None:
            assert await caps.runs.open_runs("s") == []
        await store.release_lease(old)  # the stale holder's release does not free the session
        assert await store.acquire_lease("s", "r3", 60) is None
        await store.append("s", messages=[Message.user("new holder")], lease=new)
        assert [m.content for m in await store.load_messages("s")] == ["before", "new holder"]

    async def test_expired_lease_nobody_took_still_writes(self, store: Any) -> None:
        lease = await store.acquire_lease("s", "r1", 0.02)
        assert lease is not None
        await _until_expired(lease)
        await store.append("s", messages=[Message.user("late but unopposed")], lease=lease)
        renewed = await store.renew_lease(lease, 60)  # and it can still be renewed
        assert renewed.token == lease.token
        assert [m.content for m in await store.load_messages("s")] == ["late but unopposed"]

    async def test_lease_of_another_session_cannot_write(self, store: Any) -> None:
        lease = await store.acquire_lease("a", "r1", 60)
        assert lease is not None
        with pytest.raises(LeaseLost, match="session"):
            await store.append("b", messages=[Message.user("x")], lease=lease)
        assert await store.load_messages("b") == []

    # -- one serialisation ------------------------------------------------------------------------
    async def test_lone_surrogates_are_escaped_everywhere(self, store: Any) -> None:
        # A file name that is not UTF-8, as os.fsdecode gives it: byte 0xff -> U+DCFF.
        bad = "report-" + chr(0xDCFF) + ".txt"
        name = "report-\\udcff.txt"  # what the store keeps: the visible escape
        call = ToolCall(name="ls", arguments={"path": bad, bad: [bad]})
        msgs = [
            Message.user(f"read {bad}"),
            Message.assistant("", [call]),
            Message(role="tool", content=bad, tool_call_id=call.id, name="ls", metadata={bad: bad}),
        ]
        started = LedgerEntry("r1", "s", call.id, "ls", "started", {"path": bad})
        result = ToolResult(tool_call_id=call.id, name="ls", data={"files": [bad], bad: 1})
        await store.append(
            "s",
            messages=msgs,
            events=[_ev("r1", 0, EventType.TOOL_RESULT, output=bad, **{bad: 2})],
            ledger=[started],
            run=RunRecord("r1", "s", "running", data={"note": bad}),
        )
        got = await store.load_messages("s")
        assert got[0].content == f"read {name}"
        assert got[1].tool_calls[0].arguments == {"path": name, name: [name]}
        assert got[2].content == name and got[2].metadata == {name: name}
        event = (await store.load_events("s"))[0]
        assert event.extra == {"output": name, name: 2}  # keys TOOL_RESULT does not declare
        opened = await store.open_tool_calls("s")
        assert opened[0].arguments == {"path": name}
        caps = capabilities_of(store)
        if caps.runs is not None:
            assert (await caps.runs.open_runs("s"))[0].data == {"note": name}
        await store.append("s", ledger=[started.ended("completed", result)])
        split_pair = "a pair " + chr(0xD83D) + chr(0xDE00)  # a UTF-16 pair left as two halves
        await store.append("s", messages=[Message.user(split_pair)])
        assert (await store.load_messages("s", 3))[0].content == "a pair 😀"

    async def test_non_json_values_read_back_as_their_json_form(self, store: Any) -> None:
        when = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
        value = {"when": when, "pair": (1, 2), "nested": _deep(100), "nan": float("inf")}
        msg = Message(role="tool", content="x", tool_call_id="c", name="t", metadata=value)
        await store.append(
            "s",
            messages=[msg],
            events=[_ev("r1", 0, EventType.TOOL_RESULT, **value)],
            ledger=[LedgerEntry("r1", "s", "c", "t", "started", dict(value))],
        )
        expected = {
            "when": "2024-05-06T07:08:09Z",
            "pair": [1, 2],
            "nested": _deep(100),
            "nan": float("inf"),
        }
        assert (await store.load_messages("s"))[0].metadata == expected
        assert (await store.load_events("s"))[0].extra == expected
        assert (await store.open_tool_calls("s"))[0].arguments == expected
        # A float field holding NaN reads back (a model's own JSON form would write null,
        # which the field then refuses: a session that could not be loaded any more).
        odd = ToolResult(tool_call_id="c", name="t", data=value, duration_ms=float("nan"))
        await store.append(
            "s", messages=[Message(role="tool", content="y", metadata={"result": odd})]
        )
        back = ToolResult.model_validate((await store.load_messages("s", 1))[0].metadata["result"])
        assert back.data == expected and back.duration_ms != back.duration_ms  # NaN

    @pytest.mark.parametrize("case", ["object", "cycle", "too_deep", "bad_bytes"])
    async def test_unstorable_values_fail_typed_and_commit_nothing(
        self, store: Any, case: str
    ) -> None:
        cycle: dict[str, Any] = {}
        cycle["self"] = cycle
        bad: Any = {
            "object": object(),
            "cycle": cycle,
            "too_deep": _deep(1000),
            "bad_bytes": b"\xff\xfe",
        }[case]
        why = {
            "object": "no JSON form",
            "cycle": "refers to itself",
            "too_deep": "nested more than",
            "bad_bytes": "no JSON form",
        }[case]
        call = _started("r1", "c1")
        result = ToolResult(tool_call_id="c1", name="t", data={"value": bad})
        attempts: list[tuple[str, dict[str, Any]]] = [
            (
                r"tool message\.metadata\['value'\]",
                {
                    "messages": [
                        Message.user("ok"),
                        Message(role="tool", content="x", metadata={"value": bad}),
                    ]
                },
            ),
            (
                r"tool_result event data\['value'\]",
                {"events": [_ev("r1", 0, EventType.TOOL_RESULT, value=bad)]},
            ),
            (
                r"result of tool call 't'\.data\['value'\]",
                {"ledger": [call.ended("completed", result)]},
            ),
            (
                r"arguments of tool call 't'\['value'\]",
                {"ledger": [LedgerEntry("r1", "s", "c2", "t", "started", {"value": bad})]},
            ),
            (
                r"data of run record 'running'\['value'\]",
                {"run": RunRecord("r1", "s", "running", data={"value": bad})},
            ),
        ]
        for where, parts in attempts:
            # Valid parts come with the bad one: it must stop all of them.
            step: dict[str, Any] = {"messages": [Message.user("ok")], "ledger": [call], **parts}
            with pytest.raises(SerializationError, match=f"{where}.*{why}"):
                await store.append("s", **step)
        await _nothing_stored(store, "s")

    # -- optional: media stored once (BlobStore) -------------------------------------------------
    async def test_blobs_round_trip(self, store: Any) -> None:
        _needs(store, "blobs")
        png, pdf = _png(70_000), b"%PDF-1.7\n" + os.urandom(3000)
        await store.append("s", messages=[Message.user("files")])
        await store.put_blobs("s", [_blob(png), _blob(pdf, "application/pdf"), _blob(png)])
        got = await store.load_blobs([media_ref(pdf), media_ref(png), "sha256:" + "0" * 64])
        assert got == {media_ref(png): png, media_ref(pdf): pdf}  # a missing ref is absent
        assert await store.load_blobs([]) == {}
        assert await store.session_blobs("s") == [
            (media_ref(png), "image/png", len(png)),
            (media_ref(pdf), "application/pdf", len(pdf)),
        ]
        assert await store.session_blobs("other") == []

    async def test_media_in_two_sessions_stored_once_deleted_with_the_last(
        self, store: Any
    ) -> None:
        _needs(store, "blobs")
        png = _png(200_000)
        ref = media_ref(png)
        for sid in ("s1", "s2"):
            await store.append(sid, messages=[Message.user(sid)])
            await store.put_blobs(sid, [_blob(png)])
        await store.put_blobs("s1", [_blob(png)])  # again: nothing new
        assert await _usage(store) in (None, (1, len(png)))
        assert await store.session_blobs("s1") == await store.session_blobs("s2")
        assert await store.delete_session("s1")
        assert await store.load_blobs([ref]) == {ref: png}  # s2 still names it
        assert await store.session_blobs("s1") == []
        assert await _usage(store) in (None, (1, len(png)))
        assert await store.delete_session("s2")
        assert await store.load_blobs([ref]) == {}
        assert await _usage(store) in (None, (0, 0))

    async def test_put_blobs_refuses_what_it_must_not_keep(self, store: Any) -> None:
        _needs(store, "blobs")
        await store.append("s", messages=[Message.user("x")])
        small, too_big = _png(1000), _png(MAX_MEDIA_BYTES + 1)
        with pytest.raises(MediaTooLarge) as info:  # bytes that bypassed loom.content's check
            await store.put_blobs("s", [_blob(small), _blob(too_big)])
        assert (info.value.size, info.value.limit) == (len(too_big), MAX_MEDIA_BYTES)
        with pytest.raises(ContentError, match="not the sha256"):
            await store.put_blobs("s", [Blob(media_ref(b"other"), "image/png", small)])
        assert await store.load_blobs([media_ref(small)]) == {}  # nothing of either put
        assert await store.session_blobs("s") == []

    async def test_image_run_resumes_on_a_new_runtime(self, store: Any) -> None:
        _needs(store, "blobs")
        from loom.agent import Agent
        from loom.engine.run_inputs import NewMessage
        from loom.engine.runtime import Runtime
        from loom.testing import FunctionModel

        png = _png(50_000)
        seen: list[list[bytes | None]] = []

        def look(messages: list[Message], tools: Any) -> str:
            seen.append([p.data for m in messages for p in m.parts if isinstance(p, Image)])
            return f"call {len(seen)}"

        agent = Agent(model=FunctionModel(look))
        first = Runtime(store=store)
        await first.run(
            agent, NewMessage("what is this?", (Image.from_bytes(png),)), session_id="s"
        )
        stored = await store.load_messages("s")
        part = stored[0].parts[0]
        assert isinstance(part, Image)
        assert (part.ref, part.size, part.data) == (media_ref(png), len(png), None)  # a ref
        events = await store.load_events("s")
        asked = [e for e in events if e.type is EventType.USER_MESSAGE]
        assert [p.ref for p in asked[0].message().parts] == [media_ref(png)]
        again = Runtime(store=store)  # a new process: nothing of the first one's memory
        await again.run(agent, "and now?", session_id="s")
        assert seen == [[png], [png]]  # the second model call saw the stored bytes
        assert await _usage(store) in (None, (1, len(png)))

    async def test_media_stored_before_the_step_that_names_them(self, store: Any) -> None:
        _needs(store, "blobs")
        from loom.agent import Agent
        from loom.engine.run_inputs import NewMessage
        from loom.engine.runtime import Runtime
        from loom.testing import FunctionModel

        calls: list[int] = []

        def answer(messages: list[Message], tools: Any) -> str:
            calls.append(1)
            return "should not be asked"

        agent = Agent(model=FunctionModel(answer))
        failing = Runtime(store=FailingBlobs(store))
        with pytest.raises(StoreError, match="storing media failed"):
            await failing.run(
                agent, NewMessage("see", (Image.from_bytes(_png(500)),)), session_id="s"
            )
        assert calls == []  # the model was never asked
        assert await store.load_messages("s") == []
        assert [e for e in await store.load_events("s") if e.type is EventType.USER_MESSAGE] == []
        assert await store.session_blobs("s") == []

    # -- optional: branches (rewind, fork) ---------------------------------------------------------
    async def test_rewind_round_trip(self, store: Any) -> None:
        _needs(store, "branches")
        runtime, agent = await _branchy(store, "s", turns=4)
        before = await store.load_messages("s")
        result = await runtime.run(agent, Rewind(AtTurn(2)), session_id="s")
        assert result.stop_reason == "rewound"
        after = await store.load_messages("s")
        assert after[: len(after) - 1] == before[:8] and after[-1].metadata.get("branch_note")
        await _consistent(store, "s")
        await runtime.run(agent, "again", session_id="s")  # the session carries on from there
        await _consistent(store, "s")
        assert (await store.get_session("s")).message_count == len(after) + 4

    async def test_rewind_with_a_stale_lease_writes_nothing(self, store: Any) -> None:
        _needs(store, "branches")
        await _branchy(store, "s", turns=2)
        messages, events = await store.load_messages("s"), await store.load_events("s")
        old = await store.acquire_lease("s", "r1", 30)
        await store.release_lease(old)
        await store.acquire_lease("s", "r2", 30)
        branch = make_event(EventType.SESSION_BRANCH, "r1", "s", 0, 0, {"at": 1})
        with pytest.raises(LeaseLost):
            await store.rewind("s", 1, messages=[], events=[branch], lease=old)
        assert await store.load_messages("s") == messages
        assert len(await store.load_events("s")) == len(events)
        with pytest.raises(InputError):
            await store.rewind("s", len(messages) + 1, messages=[], events=[branch])

    async def test_engine_branches(self, store: Any) -> None:
        _needs(store, "branches")
        runtime, agent = await _branchy(store, "s", turns=3)
        before = await store.load_messages("s")
        result = await runtime.run(agent, Regenerate(), session_id="s")
        assert result.stop_reason != "rewound"
        await _consistent(store, "s")
        after = await store.load_messages("s")
        assert after[:9] == before[:9] and len(after) == len(before) + 1  # + the note
        await runtime.run(agent, Edit(1, "edited"), session_id="s")
        await _consistent(store, "s")
        edited = await store.load_messages("s")
        assert edited[:4] == before[:4] and "edited" in [m.content for m in edited[4:]]
        assert len(await store.ledger("s")) == 10  # 5 calls: the ledger keeps every one

    async def test_fork_reads_share_the_prefix(self, store: Any) -> None:
        _needs(store, "branches")
        runtime, agent = await _branchy(store, "s", turns=4)
        source = await _snapshot(store, "s")
        new = await runtime.fork(agent, "s", AtTurn(2), new_session_id="f")
        assert new == "f"
        at, own = await _fork_parts(store, "f")
        assert at == 8
        await _same_reads(store, "f", "s", at, own)
        await runtime.run(agent, "in the fork", session_id="f")  # the fork carries on
        at, own = await _fork_parts(store, "f")
        await _same_reads(store, "f", "s", at, own)
        await _consistent(store, "f")
        assert await _snapshot(store, "s") == source  # the source is unchanged
        with pytest.raises(InputError):
            await store.fork("s", "f", 0, 0, messages=[], events=[])
        with pytest.raises(InputError):
            await store.fork("s", "g", 999, 0, messages=[], events=[])
        with pytest.raises(InputError):
            await store.fork("nope", "g", 0, 0, messages=[], events=[])

    async def test_fork_of_a_fork_and_rewinds_below_the_share(self, store: Any) -> None:
        _needs(store, "branches")
        runtime, agent = await _branchy(store, "s", turns=4)
        source = await _snapshot(store, "s")
        await runtime.fork(agent, "s", AtTurn(3), new_session_id="f")
        await runtime.run(agent, "f's own", session_id="f")
        await runtime.fork(agent, "f", None, new_session_id="g")  # all of f
        g_before = await _snapshot(store, "g")
        assert g_before[0] == (await _snapshot(store, "f"))[0]
        await runtime.run(agent, "g's own", session_id="g")
        await _consistent(store, "g")
        at, own = await _fork_parts(store, "g", "f")
        await _same_reads(store, "g", "f", at, own)  # f's reads are s's prefix, then f's own
        f_before = await _snapshot(store, "f")
        # a rewind of g below what it shares: its own transcript, nobody else's
        await runtime.run(agent, Rewind(AtTurn(1)), session_id="g")
        await _consistent(store, "g")
        assert (await store.load_messages("g"))[:4] == f_before[0][:4]
        assert await _snapshot(store, "f") == f_before
        # the source rewound below what f (and through it g) shares: f does not change
        g_now = await _snapshot(store, "g")
        await runtime.run(agent, Rewind(AtTurn(0)), session_id="s")
        await _consistent(store, "s")
        assert await _snapshot(store, "f") == f_before
        assert await _snapshot(store, "g") == g_now
        await _consistent(store, "f")
        assert (await _snapshot(store, "s"))[0] != source[0]
        # the ledger of f still knows the calls of the turns it shared
        known = {e.tool_call_id for e in await store.ledger("f")}
        assert {m.tool_call_id for m in f_before[0] if m.role == "tool"} <= known
        await runtime.run(agent, "f again", session_id="f")
        await _consistent(store, "f")

    async def test_fork_ledger_and_counts(self, store: Any) -> None:
        _needs(store, "branches")
        runtime, agent = await _branchy(store, "s", turns=3)
        await runtime.fork(agent, "s", AtTurn(1), new_session_id="f")
        shared = {m.tool_call_id for m in (await store.load_messages("s"))[:3] if m.role == "tool"}
        ledger = await store.ledger("f")
        assert {e.tool_call_id for e in ledger} == shared and len(ledger) == 2
        assert all(e.session_id == "f" for e in ledger)
        assert await store.open_tool_calls("f") == []
        info = await store.get_session("f")
        assert info is not None and info.message_count == await store.message_count("f")
        assert info.agent_name == agent.name
        # a fork with nothing of its own yet
        events = await store.load_events("s")
        await store.fork("s", "bare", 3, 4, messages=[], events=[])
        assert await store.message_count("bare") == 3
        assert (await store.get_session("bare")).message_count == 3
        assert [e.sequence for e in await store.load_events("bare")] == [
            e.sequence for e in events[:4]
        ]
        await store.append("bare", messages=[Message.user("mine")], events=[_ev("rb", 0)])
        assert [m.content for m in await store.load_messages("bare", 2)][1:] == ["mine"]
        assert len(await store.load_events("bare")) == 5

    async def test_a_fork_names_the_media_it_shares(self, store: Any) -> None:
        _needs(store, "branches")
        _needs(store, "blobs")
        from loom.agent import Agent
        from loom.engine.run_inputs import NewMessage
        from loom.engine.runtime import Runtime
        from loom.testing import FunctionModel

        png = _png(2_000)
        agent = Agent(model=FunctionModel(lambda messages, tools: "seen"))
        runtime = Runtime(store=store)
        await runtime.run(agent, NewMessage("look", (Image.from_bytes(png),)), session_id="s")
        await runtime.fork(agent, "s", None, new_session_id="f")
        assert await store.session_blobs("f") == await store.session_blobs("s") != []
        part = (await store.load_messages("f"))[0].parts[0]
        assert isinstance(part, Image)
        if hasattr(store, "forks"):  # the SQL stores: the fork shares the source's rows
            with pytest.raises(InputError, match="forks"):
                await store.delete_session("s")
            assert await store.forks("s") == ["f"]
            assert await store.delete_session("f") and await store.delete_session("s")
        else:  # a store that copies: the fork outlives its source, media included
            assert await store.delete_session("s")
            assert await store.load_blobs([part.ref]) == {part.ref: png}
            assert await store.delete_session("f")
        assert await store.load_blobs([part.ref]) == {}  # gone with the last session naming it

    # -- optional: errors, results, key-values ----------------------------------------------------
    async def test_error_store(self, store: Any) -> None:
        _needs(store, "errors")
        old = utcnow() - timedelta(days=40)
        stored = [
            StoredError(new_error_id(old), "s1", "fetch", {"message": "old"}, "old", old),
            StoredError(new_error_id(), "s1", "fetch", {"message": "x" * 3000, "n": 1}, "x"),
            StoredError(new_error_id(), "s2", "write", {"message": "y"}, "y", run_id="r"),
        ]
        for e in stored:
            assert await store.save_error(e) == e.id
        got = await store.get_error(stored[1].id)
        assert got is not None and got.raw_error == {"message": "x" * 3000, "n": 1}
        assert (got.session_id, got.tool_name, got.short_summary) == ("s1", "fetch", "x")
        assert await store.get_error("err_20000101_000000_000000") is None
        assert {e.id for e in await store.list_errors(session_id="s1")} == {
            stored[0].id,
            stored[1].id,
        }
        assert [e.id for e in await store.list_errors(tool_name="write")] == [stored[2].id]
        recent = await store.list_errors(since=utcnow() - timedelta(days=1))
        assert {e.id for e in recent} == {stored[1].id, stored[2].id}
        assert [e.id for e in await store.list_errors(until=utcnow() - timedelta(days=1))] == [
            stored[0].id
        ]
        assert len(await store.list_errors(limit=1)) == 1
        assert await store.list_errors(session_id="s1'; DROP TABLE errors; --") == []
        assert await store.delete_errors(utcnow() - timedelta(days=30)) == 1
        assert await store.get_error(stored[0].id) is None
        assert len(await store.list_errors(limit=0)) == 2

    async def test_result_store(self, store: Any) -> None:
        _needs(store, "results")
        content = "line\n" * 50_000
        ref = await store.save_result(StoredResult("res_1", "s", "dump", content, "r", "c"))
        got = await store.get_result(ref)
        assert got is not None and got.content == content and got.session_id == "s"
        assert await store.get_result("res_missing") is None

    async def test_kv_store(self, store: Any) -> None:
        _needs(store, "kv")
        await store.put_value("mem", "s1/l2", {"summary": "x", "n": [1]})
        await store.put_value("mem", "s1/l2", {"summary": "y"})
        await store.put_value("mem", "s2/l2", 3)
        await store.put_value("other", "s1/l2", True)
        assert await store.get_value("mem", "s1/l2") == {"summary": "y"}
        assert await store.list_keys("mem") == ["s1/l2", "s2/l2"]
        assert await store.list_keys("mem", "s1") == ["s1/l2"]
        assert await store.delete_value("mem", "s1/l2")
        assert not await store.delete_value("mem", "s1/l2")
        assert await store.get_value("mem", "s1/l2") is None

    # -- items: memory across sessions (``loom.store.items``) -----------------------------------
    async def test_item_round_trip(self, store: Any) -> None:
        _needs(store, "items")
        value = {"text": "likes green tea", "n": 2, "tags": ["a", "é"], "deep": {"x": None}}
        put = await store.put_item(("users", "alice"), "pref", value, owner="alice")
        assert put.namespace == ("users", "alice") and put.key == "pref" and put.value == value
        assert put.owner == "alice" and put.expires_at is None and put.score is None
        got = await store.get_item(["users", "alice"], "pref", owner="alice")
        assert got is not None and got.value == value and got.owner == "alice"
        assert got.created_at == put.created_at and got.updated_at == put.updated_at
        assert await store.get_item(("users", "alice"), "other") is None
        assert await store.get_item(("users",), "pref") is None
        assert await store.delete_item(("users", "alice"), "pref", owner="alice")
        assert not await store.delete_item(("users", "alice"), "pref", owner="alice")
        assert await store.get_item(("users", "alice"), "pref") is None

    async def test_item_replace_keeps_created_at(self, store: Any) -> None:
        _needs(store, "items")
        first = await store.put_item(("m",), "k", {"v": 1})
        await _until_past(first.updated_at)  # a later clock reading for the replace
        second = await store.put_item(("m",), "k", {"v": 2})
        assert second.created_at == first.created_at and second.updated_at > first.updated_at
        got = await store.get_item(("m",), "k")
        assert got is not None and got.value == {"v": 2} and got.created_at == first.created_at
        assert [i.key for i in await store.search_items(("m",))] == ["k"]

    async def test_item_ttl_expires(self, store: Any) -> None:
        _needs(store, "items")
        put = await store.put_item(("m",), "brief", {"text": "soon gone"}, ttl=0.5)
        await store.put_item(("m",), "kept", {"text": "stays"})
        assert put.expires_at is not None and put.expires_at > put.created_at
        before = await store.get_item(("m",), "brief")
        if datetime.now(UTC) < put.expires_at:  # read before the expiry (a loaded host may not)
            assert before is not None
        await _until_past(put.expires_at)  # the ttl running out is what is tested
        assert await store.get_item(("m",), "brief") is None
        assert [i.key for i in await store.search_items(("m",))] == ["kept"]
        assert [i.key for i in await store.search_items(("m",), query="gone")] == []
        assert not await store.delete_item(("m",), "brief")
        again = await store.put_item(("m",), "brief", {"text": "back"})  # a new item
        assert again.created_at > put.created_at and again.expires_at is None

    async def test_item_owners(self, store: Any) -> None:
        _needs(store, "items")
        await store.put_item(("notes",), "a", {"text": "alice's secret"}, owner="alice")
        await store.put_item(("notes",), "b", {"text": "bob's secret"}, owner="bob")
        assert await store.get_item(("notes",), "a", owner="bob") is None
        with pytest.raises(ItemOwned):
            await store.put_item(("notes",), "a", {"text": "hijack"}, owner="bob")
        got = await store.get_item(("notes",), "a", owner="alice")
        assert got is not None and got.value == {"text": "alice's secret"}  # nothing written
        assert not await store.delete_item(("notes",), "a", owner="bob")
        assert [i.key for i in await store.search_items(("notes",), owner="bob")] == ["b"]
        hits = await store.search_items(("notes",), query="secret", owner="bob")
        assert [i.key for i in hits] == ["b"]
        assert sorted(i.key for i in await store.search_items(("notes",))) == ["a", "b"]
        assert await store.get_item(("notes",), "a") is not None  # owner=None sees all
        assert await store.list_namespaces(owner="carol") == []
        assert await store.list_namespaces(owner="bob") == [("notes",)]

    async def test_item_keyword_search_ranks_the_better_match_first(self, store: Any) -> None:
        _needs(store, "items")
        ns = ("mem", "u1")
        await store.put_item(ns, "weak", {"text": "the weather was fine and the tea was cold"})
        await store.put_item(ns, "strong", {"text": "green tea, always green tea"})
        await store.put_item(ns, "none", {"text": "coffee in the morning"})
        await store.put_item(("elsewhere",), "out", {"text": "green tea"})
        hits = await store.search_items(("mem",), query="green tea")
        assert [i.key for i in hits] == ["strong", "weak"]
        assert hits[0].score is not None and hits[1].score is not None
        assert hits[0].score > hits[1].score > 0
        assert await store.search_items(("mem",), query="zebra") == []
        assert await store.search_items(("mem",), query="!!") == []

    async def test_item_filter_prefix_offset_limit(self, store: Any) -> None:
        _needs(store, "items")
        for i in range(6):
            ns = ("a", "b") if i % 2 else ("a", "b_c")
            await store.put_item(ns, f"k{i}", {"kind": "fact" if i < 4 else "pref", "i": i})
        await store.put_item(("a",), "top", {"kind": "fact", "flag": True, "none": None})
        await store.put_item(("ab",), "not_under", {"kind": "fact"})
        under_b = await store.search_items(("a", "b"))
        assert sorted(i.key for i in under_b) == ["k1", "k3", "k5"]  # not ("a", "b_c")
        under_a = await store.search_items(("a",), limit=MAX_LIMIT)
        assert len(under_a) == 7 and "not_under" not in {i.key for i in under_a}
        assert len(await store.search_items((), limit=MAX_LIMIT)) == 8
        facts = await store.search_items(("a",), filter={"kind": "fact"}, limit=100)
        assert sorted(i.key for i in facts) == ["k0", "k1", "k2", "k3", "top"]
        both = await store.search_items(("a",), filter={"kind": "fact", "i": 2})
        assert [i.key for i in both] == ["k2"]
        flagged = await store.search_items((), filter={"flag": True, "none": None})
        assert [i.key for i in flagged] == ["top"]
        assert await store.search_items((), filter={"kind": "nothing"}) == []
        newest_first = [i.key for i in under_a]
        page = await store.search_items(("a",), limit=2, offset=3)
        assert [i.key for i in page] == newest_first[3:5]
        assert await store.search_items(("a",), offset=50) == []

    async def test_item_prefix_is_exact_and_case_sensitive(self, store: Any) -> None:
        _needs(store, "items")
        for ns in [("Users",), ("users",), ("users", "al"), ("users-x",), ("users_",), ("user",)]:
            await store.put_item(ns, "k", {"text": "hello"})
        for query in (None, "hello"):
            under = await store.search_items(("users",), query=query, limit=MAX_LIMIT)
            assert sorted(i.namespace for i in under) == [("users",), ("users", "al")]
        assert await store.list_namespaces(prefix=("Users",)) == [("Users",)]

    async def test_item_list_namespaces(self, store: Any) -> None:
        _needs(store, "items")
        for ns in [("users", "al", "prefs"), ("users", "al", "facts"), ("users", "bo", "prefs")]:
            await store.put_item(ns, "k", {"x": 1})
        await store.put_item(("docs",), "k", {"x": 1})
        assert await store.list_namespaces() == [
            ("docs",),
            ("users", "al", "facts"),
            ("users", "al", "prefs"),
            ("users", "bo", "prefs"),
        ]
        assert await store.list_namespaces(prefix=("users", "al")) == [
            ("users", "al", "facts"),
            ("users", "al", "prefs"),
        ]
        assert await store.list_namespaces(suffix=("prefs",)) == [
            ("users", "al", "prefs"),
            ("users", "bo", "prefs"),
        ]
        assert await store.list_namespaces(max_depth=2) == [
            ("docs",),
            ("users", "al"),
            ("users", "bo"),
        ]
        assert await store.list_namespaces(prefix=("users",), max_depth=1) == [("users",)]
        assert await store.list_namespaces(limit=1, offset=1) == [("users", "al", "facts")]

    async def test_delete_owner_items(self, store: Any) -> None:
        _needs(store, "items")
        await store.put_item(("u", "al"), "a", {"text": "one"}, owner="alice")
        await store.put_item(("u", "al", "deep"), "b", {"text": "two"}, owner="alice")
        await store.put_item(("u", "bo"), "c", {"text": "one"}, owner="bob")
        await store.put_item(("shared",), "d", {"text": "one"})
        assert await store.delete_owner_items("alice") == 2
        assert await store.delete_owner_items("alice") == 0
        assert sorted(i.key for i in await store.search_items((), query="one")) == ["c", "d"]
        assert await store.search_items((), owner="alice") == []
        assert await store.list_namespaces() == [("shared",), ("u", "bo")]
        # the key is free again, for anyone
        await store.put_item(("u", "al"), "a", {"text": "new"}, owner="bob")

    async def test_purge_expired_items(self, store: Any) -> None:
        _needs(store, "items")
        brief = await store.put_item(("m",), "brief", {"text": "purged words"}, ttl=60)
        await store.put_item(("m", "deep"), "later", {"text": "kept words"}, ttl=3600)
        await store.put_item(("m",), "kept", {"text": "kept forever"}, owner="alice")
        assert brief.expires_at is not None
        assert await store.purge_expired_items(brief.expires_at - timedelta(seconds=1)) == 0
        assert await store.purge_expired_items(brief.expires_at + timedelta(seconds=1)) == 1
        assert await store.purge_expired_items(brief.expires_at + timedelta(seconds=1)) == 0
        assert sorted(i.key for i in await store.search_items((), limit=10)) == ["kept", "later"]
        assert [i.key for i in await store.search_items((), query="purged")] == []
        assert sorted(i.key for i in await store.search_items((), query="words")) == ["later"]
        # the key is free again: a new item, not the purged one's words or times
        again = await store.put_item(("m",), "brief", {"text": "back"})
        assert again.created_at >= brief.created_at and again.expires_at is None
        assert [i.key for i in await store.search_items((), query="back")] == ["brief"]

    async def test_item_bad_input_is_typed(self, store: Any) -> None:
        _needs(store, "items")
        bad_puts: list[tuple[Any, Any, Any, dict[str, Any]]] = [
            ("users.alice", "k", {}, {}),
            ((), "k", {}, {}),
            (("a.b",), "k", {}, {}),
            (("",), "k", {}, {}),
            (tuple("abcdefghijk"), "k", {}, {}),
            (("a",), "", {}, {}),
            (("a",), 3, {}, {}),
            (("a",), "k", ["not", "an", "object"], {}),
            (("a",), "k", {"x": object()}, {}),
            (("a",), "k", {"x": "y" * 1_100_000}, {}),
            (("a",), "k", {}, {"ttl": 0}),
            (("a",), "k", {}, {"ttl": True}),
        ]
        for ns, key, value, kw in bad_puts:
            with pytest.raises(InputError):
                await store.put_item(ns, key, value, **kw)
        assert await store.search_items((), limit=MAX_LIMIT) == []  # nothing was written
        bad_searches: list[dict[str, Any]] = [
            {"limit": 0},
            {"limit": MAX_LIMIT + 1},
            {"offset": -1},
            {"filter": [1]},
        ]
        for search in bad_searches:
            with pytest.raises(InputError):
                await store.search_items((), **search)
        with pytest.raises(InputError):
            await store.search_items("a.b")
        with pytest.raises(InputError):
            await store.list_namespaces(max_depth=0)
        with pytest.raises(InputError):
            await store.list_namespaces(prefix=("a.b",))
        with pytest.raises(InputError):
            await store.get_item(("a",), "")

    # -- budgets (loom.budgets on the ScheduleTables SQL channel, migration 0012) ----------------
    async def test_budget_reservations_are_atomic_and_reconciled(self, store: Any) -> None:
        _needs(store, "schedules")
        from loom.budgets import BudgetGuard, BudgetLimit, BudgetLimitReached, SQLBudgetLedger

        now = [1_800_000_000.0]
        guard = BudgetGuard(
            [BudgetLimit("global", "day", max_tokens=1000)],
            SQLBudgetLedger(store),
            clock=lambda: now[0],
            reservation_ttl=60,
        )
        who: dict[str, Any] = {"run_id": "r", "session_id": "s", "owner": None, "tenant": None}
        calls = [
            guard.reserve(**who, model="m", price=None, input_tokens=100, max_output_tokens=100)
            for _ in range(8)
        ]
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        held = [o for o in outcomes if not isinstance(o, BaseException)]
        assert len(held) == 5  # 5 x 200 fit in 1000, racing or not
        assert all(isinstance(o, BudgetLimitReached) for o in outcomes if o not in held)
        for h in held:
            await guard.settle(h, 50, 0, None)  # each used 50: 750 come back
        (row,) = await guard.ledger.spend()
        assert (row.spent_tokens, row.reserved_tokens) == (250, 0)
        crashed = await guard.reserve(
            **who, model="m", price=None, input_tokens=700, max_output_tokens=0
        )
        assert crashed.tokens == 700  # never settled: its process died
        with pytest.raises(BudgetLimitReached):
            await guard.reserve(**who, model="m", price=None, input_tokens=100, max_output_tokens=0)
        now[0] += 61  # its lease ran out: the next reservation sweeps it
        await guard.reserve(**who, model="m", price=None, input_tokens=700, max_output_tokens=0)
        now[0] += 86_400  # a new day: a new bucket
        await guard.reserve(**who, model="m", price=None, input_tokens=1000, max_output_tokens=0)

    # -- item vectors: semantic and hybrid search (``loom.store.items_vectors``) ----------------
    # These take the ``open_vector_store`` fixture: ``await open_vector_store(embedder)`` opens
    # a store of this kind with that embedder, every call on the same (fresh) database; a
    # suite without it skips them. ``vectors_persist = False`` for a store that cannot be
    # reopened (``MemoryStore``): its re-open test skips.
    vectors_persist = True

    @pytest.fixture
    def open_vector_store(self) -> Any:
        pytest.skip("this suite gives no open_vector_store fixture")

    async def test_item_semantic_search_ranks_by_similarity(self, open_vector_store: Any) -> None:
        store = await open_vector_store(HashEmbedder(64))
        assert id(capabilities_of(store).vectors) == id(store)  # (`is` would narrow `store`)
        ns = ("mem", "u1")
        await store.put_item(ns, "strong", {"text": "Green tea, green tea!"})
        await store.put_item(ns, "weak", {"text": "the weather was fine and the tea was cold"})
        await store.put_item(ns, "none", {"text": "coffee in the morning"})
        await store.put_item(("elsewhere",), "out", {"text": "green tea"})
        hits = await store.search_items(("mem",), query="green tea", mode="semantic")
        assert [i.key for i in hits] == ["strong", "weak", "none"]  # every embedded candidate
        scores = [i.score for i in hits]
        assert all(s is not None and -1.0001 <= s <= 1.0001 for s in scores)
        assert scores[0] > scores[1] > scores[2]
        assert scores[0] == pytest.approx(1.0, abs=0.05)  # "green tea" twice: the same direction
        page = await store.search_items(("mem",), query="green tea", mode="semantic", offset=1)
        assert [i.key for i in page] == ["weak", "none"]
        keyword = await store.search_items(("mem",), query="green tea", mode="keyword")
        assert [i.key for i in keyword] == ["strong", "weak"]
        hybrid = await store.search_items(("mem",), query="green tea")  # the default with one
        assert [i.key for i in hybrid] == ["strong", "weak", "none"]
        assert hybrid[0].score == pytest.approx(2 / (RRF_K + 1))  # first in both rankings
        assert hybrid == await store.search_items(("mem",), query="green tea", mode="hybrid")
        assert await store.search_items(("mem",), query="!!", mode="keyword") == []
        newest = await store.search_items(("mem",), mode="semantic")  # no query: newest first
        assert [i.key for i in newest] == ["none", "weak", "strong"]
        with pytest.raises(InputError):
            await store.search_items(("mem",), query="tea", mode="fuzzy")

    async def test_item_semantic_needs_an_embedder(self, store: Any) -> None:
        _needs(store, "items")
        if getattr(store, "embedder", None) is not None:
            pytest.skip("this store has an embedder")
        assert capabilities_of(store).vectors is None
        await store.put_item(("m",), "k", {"text": "green tea"})
        assert [i.key for i in await store.search_items(("m",), query="tea")] == ["k"]
        for mode in ("semantic", "hybrid"):
            with pytest.raises(InputError, match="embedder"):
                await store.search_items(("m",), query="tea", mode=mode)

    async def test_item_semantic_conditions_come_before_the_limit(
        self, open_vector_store: Any
    ) -> None:
        store = await open_vector_store(HashEmbedder(64))
        for n in range(12):  # bob's items are closer to the query than alice's
            await store.put_item(("notes",), f"bob{n}", {"text": "green tea"}, owner="bob")
        await store.put_item(("notes",), "al", {"text": "green tea and cake"}, owner="alice")
        await store.put_item(("notes", "x"), "al2", {"text": "green", "kind": "x"}, owner="alice")
        await store.put_item(("other",), "al3", {"text": "green tea"}, owner="alice")
        for mode in ("semantic", "hybrid"):
            mine = await store.search_items(
                ("notes",), query="green tea", mode=mode, owner="alice", limit=1
            )
            assert [i.key for i in mine] == ["al"]
            kind = await store.search_items(
                (), query="green tea", mode=mode, filter={"kind": "x"}, limit=1
            )
            assert [i.key for i in kind] == ["al2"]
            assert await store.search_items(("notes",), query="tea", mode=mode, owner="eve") == []

    async def test_item_index_false_and_fields(self, open_vector_store: Any) -> None:
        embedder = HashEmbedder(64)
        store = await open_vector_store(embedder)
        await store.put_item(("m",), "plain", {"text": "green tea"}, index=False)
        await store.put_item(
            ("m",), "titled", {"title": "coffee", "body": "green tea"}, index=["title"]
        )
        await store.put_item(("m",), "nested", {"a": {"b": "green tea"}, "c": "x"}, index=["a.b"])
        hits = await store.search_items(("m",), query="green tea", mode="semantic")
        assert [i.key for i in hits] == ["nested", "titled"]  # not "plain": it has no vector
        assert hits[1].score == pytest.approx(0.0)  # only its title, "coffee", was embedded
        words = await store.search_items(("m",), query="green tea", mode="keyword")
        assert sorted(i.key for i in words) == ["nested", "plain", "titled"]  # words: all of it
        calls = embedder.calls
        await store.put_item(("m",), "nested", {"a": {"b": "green tea"}}, index=False)  # replaced
        assert embedder.calls == calls  # index=False embeds nothing
        hits = await store.search_items(("m",), query="green tea", mode="semantic")
        assert [i.key for i in hits] == ["titled"]
        for bad in ("text", [], [""], [3], 1):
            with pytest.raises(InputError):
                await store.put_item(("m",), "bad", {"text": "x"}, index=bad)
        assert await store.get_item(("m",), "bad") is None

    async def test_item_failed_embedding_keeps_the_item(self, open_vector_store: Any) -> None:
        embedder = HashEmbedder(64)
        store = await open_vector_store(embedder)
        await store.put_item(("m",), "first", {"text": "black coffee"})
        embedder.down = True
        put = await store.put_item(("m",), "later", {"text": "green tea"})  # no error: pending
        assert put.key == "later"
        got = await store.get_item(("m",), "later")
        assert got is not None and got.value == {"text": "green tea"}
        words = await store.search_items(("m",), query="green tea", mode="keyword")
        assert [i.key for i in words] == ["later"]
        hybrid = await store.search_items(("m",), query="green tea")  # degrades to keywords
        assert [i.key for i in hybrid] == ["later"]
        with pytest.raises(EmbedderUnavailable):
            await store.search_items(("m",), query="green tea", mode="semantic")
        with pytest.raises(EmbedderUnavailable):
            await store.embed_pending()
        embedder.down = False
        assert await store.embed_pending() == 1
        assert await store.embed_pending() == 0
        hits = await store.search_items(("m",), query="green tea", mode="semantic")
        assert [i.key for i in hits] == ["later", "first"]
        # A later search embeds what is pending on its way.
        embedder.down = True
        await store.put_item(("m",), "third", {"text": "green tea again"})
        embedder.down = False
        hits = await store.search_items(("m",), query="green tea again", mode="semantic")
        assert hits[0].key == "third"

    async def test_item_puts_leave_a_down_embedder_alone_for_a_while(
        self, open_vector_store: Any
    ) -> None:
        embedder = _Attempts(64)
        store = await open_vector_store(embedder)
        embedder.down = True
        for key in ("a", "b"):  # b's put tries a's pending embedding on its way: down
            await store.put_item(("m",), key, {"text": f"item {key}"})
        before = embedder.attempts
        for key in ("c", "d", "e"):
            await store.put_item(("m",), key, {"text": f"item {key}"})
        assert embedder.attempts == before + 3  # each its own attempt, none for the pending
        with pytest.raises(EmbedderUnavailable):
            await store.embed_pending()  # an explicit call always tries
        embedder.down = False
        assert await store.embed_pending() == 5

    async def test_item_wrong_dimension_is_typed_and_keeps_the_item(
        self, open_vector_store: Any
    ) -> None:
        store = await open_vector_store(_Misdeclared(16))
        with pytest.raises(EmbeddingDimensionMismatch) as caught:
            await store.put_item(("m",), "k", {"text": "green tea"})
        assert caught.value.expected == 16 and caught.value.got == 15
        assert "stored" in str(caught.value)
        assert await store.get_item(("m",), "k") is not None
        words = await store.search_items(("m",), query="tea", mode="keyword")
        assert [i.key for i in words] == ["k"]

    async def test_item_vectors_of_another_model_need_a_reindex(
        self, open_vector_store: Any
    ) -> None:
        if not self.vectors_persist:
            pytest.skip("this store cannot be reopened")
        first = await open_vector_store(HashEmbedder(64))
        await first.put_item(("m",), "a", {"text": "green tea"})
        await first.put_item(("m",), "b", {"text": "black coffee"})
        await first.put_item(("m",), "c", {"text": "not embedded"}, index=False)
        for other in (HashEmbedder(32), HashEmbedder(64, name="other-model")):
            store = await open_vector_store(other)
            for mode in ("semantic", "hybrid"):
                with pytest.raises(EmbeddingDimensionMismatch, match="reindex"):
                    await store.search_items(("m",), query="tea", mode=mode)
            words = await store.search_items(("m",), query="tea", mode="keyword")
            assert [i.key for i in words] == ["a"]  # keyword search is unaffected
        store = await open_vector_store(HashEmbedder(32))
        assert await store.reindex_items() == 2
        hits = await store.search_items(("m",), query="green tea", mode="semantic")
        assert [i.key for i in hits] == ["a", "b"]

    async def test_item_deletes_take_their_vectors(self, open_vector_store: Any) -> None:
        embedder = HashEmbedder(64)
        store = await open_vector_store(embedder)
        await store.put_item(("u",), "a", {"text": "green tea"}, owner="alice")
        await store.put_item(("u",), "b", {"text": "green tea"}, owner="alice")
        await store.put_item(("u",), "c", {"text": "green tea"}, owner="bob")
        await store.put_item(("u",), "d", {"text": "green tea"}, ttl=0.3)
        assert await store.delete_item(("u",), "a", owner="alice")
        assert await store.delete_owner_items("alice") == 1
        hits = await store.search_items(("u",), query="green tea", mode="semantic")
        assert sorted(i.key for i in hits) == ["c", "d"]
        d = await store.get_item(("u",), "d")
        if d is not None and d.expires_at is not None:
            await _until_past(d.expires_at)
        hits = await store.search_items(("u",), query="green tea", mode="semantic")
        assert [i.key for i in hits] == ["c"]  # an expired item is not found
        # What is left to re-embed is bob's item alone: no vector outlived its item.
        assert await store.reindex_items() == 1
        # A store reusing a deleted item's row id (SQLite's rowid) gives the next item no
        # leftover vector: the newest item deleted, then one stored with no vector.
        await store.put_item(("u",), "e", {"text": "green tea"}, owner="carol")
        assert await store.delete_item(("u",), "e")
        await store.put_item(("u",), "f", {"text": "green tea"}, index=False)
        await store.put_item(("u",), "g", {"text": "green tea"}, owner="carol")
        assert await store.delete_owner_items("carol") == 1
        await store.put_item(("u",), "h", {"text": "green tea"}, index=False)
        hits = await store.search_items(("u",), query="green tea", mode="semantic")
        assert [i.key for i in hits] == ["c"]


# -- branches: sessions made by the engine, and what a fork must read ----------------------------
async def _branchy(store: Any, session_id: str, turns: int) -> tuple[Any, Any]:
    """A runtime and an agent, and ``session_id`` with ``turns`` turns, each a tool call
    (``idempotent``) and an answer: 4 messages a turn."""
    from loom.agent import Agent
    from loom.engine.runtime import Runtime
    from loom.messages import ModelResponse
    from loom.testing import FunctionModel
    from loom.tools.base import tool

    @tool(effect="idempotent")
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"value of {key}"

    def answer(messages: list[Message], tools: Any) -> ModelResponse | str:
        last = next(m for m in reversed(messages) if m.role != "system")
        if last.role == "user":
            return ModelResponse(
                tool_calls=[ToolCall(name="lookup", arguments={"key": last.content})]
            )
        return f"answer {len(messages)}"

    agent = Agent(model=FunctionModel(answer), tools=[lookup], name="brancher")
    runtime = Runtime(store=store)
    for i in range(turns):
        await runtime.run(agent, f"turn {i}", session_id=session_id)
    return runtime, agent


async def _consistent(store: Any, session_id: str) -> None:
    """The derived transcript the store keeps is the one its journal gives."""
    from loom.engine.journal import transcript

    messages = await store.load_messages(session_id)
    assert messages == transcript(await store.load_events(session_id))
    assert await store.message_count(session_id) == len(messages)
    info = await store.get_session(session_id)
    assert info is not None and info.message_count == len(messages)


def _ids(events: list[AgentEvent]) -> list[tuple[str, int, str]]:
    return [(e.run_id, e.sequence, str(e.type)) for e in events]


async def _snapshot(store: Any, session_id: str) -> tuple[Any, ...]:
    """What every read of a session gives."""
    events = await store.load_events(session_id)
    return (
        await store.load_messages(session_id),
        _ids(events),
        [(e.tool_call_id, e.status) for e in await store.ledger(session_id)],
        await store.message_count(session_id),
    )


def _fork_mark(events: list[AgentEvent], source_id: str) -> int:
    """The position of the ``SESSION_BRANCH`` that forked these events' session from
    ``source_id`` (a fork of a fork also reads its parent's)."""

    return next(
        i
        for i, e in enumerate(events)
        if type(e) is SessionBranch and e.reason == "fork" and e.point["session_id"] == source_id
    )


async def _fork_parts(store: Any, fork_id: str, source_id: str = "s") -> tuple[int, list[Message]]:
    """Where the fork branched off ``source_id`` and its messages since."""
    events = await store.load_events(fork_id)
    first = events[_fork_mark(events, source_id)]
    assert isinstance(first, SessionBranch)
    return first.at, (await store.load_messages(fork_id))[first.at :]


async def _same_reads(
    store: Any, fork_id: str, source_id: str, at: int, own: list[Message]
) -> None:
    """Every read of the fork is the source's prefix and then the fork's own rows."""

    source = await store.load_messages(source_id)
    whole = source[:at] + own
    assert await store.load_messages(fork_id) == whole
    for start in (0, 1, at - 1, at, at + 1, len(whole)):
        if start >= 0:
            assert await store.load_messages(fork_id, start) == whole[start:]
            assert (
                await store.load_message_range(fork_id, start, start + 3)
                == whole[start : start + 3]
            )
    assert await store.message_count(fork_id) == len(whole)
    info = await store.get_session(fork_id)
    assert info is not None and info.message_count == len(whole)
    systems = [(i, m) for i, m in enumerate(whole) if m.role == "system"]
    assert await store.load_system_messages(fork_id) == systems
    events = await store.load_events(fork_id)
    mark = _fork_mark(events, source_id)
    source_events = await store.load_events(source_id)
    assert _ids(events[:mark]) == _ids(source_events[:mark])
    assert all(e.session_id == fork_id for e in events)
    for run_id in {e.run_id for e in events}:
        assert _ids(await store.load_events(fork_id, run_id)) == _ids(
            [e for e in events if e.run_id == run_id]
        )
    kinds = [EventType.USER_MESSAGE, EventType.SESSION_BRANCH]
    typed = [e for e in events if e.type in kinds]
    assert _ids(await store.load_events_of_type(fork_id, kinds)) == _ids(typed)
    for limit in (1, 2, len(typed) + 1):
        latest = await store.load_latest_events(fork_id, kinds, limit)
        assert _ids(latest) == _ids(typed[-limit:])
    await _consistent(store, fork_id)


def _png(size: int) -> bytes:
    """``size`` bytes that start as a PNG does (what ``Image`` checks), random after that."""
    return b"\x89PNG\r\n\x1a\n" + os.urandom(size - 8)


def _blob(data: bytes, media_type: str = "image/png") -> Blob:
    return Blob(media_ref(data), media_type, data)


async def _usage(store: Any) -> tuple[int, int] | None:
    usage = getattr(store, "blob_usage", None)
    return None if usage is None else tuple(await usage())


class FailingBlobs:
    """Wraps a store whose ``put_blobs`` fails (``StoreError``, as a full disk would make it):
    the journal must then commit nothing of the step whose media it was storing. Every other
    attribute is the wrapped store's, bound as instance attributes (see ``CountingStore``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        for name in dir(inner):
            if not name.startswith("_") and callable(value := getattr(inner, name)):
                self.__dict__[name] = value
        self.__dict__["put_blobs"] = self._put_blobs

    async def _put_blobs(self, session_id: str, blobs: Any) -> None:
        raise StoreError(f"storing media failed for session {session_id!r} (a test's store)")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class CountingStore:
    """Wraps a store and counts the rows its reads return, per method (``rows``) and in all
    (``total``): messages, events, ledger entries and run records each count one, a session
    or a count one. Every attribute of the wrapped store is reachable, so
    ``capabilities_of`` sees the same optional capabilities. Used to check that a read does
    not grow with a session (``tests/store/test_resume_reads.py``, ``benchmarks/store_resume.py``).
    """

    _COUNTED = frozenset(
        {
            "get_session",
            "load_messages",
            "load_message_range",
            "message_count",
            "load_events",
            "load_events_of_type",
            "load_latest_events",
            "load_system_messages",
            "open_tool_calls",
            "open_runs",
        }
    )

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.rows: dict[str, int] = {}
        # bound as instance attributes, not through __getattr__: runtime-checkable Protocols
        # look attributes up statically (Python 3.12+), and must find the wrapped ones
        for name in dir(inner):
            if name.startswith("_"):
                continue
            value = getattr(inner, name)
            if callable(value):
                self.__dict__[name] = self._counted(name, value) if name in self._COUNTED else value

    @property
    def total(self) -> int:
        """Rows returned by every counted read since the last ``reset``."""
        return sum(self.rows.values())

    def reset(self) -> None:
        """Start counting from zero."""
        self.rows.clear()

    def _counted(self, name: str, read: Any) -> Any:
        async def counted(*args: Any, **kwargs: Any) -> Any:
            out = await read(*args, **kwargs)
            n = len(out) if isinstance(out, list) else 1 if out is not None else 0
            self.rows[name] = self.rows.get(name, 0) + n
            return out

        return counted

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

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
capabilities (``RunStore``, ``ErrorStore``, ``ResultStore``, ``KVStore``) skip when the store
does not have them. Needs pytest and pytest-asyncio (``asyncio_mode = "auto"``).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from loom.events import AgentEvent, EventType
from loom.messages import Message, ToolCall, ToolResult, Usage, utcnow
from loom.store.base import (
    LedgerEntry,
    LedgerStatus,
    RunRecord,
    StoredError,
    StoredResult,
    new_error_id,
)

__all__ = ["StoreContract"]


def _needs(store: Any, *names: str) -> None:
    missing = [n for n in names if not callable(getattr(store, n, None))]
    if missing:
        pytest.skip(f"{type(store).__name__} does not implement {', '.join(missing)}")


def _ev(run: str, seq: int, kind: EventType = EventType.ITERATION_START, **data: Any) -> AgentEvent:
    return AgentEvent(kind, run, "s", 1, seq, data)


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
        assert every[0].type is EventType.AGENT_START and every[0].data == {"message": "m"}
        assert every[1].data == {"note": {"nested": [1]}}
        assert [e.sequence for e in await store.load_events("s", "r1")] == [0, 1, 2]

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
        _needs(store, "open_runs")
        await store.append("s", run=RunRecord("r1", "s", "running"))
        await store.append("s", run=RunRecord("r2", "s", "running"))
        await store.append("s", run=RunRecord("r1", "s", "completed"))
        assert [r.run_id for r in await store.open_runs("s")] == ["r2"]
        await store.append("s", run=RunRecord("r2", "s", "crashed"))
        assert await store.open_runs("s") == []

    # -- locks ------------------------------------------------------------------------------------
    async def test_lock_excludes_other_runs_until_released(self, store: Any) -> None:
        assert await store.acquire_lock("s", "r1", 60)
        assert not await store.acquire_lock("s", "r2", 60)
        assert await store.acquire_lock("s", "r1", 60)  # the holder may renew
        assert await store.acquire_lock("other", "r2", 60)  # locks are per session
        await store.release_lock("s", "r2")  # not the holder: no effect
        assert not await store.acquire_lock("s", "r3", 60)
        await store.release_lock("s", "r1")
        assert await store.acquire_lock("s", "r3", 60)

    async def test_expired_lock_can_be_taken(self, store: Any) -> None:
        assert await store.acquire_lock("s", "r1", 0.05)
        await asyncio.sleep(0.1)
        assert await store.acquire_lock("s", "r2", 60)
        assert not await store.acquire_lock("s", "r1", 60)

    # -- optional: errors, results, key-values ----------------------------------------------------
    async def test_error_store(self, store: Any) -> None:
        _needs(store, "save_error", "get_error", "list_errors", "delete_errors")
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
        _needs(store, "save_result", "get_result")
        content = "line\n" * 50_000
        ref = await store.save_result(StoredResult("res_1", "s", "dump", content, "r", "c"))
        got = await store.get_result(ref)
        assert got is not None and got.content == content and got.session_id == "s"
        assert await store.get_result("res_missing") is None

    async def test_kv_store(self, store: Any) -> None:
        _needs(store, "put_value", "get_value", "list_keys", "delete_value")
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

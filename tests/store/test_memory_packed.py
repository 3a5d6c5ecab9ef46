"""``MemoryStore`` encodes a commit's rows together (two ``to_json`` calls a commit): reading
from any offset, and a commit that needs the careful per-row path, read back what SQLite
reads back."""

from __future__ import annotations

import math

from loom.messages import Message, ToolResult
from loom.store import MemoryStore
from loom.store.base import LedgerEntry


async def test_load_messages_from_every_offset_across_commits() -> None:
    store = MemoryStore()
    texts = [["a", "b"], ["c"], ["d", "e", "f"]]
    for chunk in texts:
        await store.append("s", messages=[Message.user(t) for t in chunk])
    flat = [t for chunk in texts for t in chunk]
    for start in range(len(flat) + 2):
        got = [m.content for m in await store.load_messages("s", start)]
        assert got == flat[start:], start
    assert await store.message_count("s") == len(flat)


async def test_a_packed_ledger_reads_back_as_its_json() -> None:
    store = MemoryStore()
    started = LedgerEntry("r", "s", "c1", "t", "started", {"x": (1, 2)}, "pure")
    await store.append("s", ledger=[started])
    (open_call,) = await store.open_tool_calls("s")
    assert open_call.arguments == {"x": [1, 2]}  # a tuple is stored as its JSON list
    result = ToolResult(tool_call_id="c1", name="t", data={"v": math.inf})
    await store.append("s", ledger=[started.ended("completed", result)])
    assert await store.open_tool_calls("s") == []
    ended = (await store.ledger("s"))[-1]
    assert ended.result is not None and ended.result.data == {"v": math.inf}
    # a lone surrogate takes the per-row path: escaped, not refused
    odd = LedgerEntry("r", "s", "c2", "t", "started", {"x": "\udcff"}, "pure")
    await store.append("s", ledger=[odd])
    (still_open,) = await store.open_tool_calls("s")
    assert still_open.arguments == {"x": "\\udcff"}

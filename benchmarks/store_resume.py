"""Resume time and bytes per turn of SQLite sessions with 100 and 1,000 turns.

    PYTHONPATH=src python benchmarks/store_resume.py [--quick]

Each session is written by a real Agent (one tool call per turn: 4 messages, ~14 events,
2 ledger rows, 2 run records). "Resume" is what a new process's first turn reads before
its model call: open the database, read the session, check for loose ends (open runs and tool
calls), and the runtime's session view (the transcript and the session's remembered
permission decisions: ``Runtime.session_view`` + ``remembered_rules``). Measured in-process
with a fresh SQLiteStore (new connection) each time; the OS page cache is warm. Prints JSON
with P50 / P90 in ms.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from loom import Agent, Runtime, tool
from loom.messages import Message, ModelResponse, ToolCall
from loom.store import SQLiteStore
from loom.testing import FunctionModel

QUICK = "--quick" in sys.argv
SIZES = [100, 1000]
REPEAT = 10 if QUICK else 30


@tool(effect="pure", blocking=False)
def lookup(q: str) -> str:
    """Look something up."""
    return f"Result for {q}: " + "lorem ipsum dolor sit amet " * 12


def model(messages: list[Message], tools: object) -> ModelResponse | str:
    last = messages[-1]
    if last.role == "user":
        return ModelResponse(tool_calls=[ToolCall(name="lookup", arguments={"q": last.content})])
    return "Here is what I found: " + last.content[:200]


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


async def build(path: Path, turns: int) -> None:
    agent = Agent(
        model=FunctionModel(model, record=False),
        tools=[lookup],
        store=SQLiteStore(path),
        max_result_chars=None,
    )
    for i in range(turns):
        await agent.run(f"question number {i}: what do you know about topic {i}?", session_id="s")
    agent.store.db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # type: ignore[attr-defined]
    await agent.store.close()


async def resume(path: Path) -> dict[str, float]:
    t0 = time.perf_counter()
    store = SQLiteStore(path)
    t1 = time.perf_counter()
    await store.get_session("s")
    await store.open_runs("s")
    await store.open_tool_calls("s")
    t2 = time.perf_counter()
    runtime = Runtime(store)
    view = await runtime.session_view("s")
    t3 = time.perf_counter()
    await runtime.remembered_rules("s", view)
    t4 = time.perf_counter()
    await store.close()
    assert view.messages
    return {
        "open_ms": (t1 - t0) * 1e3,
        "recovery_check_ms": (t2 - t1) * 1e3,
        "load_messages_ms": (t3 - t2) * 1e3,
        "remembered_rules_ms": (t4 - t3) * 1e3,
        "total_ms": (t4 - t0) * 1e3,
    }


async def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    out: dict[str, object] = {}
    for turns in SIZES:
        path = tmp / f"s{turns}.db"
        t = time.perf_counter()
        await build(path, turns)
        build_s = time.perf_counter() - t
        runs = [await resume(path) for _ in range(REPEAT)]
        size = os.path.getsize(path)  # noqa: ASYNC240
        out[f"{turns}_turns"] = {
            **{f"{k}_p50": round(statistics.median([r[k] for r in runs]), 3) for k in runs[0]},
            "total_ms_p90": round(pct([r["total_ms"] for r in runs], 0.9), 3),
            "messages": turns * 4,
            "db_bytes": size,
            "bytes_per_turn": round(size / turns),
            "build_s": round(build_s, 2),
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    asyncio.run(main())

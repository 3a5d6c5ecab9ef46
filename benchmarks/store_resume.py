"""Resume time, rows read and bytes per turn of sessions with 1,000 and 10,000 turns.

    PYTHONPATH=src python benchmarks/store_resume.py [--quick] [--postgres] [--db-dir DIR]

Each session is written by a real Agent (one tool call per turn: 4 messages, ~14 events,
2 ledger rows, 2 run records; the default 128k window, so the context builder compresses
the older turns into summaries as a long session does). "Resume" is INTAKE: what a new
process's first turn reads before its model call: open the store, read the session, check for
loose ends (open runs and tool calls), the runtime's session view (the part of the transcript
the context builder needs, ``Runtime.session_view``), the session's remembered permission
decisions (``remembered_rules``), the calls parked for approval and a server query waiting
for an answer (``pending_approvals`` / ``pending_query``).

- ``new_process``: a fresh store (new connection, schema check) and a fresh ``Runtime`` each
  time, in this process (the OS page cache is warm);
- ``open_pool``: the same reads again on the already-open store with a fresh ``Runtime`` (a
  server that was running, but has not seen the session);
- ``rows_read``: rows returned by the store during one INTAKE (``CountingStore``), a count the
  machine's load cannot move.

``--postgres`` also measures PostgreSQL, on a private cluster (``benchmarks/scale.py``'s
``cluster``); without it, the PostgreSQL figures of an earlier run are kept in the results file,
marked ``from_an_earlier_run``. ``*_cpu_ms`` are this process's CPU time (the client's side:
PostgreSQL's own work is in the wall time only). ``--db-dir`` keeps the built SQLite databases
there and reuses them (the 10,000-turn build takes minutes). Writes
benchmarks/results/store_resume.json; prints it too.
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
from typing import Any

from loom import Agent, Runtime, tool
from loom.messages import Message, ModelResponse, ToolCall
from loom.policy.approval import pending_approvals
from loom.queries import pending_query
from loom.store import SQLiteStore
from loom.store.base import Store
from loom.store.conformance import CountingStore
from loom.testing import FunctionModel

QUICK = "--quick" in sys.argv
POSTGRES = "--postgres" in sys.argv
SIZES = [1000] if QUICK else [1000, 10000]
REPEAT = 10 if QUICK else 30
HERE = str(Path(__file__).resolve().parent)
RESULTS = Path(HERE) / "results" / "store_resume.json"


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


def arg(name: str) -> str | None:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else None


async def build(store: Store, turns: int) -> float:
    agent = Agent(
        model=FunctionModel(model, record=False), tools=[lookup], store=store, max_result_chars=None
    )
    t = time.perf_counter()
    for i in range(turns):
        await agent.run(f"question number {i}: what do you know about topic {i}?", session_id="s")
    return time.perf_counter() - t


async def intake(store: Store) -> int:
    """INTAKE's reads of session "s" through a fresh Runtime; the messages it holds."""
    runtime = Runtime(store)
    await store.get_session("s")
    runs = runtime.capabilities.runs
    if runs is not None:
        await runs.open_runs("s")
    await store.open_tool_calls("s")
    view = await runtime.session_view("s")
    await runtime.remembered_rules("s", view)
    await pending_approvals(store, "s", view.messages)
    await pending_query(store, "s")
    assert view.messages
    return len(view.messages)


async def measure(open_store: Any, turns: int) -> dict[str, Any]:
    await (await open_store()).close()  # a database written by older code migrates once here
    cold, warm, cold_cpu, warm_cpu = [], [], [], []
    for _ in range(REPEAT):
        t0, c0 = time.perf_counter(), time.process_time()
        store = await open_store()
        held = await intake(store)
        cold.append((time.perf_counter() - t0) * 1e3)
        cold_cpu.append((time.process_time() - c0) * 1e3)
        t1, c1 = time.perf_counter(), time.process_time()
        await intake(store)
        warm.append((time.perf_counter() - t1) * 1e3)
        warm_cpu.append((time.process_time() - c1) * 1e3)
        await store.close()
    counting = CountingStore(await open_store())
    await intake(counting)
    await counting.inner.close()
    return {
        "turns": turns,
        "messages_stored": turns * 4,
        "messages_held_after_intake": held,
        "new_process_ms_p50": round(statistics.median(cold), 3),
        "new_process_ms_p90": round(pct(cold, 0.9), 3),
        "open_pool_ms_p50": round(statistics.median(warm), 3),
        "open_pool_ms_p90": round(pct(warm, 0.9), 3),
        "new_process_cpu_ms_p50": round(statistics.median(cold_cpu), 3),
        "open_pool_cpu_ms_p50": round(statistics.median(warm_cpu), 3),
        "rows_read": counting.total,
        "rows_read_by_method": dict(sorted(counting.rows.items())),
    }


async def sqlite(db_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for turns in SIZES:
        path = db_dir / f"s{turns}.db"
        build_s = None
        if not path.exists():
            store = SQLiteStore(path)
            build_s = round(await build(store, turns), 1)
            store.db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            await store.close()

        async def open_store(path: Path = path) -> SQLiteStore:
            return SQLiteStore(path)

        size = os.path.getsize(path)  # noqa: ASYNC240
        out[f"{turns}_turns"] = {
            **await measure(open_store, turns),
            "db_bytes": size,
            "bytes_per_turn": round(size / turns),
            "build_s": build_s,
        }
    return out


async def postgres(dsn: str) -> dict[str, Any]:
    from loom.store.postgres import PostgresStore

    out: dict[str, Any] = {}
    for turns in SIZES:
        schema_dsn = f"{dsn} options='-c search_path=r{turns}'"
        import psycopg

        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS r{turns}")
        store = PostgresStore(schema_dsn)
        build_s = round(await build(store, turns), 1)
        await store.close()

        async def open_store(schema_dsn: str = schema_dsn) -> PostgresStore:
            s = PostgresStore(schema_dsn)
            await s.open()
            return s

        out[f"{turns}_turns"] = {**await measure(open_store, turns), "build_s": build_s}
    return out


async def main() -> None:
    given = arg("--db-dir")
    db_dir = Path(given) if given else Path(tempfile.mkdtemp())
    db_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {
        "quick": QUICK,
        "targets_ms": {"sqlite": 10, "postgres": 20},
        "sqlite": await sqlite(db_dir),
    }
    if POSTGRES:
        sys.path.insert(0, HERE)
        from scale import cluster

        with cluster() as dsn:
            out["postgres"] = await postgres(dsn)
    elif RESULTS.exists():
        earlier = json.loads(RESULTS.read_text()).get("postgres")
        if earlier is not None:  # kept, and said so: this run did not measure PostgreSQL
            out["postgres"] = {"from_an_earlier_run": True, **earlier}
    text = json.dumps(out, indent=2)
    RESULTS.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    asyncio.run(main())

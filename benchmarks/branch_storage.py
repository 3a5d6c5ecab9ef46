"""Forks share their history (issue #28): database bytes and rows that 100 forks of a 1,000-turn
session add, against the source's own size.

    PYTHONPATH=src python benchmarks/branch_storage.py [--postgres] [--turns N] [--forks N]

A 1,000-turn session (each turn a user message and an answer of about 400 characters, every
tenth turn a tool call and its result) is made by the engine with a ``FunctionModel``; then
``Runtime.fork`` forks it 100 times at random turns and each fork runs one turn of its own
(its branch). Figures are bytes and rows, which the machine's load cannot move:

- SQLite: the database file after a WAL checkpoint (page count x page size);
- PostgreSQL (``--postgres``, on a private cluster: ``benchmarks/scale.py``'s ``cluster``):
  ``pg_total_relation_size`` of every table (indexes and TOAST included) of the schema Loom
  wrote to, after a CHECKPOINT; without ``--postgres`` the PostgreSQL figures of an earlier run
  are kept, marked ``from_an_earlier_run``.

``source_bytes`` is what the source session costs (the database with it, minus the empty
database); ``forks_bytes`` what the 100 forks add; ``copies_bytes_estimate`` what copying each
fork's shared prefix would have added (the source's bytes per message times the messages
the forks share). ``rows`` counts the message and event rows the forks hold against the
messages and events they read. ``reads`` is what sharing costs a read: microseconds for a
20-message tail, the plain range read of the code before forks against the store's read of the
source and of a fork (wall time, 3 rounds of 1,000, medians, in one run: compare them with
each other only). The target: the forks add rows for their branches only, not
100 copies. Writes benchmarks/results/branch_storage.json; prints it too.
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from loom import Agent
from loom.engine.run_inputs import AtTurn
from loom.engine.runtime import Runtime
from loom.messages import Message, ModelResponse, ToolCall
from loom.store import SQLiteStore, codec
from loom.store.base import Store
from loom.testing import FunctionModel
from loom.tools.base import tool

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "branch_storage.json"
POSTGRES = "--postgres" in sys.argv
TURNS = int(sys.argv[sys.argv.index("--turns") + 1]) if "--turns" in sys.argv else 1000
FORKS = int(sys.argv[sys.argv.index("--forks") + 1]) if "--forks" in sys.argv else 100
ANSWER = "An answer of about four hundred characters. " * 9


@tool(effect="pure")
def lookup(key: str) -> str:
    """Look a key up."""
    return f"the value of {key}"


def _model(messages: list[Message], tools: Any) -> ModelResponse | str:
    last = next(m for m in reversed(messages) if m.role != "system")
    if last.role == "user" and last.content.endswith("0"):  # every tenth turn: a tool call
        return ModelResponse(tool_calls=[ToolCall(name="lookup", arguments={"key": last.content})])
    return f"{ANSWER} ({len(messages)})"


async def build(store: Store, measure: Callable[[], Awaitable[int]]) -> dict[str, Any]:
    """The source session, then the forks; the bytes after each."""
    empty = await measure()
    agent = Agent(model=FunctionModel(_model), tools=[lookup], name="brancher")
    runtime = Runtime(store=store)
    for i in range(TURNS):
        await runtime.run(agent, f"turn {i}", session_id="source")
    source_messages = await store.message_count("source")
    source_events = len(await store.load_events("source"))
    with_source = await measure()
    rng = random.Random(28)
    shared_messages = shared_events = 0
    for k in range(FORKS):
        at = rng.randint(1, TURNS)
        fork_id = await runtime.fork(agent, "source", AtTurn(at), new_session_id=f"fork{k}")
        await runtime.run(agent, f"fork {k}'s own turn", session_id=fork_id)
        shared_messages += len(await store.load_message_range(fork_id, 0, 10**9)) - 2
        shared_events += len(await store.load_events(fork_id))
    with_forks = await measure()
    source_bytes = with_source - empty
    forks_bytes = with_forks - with_source
    per_message = source_bytes / source_messages
    return {
        "source": {
            "turns": TURNS,
            "messages": source_messages,
            "events": source_events,
            "bytes": source_bytes,
        },
        "forks": FORKS,
        "forks_bytes": forks_bytes,
        "forks_bytes_per_fork": round(forks_bytes / FORKS),
        "forks_bytes_vs_source": round(forks_bytes / source_bytes, 4),
        "copies_bytes_estimate": round(per_message * shared_messages),
        "forks_read_messages": shared_messages,
        "forks_read_events": shared_events,
    }


async def read_costs(
    plain: Callable[[], Awaitable[Any]], store: Store, reads: int = 1000
) -> dict[str, float]:
    """Microseconds a read of a 20-message tail takes: the plain range read of the code before
    forks (``plain``, on the source, decoded as the store decodes), the store's read of the
    source (no fork) and of a fork (through its chain); 3 rounds, medians, all in this run
    (ratios, not absolute figures)."""
    count = await store.message_count("source")
    fork_count = await store.message_count("fork0")
    cases: dict[str, Callable[[], Awaitable[Any]]] = {
        "plain_range_read_us": plain,
        "store_read_source_us": lambda: store.load_message_range("source", count - 20, count),
        "store_read_fork_us": lambda: store.load_message_range(
            "fork0", fork_count - 20, fork_count
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(3):
        for name, read in cases.items():
            started = time.perf_counter()
            for _ in range(reads):
                await read()
            times[name].append((time.perf_counter() - started) / reads * 1e6)
    return {name: round(statistics.median(t), 1) for name, t in times.items()}


def sqlite_bytes(path: Path) -> int:
    with sqlite3.connect(path) as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = c.execute("PRAGMA page_count").fetchone()[0]
        size = c.execute("PRAGMA page_size").fetchone()[0]
    return int(pages) * int(size)


def sqlite_rows(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as c:
        return {
            f"{table}_of_forks": int(
                c.execute(f"SELECT count(*) FROM {table} WHERE session_id LIKE 'fork%'").fetchone()[
                    0
                ]
            )
            for table in ("messages", "events", "ledger")
        }


async def on_sqlite() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "branches.db"
        store = SQLiteStore(path)

        async def measure() -> int:
            return sqlite_bytes(path)

        out = await build(store, measure)
        count = await store.message_count("source")
        db = store.db

        async def plain() -> list[Message]:
            rows = db.read(
                lambda c: c.execute(
                    "SELECT data FROM messages WHERE session_id = ? AND seq >= ? AND seq < ? "
                    "ORDER BY seq",
                    ("source", count - 20, count),
                ).fetchall()
            )
            return codec.decode_messages([r[0] for r in rows])

        out["reads"] = await read_costs(plain, store)
        await store.close()
        out["rows"] = sqlite_rows(path)
    return out


async def on_postgres() -> dict[str, Any]:
    import psycopg

    sys.path.insert(0, str(HERE))
    from scale import cluster

    from loom.store.postgres import PostgresStore

    with cluster() as dsn:
        schema = "branches"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        store = PostgresStore(f"{dsn} options='-c search_path={schema}'")
        await store.open()

        async def measure() -> int:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CHECKPOINT")
                conn.execute(f"VACUUM (ANALYZE) {schema}.messages, {schema}.events")
                row = conn.execute(
                    "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = %s AND c.relkind = 'r'",
                    (schema,),
                ).fetchone()
            assert row is not None
            return int(row[0])

        out = await build(store, measure)
        count = await store.message_count("source")

        async def plain() -> list[Message]:
            rows = await store._fetchall(
                "reading",
                "SELECT data FROM messages WHERE session_id = %s AND seq >= %s AND seq < %s "
                "ORDER BY seq",
                ("source", count - 20, count),
            )
            return codec.decode_messages([r[0] for r in rows])

        out["reads"] = await read_costs(plain, store)
        await store.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            out["rows"] = {
                f"{table}_of_forks": int(
                    conn.execute(
                        f"SELECT count(*) FROM {schema}.{table} WHERE session_id LIKE 'fork%%'"
                    ).fetchone()[0]
                )
                for table in ("messages", "events", "ledger")
            }
    return out


async def main() -> None:
    result: dict[str, Any] = {
        "command": "PYTHONPATH=src python benchmarks/branch_storage.py"
        + (" --postgres" if POSTGRES else ""),
        "sqlite": await on_sqlite(),
    }
    earlier: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if POSTGRES:
        result["postgres"] = await on_postgres()
    elif "postgres" in earlier:
        result["postgres"] = {**earlier["postgres"], "from_an_earlier_run": True}
    RESULTS.parent.mkdir(exist_ok=True)
    text = json.dumps(result, indent=2)
    RESULTS.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    asyncio.run(main())

"""Group commit: durable steps per second with 64 sessions stepping at once, and client CPU per
durable step, on SQLite and on a local PostgreSQL, both with their default durability.

    PYTHONPATH=src python benchmarks/group_commit.py [--quick] [--label before|after]

Each of SESSIONS sessions runs TURNS turns of STEPS tool-calling steps (the workload of
``benchmarks/store_steps.py``: a FunctionModel answering with one call of a trivial tool until
the last step), all sessions at once on one event loop through one shared store, as a server
runs them. Measured per store:

- ``durable_steps_per_s``: steps / wall seconds of the whole batch (the figure the target is
  about; wall time, so it moves with the machine's load: compare labels of one run or of
  runs on a quiet machine).
- ``cpu_us_per_step``: this process's CPU time (user + system, every thread, from
  ``resource.getrusage``) per step: what the client pays, load does not move it much.
- ``commits_per_step``: PostgreSQL: ``xact_commit`` of ``pg_stat_database`` per step;
  ``wal_syncs_per_step``: WAL flushes of ``pg_stat_wal`` per step (the fsyncs the steps wait
  for). SQLite: ``commits_per_step`` from a commit hook on the connection (none is counted
  when the store does not expose one).
- ``server_cpu_us_per_step`` (PostgreSQL): CPU time of the cluster's processes per step (the
  postmaster's children, live and reaped), from ``/proc``: the server shares the 2 cores.
- ``single_session``: the same with one session (the latency case: no batch to share).

SQLite: ``SQLiteStore(path)`` (durability "normal": WAL, ``synchronous=NORMAL``).
PostgreSQL: a private PostgreSQL 15 cluster with its defaults (fsync on, synchronous_commit
on; ``benchmarks/scale.py``'s ``cluster()``), over TCP on 127.0.0.1, ``PostgresStore(dsn)``.

``--label`` names the code measured (``before``: main; ``after``: this branch); the result is
merged into ``benchmarks/results/group_commit.json`` under that label and printed.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
import store_steps  # the model and the tool
from scale import cluster

from loom import Agent
from loom.messages import Message, ModelResponse, ToolCall
from loom.store import SQLiteStore, Store
from loom.store.postgres import PostgresStore
from loom.testing import FunctionModel

QUICK = "--quick" in sys.argv
LABEL = sys.argv[sys.argv.index("--label") + 1] if "--label" in sys.argv else "now"
SESSIONS = 64
STEPS = 10 if QUICK else 20
TURNS = 1 if QUICK else 2
RESULTS = Path(__file__).resolve().parent / "results" / "group_commit.json"


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def model(messages: list[Message], tools: object) -> ModelResponse | str:
    last = messages[-1]
    done = int(last.content) + 1 if last.role == "tool" else 0
    if done < STEPS:
        return ModelResponse(tool_calls=[ToolCall(name="noop", arguments={"i": done})])
    return "done"


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of process ``root`` and its children, live and reaped (the postmaster
    reaps its backends, so their time lands in its cutime / cstime)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(entry), int(fields[1])
        if pid == root:
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        elif ppid == root:
            total += int(fields[11]) + int(fields[12])
    return total / tick


async def postmaster_pid(dsn: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
        assert row is not None
    return parent_pid(int(row[0]))


def parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


async def pg_counters(dsn: str) -> tuple[int, int]:
    # Connected to the database "postgres": the store's database "loom" counts only its own.
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        row = await (
            await conn.execute(
                "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = 'loom'), "
                "(SELECT wal_sync FROM pg_stat_wal)"
            )
        ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])


async def run_sessions(store: Store, sessions: int, tag: str) -> dict[str, float]:
    agent = Agent(
        model=FunctionModel(model, record=False),
        tools=[store_steps.noop],
        store=store,
        max_iterations=STEPS + 1,
        max_tool_calls=STEPS + 1,
        max_result_chars=None,
    )
    await agent.run("warm up", session_id=f"{tag}-warm")

    async def session(i: int) -> None:
        for t in range(TURNS):
            r = await agent.run("go", session_id=f"{tag}-s{i}")
            assert r.stop_reason == "completed", r
            del t

    t0, c0 = time.perf_counter(), cpu_seconds()
    await asyncio.gather(*(session(i) for i in range(sessions)))
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    steps = sessions * TURNS * STEPS
    return {"steps": steps, "wall_s": wall, "cpu_s": cpu}


def summarise(m: dict[str, float], commits: int | None, syncs: int | None) -> dict[str, Any]:
    """Rates per step; commits and WAL syncs also count the warm-up turn's STEPS steps."""
    steps = m["steps"]
    counted = steps + STEPS
    out: dict[str, Any] = {
        "steps": int(steps),
        "durable_steps_per_s": round(steps / m["wall_s"], 1),
        "cpu_us_per_step": round(m["cpu_s"] / steps * 1e6, 1),
    }
    if commits is not None:
        out["commits_per_step"] = round(commits / counted, 3)
    if syncs is not None:
        out["wal_syncs_per_step"] = round(syncs / counted, 3)
    return out


async def sqlite_case(folder: Path, sessions: int) -> dict[str, Any]:
    store = SQLiteStore(folder / f"gc{sessions}.db")
    commits = {"n": 0}
    conn = store.db.conn

    def count() -> int:  # a commit hook: counts, never vetoes
        commits["n"] += 1
        return 0

    set_hook = getattr(conn, "set_commit_hook", None)  # not in the stdlib sqlite3 module
    if set_hook is not None:
        set_hook(count)
    counter = getattr(store.db, "commits", None)
    before = counter if isinstance(counter, int) else None
    m = await run_sessions(store, sessions, "sqlite")
    after = getattr(store.db, "commits", None)
    await store.close()
    n = after - before if isinstance(after, int) and before is not None else None
    return summarise(m, n, None)


async def pg_case(dsn: str, sessions: int, schema: str) -> dict[str, Any]:
    loom_dsn = dsn.replace("dbname=postgres", "dbname=loom")
    async with await psycopg.AsyncConnection.connect(loom_dsn, autocommit=True) as conn:
        await conn.execute(f"CREATE SCHEMA {schema}")
    store = PostgresStore(f"{loom_dsn} options='-c search_path={schema}'")
    await store.open()
    await store.get_session("x")  # warm the pool
    postmaster = await postmaster_pid(dsn)
    c0, w0 = await pg_counters(dsn)
    s0 = tree_cpu_seconds(postmaster)
    m = await run_sessions(store, sessions, "pg")
    s1 = tree_cpu_seconds(postmaster)
    await store.close()  # backends report their statistics when they exit
    await asyncio.sleep(0.5)
    c1, w1 = await pg_counters(dsn)
    out = summarise(m, c1 - c0, w1 - w0)
    out["server_cpu_us_per_step"] = round((s1 - s0) / m["steps"] * 1e6, 1)
    return out


async def main(dsn: str) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="loom-gc-"))
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("CREATE DATABASE loom")
    result: dict[str, Any] = {
        "sessions": SESSIONS,
        "steps_per_turn": STEPS,
        "turns_per_session": TURNS,
        "sqlite": {
            f"{SESSIONS}_sessions": await sqlite_case(folder, SESSIONS),
            "single_session": await sqlite_case(folder, 1),
        },
        "postgres": {
            f"{SESSIONS}_sessions": await pg_case(dsn, SESSIONS, "gc_many"),
            "single_session": await pg_case(dsn, 1, "gc_one"),
        },
    }
    return result


if __name__ == "__main__":
    with cluster() as the_dsn:
        measured = asyncio.run(main(the_dsn))
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    previous["quick" if QUICK else LABEL] = measured
    if not QUICK:
        RESULTS.write_text(json.dumps(previous, indent=2) + "\n")
    print(json.dumps(measured, indent=2))

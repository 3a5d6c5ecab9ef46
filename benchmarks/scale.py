"""PostgreSQL vs SQLite: durable step cost, and resume of a 1,000-turn session on PostgreSQL.

    PYTHONPATH=src python benchmarks/scale.py [--quick]

Starts a private PostgreSQL 15 cluster of its own (initdb / pg_ctl, as the ``postgres`` user
when run as root, on a free loopback port, in a temporary directory; stopped at the end) with
PostgreSQL's defaults for durability (fsync on, synchronous_commit on), connected over TCP on
127.0.0.1.

- Step cost: the workload of ``benchmarks/store_steps.py`` (turns of STEPS steps, each a model
  response with one tool call plus its result: 3 commits a step), per store, µs per step,
  median of interleaved rounds.
  ``postgres_no_commit_wait`` is ``PostgresStore(synchronous_commit=False)``, the opt-in that
  does not wait for the WAL flush (a server crash can lose the last announced steps).
- Resume: a 1,000-turn session written by a real Agent (as ``benchmarks/store_resume.py``);
  "resume" is what a new process's first turn reads before its model call: open the store
  (connect, check the schema), read the session, check for loose ends (open runs and tool
  calls), and the runtime's session view: the transcript and the session's remembered
  permission decisions (``Runtime.session_view`` + ``remembered_rules``). Also the same
  reads on an already-open pool (a server that was running).

- The queue (``benchmarks/scale_queue.py``, which also runs alone): runs/s through the queue
  with 1, 2 and 4 ``loom worker`` processes, and failover time after a kill -9 with the
  default worker settings. Prints JSON.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scale_queue  # runs/s through the queue, failover time
import store_steps  # the same workload, model and tool
from store_resume import lookup
from store_resume import model as resume_model

from loom import Agent, Runtime
from loom.store import MemoryStore, SQLiteStore
from loom.store.postgres import PostgresStore
from loom.testing import FunctionModel

QUICK = "--quick" in sys.argv
PG_BIN = "/usr/lib/postgresql/15/bin"
RESUME_TURNS = 1000
REPEAT = 10 if QUICK else 30


@contextmanager
def cluster() -> Iterator[str]:
    """A private PostgreSQL 15 cluster with default durability; yields its DSN."""
    root = tempfile.mkdtemp(prefix="loom-scale-")
    as_pg: list[str] = []
    if os.geteuid() == 0:
        import pwd

        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
        as_pg = ["runuser", "-u", "postgres", "--"]
    data = f"{root}/data"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def run(*cmd: str) -> None:
        subprocess.run([*as_pg, *cmd], check=True, capture_output=True, timeout=120)

    try:
        run(f"{PG_BIN}/initdb", "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8")
        opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {root}"
        run(f"{PG_BIN}/pg_ctl", "-D", data, "-l", f"{root}/log", "-w", "-o", opts, "start")
        yield f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
    finally:
        if os.path.exists(f"{data}/postmaster.pid"):
            run(f"{PG_BIN}/pg_ctl", "-D", data, "-m", "fast", "stop")
        shutil.rmtree(root, ignore_errors=True)


async def step_costs(dsn: str) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp())
    configs: dict[str, Any] = {
        "memory": lambda r: MemoryStore(),
        "sqlite_normal_inline": lambda r: SQLiteStore(tmp / f"a{r}.db"),
        "sqlite_full_inline": lambda r: SQLiteStore(tmp / f"b{r}.db", durability="full"),
        "postgres": lambda r: PostgresStore(f"{dsn} options='-c search_path=r{r}'"),
    }
    if "synchronous_commit" in inspect.signature(PostgresStore).parameters:
        configs["postgres_no_commit_wait"] = lambda r: PostgresStore(
            f"{dsn} options='-c search_path=r{r}'",
            synchronous_commit=False,  # type: ignore[call-arg]
        )
    rounds: dict[str, list[tuple[float, float]]] = {name: [] for name in configs}
    for r in range(1 if QUICK else 3):
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA r{r}")  # a fresh schema a round: fresh sessions
        for name, make in configs.items():
            rounds[name].append(await store_steps.measure(lambda m=make, r=r: m(r)))
    wall = {n: statistics.median(w for w, _ in v) for n, v in rounds.items()}
    cpu = {n: statistics.median(c for _, c in v) for n, v in rounds.items()}
    return {
        name: {
            "us_per_step": round(s * 1e6, 1),
            "steps_per_s": round(1 / s),
            "overhead_us_per_step_vs_memory": round((s - wall["memory"]) * 1e6, 1),
            "cpu_us_per_step": round(cpu[name] * 1e6, 1),
        }
        for name, s in wall.items()
    }


async def resume_reads(store: PostgresStore) -> None:
    runtime = Runtime(store)
    await store.get_session("s")
    await store.open_runs("s")
    await store.open_tool_calls("s")
    view = await runtime.session_view("s")
    await runtime.remembered_rules("s", view)
    assert view.messages


async def resume(dsn: str) -> dict[str, Any]:
    agent = Agent(
        model=FunctionModel(resume_model, record=False),
        tools=[lookup],
        store=PostgresStore(dsn),
        max_result_chars=None,
    )
    t = time.perf_counter()
    for i in range(RESUME_TURNS):
        await agent.run(f"question number {i}: what do you know about topic {i}?", session_id="s")
    build_s = time.perf_counter() - t
    await agent.store.close()
    cold, warm = [], []
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        store = PostgresStore(dsn)
        await store.open()
        await resume_reads(store)
        cold.append((time.perf_counter() - t0) * 1e3)
        t1 = time.perf_counter()
        await resume_reads(store)
        warm.append((time.perf_counter() - t1) * 1e3)
        await store.close()
    return {
        "turns": RESUME_TURNS,
        "messages": RESUME_TURNS * 4,
        "new_process_total_ms_p50": round(statistics.median(cold), 2),
        "new_process_total_ms_max": round(max(cold), 2),
        "open_pool_reads_ms_p50": round(statistics.median(warm), 2),
        "open_pool_reads_ms_max": round(max(warm), 2),
        "build_s": round(build_s, 1),
    }


async def main(dsn: str) -> None:
    out = {
        "quick": QUICK,
        "steps_per_turn": store_steps.STEPS,
        "turns": store_steps.TURNS,
        "step_cost": await step_costs(dsn),
        "resume_1000_turns_postgres": await resume(dsn),
        "targets": {"us_per_durable_step_postgres": 1500, "resume_1000_turns_ms": 20},
        **await scale_queue.measure(dsn),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    with cluster() as the_dsn:
        asyncio.run(main(the_dsn))

"""Group commit: durable steps per second with 64 sessions stepping at once, and client CPU per
durable step, on SQLite and on a local PostgreSQL, both with their default durability.

    PYTHONPATH=src python benchmarks/group_commit.py [--quick] [--before OTHER_SRC]

``--before`` compares two versions of the code in one run: for example
``git archive 43da763 src | tar -x -C /tmp/base`` then ``--before /tmp/base/src``. Each of
ROUNDS rounds runs every case in a child process per version (alternating which goes first),
so both see the same load on the shared machine; each figure is the median of its rounds, and
``after_over_before`` gives the ratios. The result goes to ``benchmarks/results/group_commit.json``.

Each of SESSIONS sessions runs TURNS turns of STEPS tool-calling steps (the workload of
``benchmarks/store_steps.py``: a FunctionModel answering with one call of a trivial tool until
the last step), all sessions at once on one event loop through one shared store, as a server
runs them. Measured per store:

- ``durable_steps_per_s``: steps / wall seconds of the whole batch (the figure the target is
  about; wall time, so it moves with the machine's load: compare versions within one run).
- ``cpu_us_per_step``: this process's CPU time (user + system, every thread, from
  ``resource.getrusage``) per step: what the client pays, load does not move it much.
- ``commits_per_step``: PostgreSQL: ``xact_commit`` of ``pg_stat_database`` per step;
  ``wal_syncs_per_step``: WAL flushes of ``pg_stat_wal`` per step (the fsyncs the steps wait
  for). SQLite: ``commits_per_step`` from the connection's commit counter
  (``Database.commits``; absent in versions without it).
- ``server_cpu_us_per_step`` (PostgreSQL): CPU time of the cluster's processes per step (the
  postmaster's children, live and reaped), from ``/proc``: the server shares the 2 cores.
- ``single_session``: the same with one session (the latency case: no batch to share).

SQLite: ``SQLiteStore(path)``, the default (durability "normal": WAL, ``synchronous=NORMAL``;
writes inline on the event loop), and with the writer thread (``threaded=True``, where group
commit applies), with durability "normal" and "full" (an fsync per commit).
PostgreSQL: a private PostgreSQL 15 cluster with its defaults (fsync on, synchronous_commit
on; ``benchmarks/scale.py``'s ``cluster()``), over TCP on 127.0.0.1, ``PostgresStore(dsn)``.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import statistics
import subprocess
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
from loom.events import LlmComplete
from loom.messages import Message, ModelResponse, ToolCall
from loom.store import MemoryStore, SQLiteStore, Store
from loom.store.base import LedgerEntry
from loom.store.postgres import PostgresStore
from loom.testing import FunctionModel

QUICK = "--quick" in sys.argv
SESSIONS = 64
STEPS = 10 if QUICK else 20
TURNS = 1 if QUICK else 2
ROUNDS = 1 if QUICK else 4
SINGLE_TURNS = 2 if QUICK else 10  # one session alone: more turns, for a steadier CPU figure
APPENDS = 100 if QUICK else 500
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
        return parent_pid(int(row[0]))  # while the backend is alive


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

    turns = TURNS if sessions > 1 else SINGLE_TURNS

    async def session(i: int) -> None:
        for t in range(turns):
            r = await agent.run("go", session_id=f"{tag}-s{i}")
            assert r.stop_reason == "completed", r
            del t

    t0, c0 = time.perf_counter(), cpu_seconds()
    await asyncio.gather(*(session(i) for i in range(sessions)))
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    steps = sessions * turns * STEPS
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


async def sqlite_case(folder: Path, sessions: int, **options: Any) -> dict[str, Any]:
    name = "-".join(f"{k}{v}" for k, v in options.items())
    store = SQLiteStore(folder / f"gc{sessions}{name}.db", **options)
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


async def one_round(dsn: str, folder: Path, tag: str) -> dict[str, dict[str, dict[str, Any]]]:
    """Every case once, with the code on this process's path; schemas are named by ``tag``."""
    many = f"{SESSIONS}_sessions"
    return {
        "sqlite": {
            many: await sqlite_case(folder, SESSIONS),
            "single_session": await sqlite_case(folder, 1),
        },
        # The writer thread (where group commit applies), with each durability.
        "sqlite_threaded": {
            many: await sqlite_case(folder, SESSIONS, threaded=True),
            "single_session": await sqlite_case(folder, 1, threaded=True),
        },
        "sqlite_threaded_full": {
            many: await sqlite_case(folder, SESSIONS, threaded=True, durability="full"),
            "single_session": await sqlite_case(folder, 1, threaded=True, durability="full"),
        },
        "postgres": {
            many: await pg_case(dsn, SESSIONS, f"gc_many_{tag}"),
            "single_session": await pg_case(dsn, 1, f"gc_one_{tag}"),
            "one_append": await append_cpu(dsn, f"gc_append_{tag}"),
        },
        # The loop's own cost per step, without a durable store.
        "memory": {
            "single_session": summarise(await run_sessions(MemoryStore(), 1, "m"), None, None)
        },
    }


async def append_cpu(dsn: str, tag: str) -> dict[str, Any]:
    """Client CPU of one append alone, the commit of a step (a model answer with a tool call,
    the call's start: one message, three events, one ledger row), APPENDS times in a row."""
    loom_dsn = dsn.replace("dbname=postgres", "dbname=loom")
    async with await psycopg.AsyncConnection.connect(loom_dsn, autocommit=True) as conn:
        await conn.execute(f"CREATE SCHEMA {tag}")
    store = PostgresStore(f"{loom_dsn} options='-c search_path={tag}'")
    lease = await store.acquire_lease("s", "r", 600)
    assert lease is not None
    events = [LlmComplete(run_id="r", session_id="s", iteration=1, sequence=i) for i in range(3)]
    call = ToolCall(name="noop", arguments={"i": 1})
    answer = Message.assistant("", tool_calls=[call])

    async def one(i: int) -> None:
        entry = LedgerEntry("r", "s", f"c{i}", "noop", "started", {"i": 1}, "pure")
        await store.append("s", messages=[answer], events=events, ledger=[entry], lease=lease)

    for i in range(20):
        await one(i)  # warm: prepared statements, pool
    c0 = cpu_seconds()
    for i in range(APPENDS):
        await one(20 + i)
    cpu = cpu_seconds() - c0
    await store.close()
    return {"appends": APPENDS, "cpu_us_per_append": round(cpu / APPENDS * 1e6, 1)}


def median_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the rounds."""
    return {
        store: {
            case: {key: statistics.median(rd[store][case][key] for rd in rounds) for key in first}
            for case, first in cases.items()
        }
        for store, cases in rounds[0].items()
    }


def ratios(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {
        store: {
            case: {
                "steps_per_s_after_over_before": round(
                    after[store][case]["durable_steps_per_s"]
                    / before[store][case]["durable_steps_per_s"],
                    2,
                ),
                "cpu_after_over_before": round(
                    after[store][case]["cpu_us_per_step"] / before[store][case]["cpu_us_per_step"],
                    2,
                ),
            }
            for case in cases
            if "durable_steps_per_s" in before[store][case]
        }
        for store, cases in before.items()
    }


def main(dsn: str, before_src: str | None) -> dict[str, Any]:
    """ROUNDS rounds; in each, every case runs in a child process per code version (the
    code under ``--before`` and this checkout's, each first in every other round), so that both
    see the same load."""
    folder = Path(tempfile.mkdtemp(prefix="loom-gc-"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE DATABASE loom")
    here = str(Path(__file__).resolve().parents[1] / "src")
    versions = {"before": before_src, "after": here} if before_src else {"now": here}
    measured: dict[str, list[dict[str, Any]]] = {label: [] for label in versions}
    for r in range(ROUNDS):
        order = list(versions.items())
        for label, src in order if r % 2 == 0 else order[::-1]:  # neither always goes first
            (folder / f"{label}{r}").mkdir()
            child = subprocess.run(
                [sys.executable, __file__, "--round", dsn, str(folder / f"{label}{r}")]
                + (["--quick"] if QUICK else []),
                env={**os.environ, "PYTHONPATH": src},
                capture_output=True,
                text=True,
            )
            if child.returncode != 0:
                raise RuntimeError(f"{label} round {r} failed:\n{child.stderr[-3000:]}")
            measured[label].append(json.loads(child.stdout))
    out: dict[str, Any] = {
        "sessions": SESSIONS,
        "steps_per_turn": STEPS,
        "turns_per_session": TURNS,
        "rounds": ROUNDS,
    }
    for label, rounds in measured.items():
        out[label] = median_of(rounds)
    if before_src:
        out["after_over_before"] = ratios(out["before"], out["after"])
    return out


if __name__ == "__main__":
    if "--round" in sys.argv:
        at = sys.argv.index("--round")
        the_dsn, the_folder = sys.argv[at + 1 : at + 3]
        tag = Path(the_folder).name  # the version and the round: schema names of its own
        print(json.dumps(asyncio.run(one_round(the_dsn, Path(the_folder), tag))))
        sys.exit(0)
    before = sys.argv[sys.argv.index("--before") + 1] if "--before" in sys.argv else None
    with cluster() as a_dsn:
        result = main(a_dsn, before)
    if not QUICK:
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))

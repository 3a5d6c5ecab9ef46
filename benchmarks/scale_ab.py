"""Durable step cost of two versions of Loom, interleaved on one PostgreSQL cluster.

    python benchmarks/scale_ab.py BEFORE_SRC AFTER_SRC [ROUNDS]

    # e.g. the code before a change against the worktree:
    git archive <commit> src | tar -x -C /tmp/before
    PYTHONPATH=src python benchmarks/scale_ab.py /tmp/before/src src 4

On a shared machine the fsync latency of one run can be several times another's, so
comparing two separate runs of ``scale.py`` says little. This starts one private cluster (as
``scale.py`` does) and alternates the two versions, each in a fresh interpreter with its own
``PYTHONPATH``, ROUNDS times: paired rounds under the same load. Each round measures the
``store_steps.py --quick`` workload (3 turns of 100 tool steps) on MemoryStore, SQLiteStore
(``normal`` and ``full``), PostgresStore and, when the version has it,
``PostgresStore(synchronous_commit=False)``. Prints every round and the medians (µs per step,
wall and client CPU) as JSON.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = """
import asyncio, inspect, json, sys, tempfile
from pathlib import Path
sys.argv.append("--quick")
sys.path.insert(0, {here!r})
import psycopg
import store_steps
from loom.store import MemoryStore, SQLiteStore
from loom.store.postgres import PostgresStore

dsn, schema = {dsn!r}, {schema!r}


def pg(suffix, **kw):
    return lambda: PostgresStore(f"{{dsn}} options='-c search_path={{schema}}{{suffix}}'", **kw)


async def main():
    tmp = Path(tempfile.mkdtemp())
    configs = {{
        "memory": MemoryStore,
        "sqlite_normal": lambda: SQLiteStore(tmp / "a.db"),
        "sqlite_full": lambda: SQLiteStore(tmp / "b.db", durability="full"),
        "postgres": pg("a"),
    }}
    if "synchronous_commit" in inspect.signature(PostgresStore).parameters:
        configs["postgres_no_commit_wait"] = pg("b", synchronous_commit=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for suffix in "ab":
            conn.execute(f"CREATE SCHEMA {{schema}}{{suffix}}")
    out = {{}}
    for name, make in configs.items():
        wall, cpu = await store_steps.measure(make)
        out[name] = [round(wall * 1e6), round(cpu * 1e6)]
    print(json.dumps(out))


asyncio.run(main())
"""


def main() -> None:
    sys.path.insert(0, str(HERE))
    import scale

    versions = {"before": sys.argv[1], "after": sys.argv[2]}
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    runs: dict[str, list[dict[str, list[int]]]] = {v: [] for v in versions}
    with scale.cluster() as dsn:
        for r in range(rounds):
            for version, src in versions.items():
                code = CHILD.format(here=str(HERE), dsn=dsn, schema=f"{version}{r}")
                env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
                done = subprocess.run(
                    [sys.executable, "-c", code], capture_output=True, text=True, env=env
                )
                if done.returncode:
                    raise SystemExit(done.stderr[-3000:])
                runs[version].append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(version, r, json.dumps(runs[version][-1]), file=sys.stderr, flush=True)
    medians = {
        version: {
            name: {
                "us_per_step": statistics.median(x[name][0] for x in got),
                "cpu_us_per_step": statistics.median(x[name][1] for x in got),
            }
            for name in got[0]
        }
        for version, got in runs.items()
    }
    print(json.dumps({"rounds": runs, "medians": medians}, indent=1))


if __name__ == "__main__":
    main()

"""Client cost of a durable PostgreSQL step, in instructions (valgrind --tool=callgrind: a count
the machine's load cannot move) and in CPU time.

    PYTHONPATH=src python benchmarks/pg_step_cpu.py [--before OTHER_SRC] [--quick]

Starts a private PostgreSQL 15 cluster with its default durability (``scale.py``'s
``cluster()``); only the client process runs under callgrind. Per code version (``--before``
a source tree to compare, e.g. ``git archive 43da763 src | tar -x -C /tmp/base``, then this
checkout's):

- ``instructions_per_append``: one append alone (the commit of a step: a model answer with one
  tool call, three events, the call's ledger row, under a lease), (Ir(K=200) - Ir(K=0)) / 200,
  each after 20 appends to warm up, in a fresh interpreter: start-up and imports cancel out.
- ``instructions_per_step``: a loop step on ``PostgresStore``, the workload of
  ``benchmarks/step_instructions.py`` (one async tool, a zero-latency FunctionModel calling it
  K times): (Ir(K=10) - Ir(K=1)) / (9 x RUNS), and the same on ``MemoryStore`` (the loop's own
  cost), so the store's share is the difference.
- ``cpu_us_per_step``: the same PostgreSQL workload without valgrind, user + system CPU of the
  client per step (``resource.getrusage``), median of ROUNDS rounds that alternate the
  versions: the figure of the target, which other load on the machine does move.

Writes ``benchmarks/results/pg_step_cpu.json`` and prints it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

QUICK = "--quick" in sys.argv
RUNS = 3 if QUICK else 10
ROUNDS = 1 if QUICK else 5
RESULTS = Path(__file__).resolve().parent / "results" / "pg_step_cpu.json"


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def appends(dsn: str, k: int) -> float:
    """20 appends of one step's commit to warm up, then ``k``; CPU seconds of the ``k``."""
    from loom.events import LlmComplete
    from loom.messages import Message, ToolCall
    from loom.store.base import LedgerEntry
    from loom.store.postgres import PostgresStore

    store = PostgresStore(dsn)
    lease = await store.acquire_lease("s", "r", 600)
    assert lease is not None
    events = [LlmComplete(run_id="r", session_id="s", iteration=1, sequence=i) for i in range(3)]
    answer = Message.assistant("", tool_calls=[ToolCall(name="noop", arguments={"i": 1})])
    c0 = cpu_seconds()
    for i in range(20 + k):
        if i == 20:
            c0 = cpu_seconds()
        entry = LedgerEntry("r", "s", f"c{i}", "noop", "started", {"i": 1}, "pure")
        await store.append("s", messages=[answer], events=events, ledger=[entry], lease=lease)
    cpu = cpu_seconds() - c0
    await store.close()
    return cpu


async def steps(dsn: str | None, k: int, runs: int) -> float:
    """``runs`` runs of ``k`` loop steps after a warm-up run; CPU seconds of the runs."""
    from loom import Agent, ModelResponse, Runtime, ToolCall, tool
    from loom.store import MemoryStore
    from loom.store.postgres import PostgresStore
    from loom.testing import FunctionModel

    @tool
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    def answer(messages: list[Any], tools: list[Any]) -> ModelResponse | str:
        done = sum(1 for m in messages if m.role == "tool")
        if done < k:
            return ModelResponse(tool_calls=[ToolCall(name="add", arguments={"a": done, "b": 1})])
        return "done"

    runtime = Runtime(PostgresStore(dsn) if dsn else MemoryStore())
    agent = Agent(name="steps", model=FunctionModel(answer), tools=[add])
    await runtime.run(agent, "warm up", session_id="warm")
    c0 = cpu_seconds()
    for n in range(runs):
        await runtime.run(agent, "go", session_id=f"s{n}")
    cpu = cpu_seconds() - c0
    await runtime.store.close()
    return cpu


def fresh_schema(dsn: str) -> str:
    import secrets

    import psycopg

    schema = f"c_{secrets.token_hex(5)}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return f"{dsn} options='-c search_path={schema}'"


def child(src: str, *args: str, callgrind: bool) -> tuple[int | None, float]:
    """Run ``--part args`` in a fresh interpreter on ``src``: (Ir or None, CPU seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, __file__, "--part", *args]
        if callgrind:
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out", *cmd]
        done = subprocess.run(
            cmd, env={**os.environ, "PYTHONPATH": src}, capture_output=True, text=True
        )
    if done.returncode != 0:
        raise RuntimeError(f"{cmd} failed:\n{done.stderr[-3000:]}")
    cpu = float(done.stdout.strip().splitlines()[-1])
    if not callgrind:
        return None, cpu
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no total:\n{done.stderr[-2000:]}")
    return int(found.group(1)), cpu


def instructions(dsn: str, src: str) -> dict[str, Any]:
    def ir(*args: str) -> int:
        n, _ = child(src, *args, callgrind=True)
        assert n is not None
        return n

    a_small = ir("appends", fresh_schema(dsn), "0")
    a_large = ir("appends", fresh_schema(dsn), "200")
    pg_small = ir("steps", fresh_schema(dsn), "1", str(RUNS))
    pg_large = ir("steps", fresh_schema(dsn), "10", str(RUNS))
    mem_small = ir("steps", "", "1", str(RUNS))
    mem_large = ir("steps", "", "10", str(RUNS))
    per_step_pg = (pg_large - pg_small) / (9 * RUNS)
    per_step_mem = (mem_large - mem_small) / (9 * RUNS)
    return {
        "instructions_per_append": round((a_large - a_small) / 200),
        "instructions_per_step_postgres": round(per_step_pg),
        "instructions_per_step_memory": round(per_step_mem),
        "instructions_per_step_store_share": round(per_step_pg - per_step_mem),
    }


def cpu_per_step(dsn: str, src: str) -> float:
    """Client CPU seconds per PostgreSQL loop step, K=10 minus K=1 runs (start-up cancels)."""
    _, small = child(src, "steps", fresh_schema(dsn), "1", str(RUNS), callgrind=False)
    _, large = child(src, "steps", fresh_schema(dsn), "10", str(RUNS), callgrind=False)
    return (large - small) / (9 * RUNS)


def main() -> None:
    if "--part" in sys.argv:
        at = sys.argv.index("--part")
        what, dsn, *rest = sys.argv[at + 1 :]
        if what == "appends":
            cpu = asyncio.run(appends(dsn, int(rest[0])))
        else:
            cpu = asyncio.run(steps(dsn or None, int(rest[0]), int(rest[1])))
        print(cpu)
        return
    from scale import cluster

    here = str(Path(__file__).resolve().parents[1] / "src")
    before = sys.argv[sys.argv.index("--before") + 1] if "--before" in sys.argv else None
    versions = {"before": before, "after": here} if before else {"now": here}
    with cluster() as dsn:
        out: dict[str, Any] = {"runs": RUNS, "rounds": ROUNDS, "target_cpu_us_per_step": 700}
        for label, src in versions.items():
            assert src is not None
            out[label] = instructions(dsn, src)
        # CPU rounds alternate the versions (each goes first in every other round): both see
        # the same load on the shared machine.
        cpu: dict[str, list[float]] = {label: [] for label in versions}
        order = list(versions.items())
        for r in range(ROUNDS):
            for label, src in order if r % 2 == 0 else order[::-1]:
                assert src is not None
                cpu[label].append(cpu_per_step(dsn, src))
        for label, rounds in cpu.items():
            out[label]["cpu_us_per_step_postgres"] = round(statistics.median(rounds) * 1e6, 1)
            out[label]["cpu_us_per_step_postgres_rounds"] = [round(c * 1e6, 1) for c in rounds]
    if not QUICK:
        RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

"""Instructions per loop step (valgrind --tool=callgrind): a figure load cannot move.

The workload is ``benchmarks/core.py``'s (one async tool ``add``, a zero-latency
``FunctionModel`` that calls it ``K`` times, then answers), ``--runs`` runs of K=1 and of K=10
on a fresh SQLite file (``--store sqlite``) or the in-memory store (``--store memory``), each
under callgrind in a fresh interpreter. Instructions per step = (Ir(K=10) - Ir(K=1)) / (9 x
runs): the import and start-up cancel out. Compare two trees by pointing ``PYTHONPATH`` at
each::

    PYTHONPATH=src python benchmarks/step_instructions.py --store sqlite
    PYTHONPATH=../old/src python benchmarks/step_instructions.py --store sqlite

Prints JSON. Needs valgrind (Debian's ``valgrind``); a run takes about a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any


def workload(k: int, runs: int, store: str) -> None:
    """``runs`` runs of ``k`` steps (what callgrind counts)."""
    from loom import Agent, ModelResponse, Runtime, ToolCall, tool
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

    async def main() -> None:
        if store == "sqlite":
            from loom.store import SQLiteStore

            runtime = Runtime(SQLiteStore(os.path.join(tempfile.mkdtemp(), "steps.db")))
        else:
            runtime = Runtime()
        agent = Agent(name="steps", model=FunctionModel(answer), tools=[add])
        await runtime.run(agent, "warm up", session_id="warm")
        for n in range(runs):
            await runtime.run(agent, "go", session_id=f"s{n}")
        await runtime.store.close()

    asyncio.run(main())


def instructions(k: int, runs: int, store: str) -> int:
    """Ir of one interpreter running the workload under callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={tmp}/cg.out",
                sys.executable,
                __file__,
                "--part",
                str(k),
                str(runs),
                store,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no total:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", choices=["sqlite", "memory"], default="sqlite")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--part", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        workload(int(args.part[0]), int(args.part[1]), args.part[2])
        return
    small, large = (instructions(k, args.runs, args.store) for k in (1, 10))
    per_step = (large - small) / (9 * args.runs)
    out = {"store": args.store, "runs": args.runs, "ir_k1": small, "ir_k10": large}
    print(json.dumps({**out, "instructions_per_step": round(per_step)}, indent=2))


if __name__ == "__main__":
    main()

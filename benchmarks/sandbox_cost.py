"""What one sandboxed call costs (issue #32): start + run ``true`` + close of a local
(bubblewrap) sandbox, and ``true`` in an already started one, against a plain subprocess
``true``.

CPU is the host's own plus its children's (``resource.getrusage``: user + system), so load on
the machine does not move it; wall time is quoted only as a ratio within this run.

    PYTHONPATH=src .venv/bin/python benchmarks/sandbox_cost.py

Writes benchmarks/results/sandbox_cost.json.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from loom.sandbox.base import SandboxSettings
from loom.sandbox.local import LocalSandbox, bubblewrap_available

CALLS = 40
RESULTS = Path(__file__).parent / "results" / "sandbox_cost.json"


def _cpu_ms() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return 1000 * (own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime)


async def _measure(call: Callable[[], Awaitable[object]]) -> dict[str, float]:
    await call()  # warm
    cpu, wall = _cpu_ms(), time.perf_counter()
    for _ in range(CALLS):
        await call()
    return {
        "cpu_ms_per_call": (_cpu_ms() - cpu) / CALLS,
        "wall_ms_per_call": 1000 * (time.perf_counter() - wall) / CALLS,
    }


async def main() -> int:
    reason = bubblewrap_available()
    if reason is not None:
        print(f"skipped: {reason}")
        return 1
    backend = LocalSandbox()
    with tempfile.TemporaryDirectory() as scratch:
        workspace = Path(scratch) / "ws"
        workspace.mkdir()
        (workspace / "a.txt").write_text("a\n")
        settings = SandboxSettings()

        async def plain() -> None:
            process = await asyncio.create_subprocess_exec("true")
            await process.wait()

        async def start_run_close() -> None:
            sandbox = await backend.start(settings, workspace)
            await sandbox.run(["true"])
            await sandbox.close()

        kept = await backend.start(settings, workspace)

        async def run_in_started() -> None:
            await kept.run(["true"])

        figures = {
            "plain_subprocess": await _measure(plain),
            "sandbox_start_run_close": await _measure(start_run_close),
            "sandbox_run_in_started": await _measure(run_in_started),
        }
        await kept.close()
    base = figures["plain_subprocess"]
    for name in ("sandbox_start_run_close", "sandbox_run_in_started"):
        figures[name]["cpu_ratio"] = figures[name]["cpu_ms_per_call"] / base["cpu_ms_per_call"]
        figures[name]["wall_ratio"] = figures[name]["wall_ms_per_call"] / base["wall_ms_per_call"]
    result = {"calls": CALLS, "command": "true", "figures": figures}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

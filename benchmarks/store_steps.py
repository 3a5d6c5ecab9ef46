"""Durable steps per second: one model response + one tool result per step, per store.

    PYTHONPATH=src python benchmarks/store_steps.py [--quick]

Runs turns of STEPS tool-calling steps with a FunctionModel and a trivial tool, once per
store configuration, and prints JSON: steps/s, µs per step, and the overhead per step over
MemoryStore (the cost of durability: 3 commits per step: the model response, the tool-call
start, the tool result).
"""

from __future__ import annotations

import asyncio
import functools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loom import Agent, tool
from loom.messages import Message, ModelResponse, ToolCall
from loom.store import MemoryStore, SQLiteStore
from loom.testing import FunctionModel

QUICK = "--quick" in sys.argv
STEPS = 100 if QUICK else 300
TURNS = 3 if QUICK else 7


@tool(effect="pure", blocking=False)
def noop(i: int) -> int:
    """Return i."""
    return i


def model(messages: list[Message], tools: object) -> ModelResponse | str:
    last = messages[-1]
    done = int(last.content) + 1 if last.role == "tool" else 0
    if done < STEPS:
        return ModelResponse(tool_calls=[ToolCall(name="noop", arguments={"i": done})])
    return "done"


async def measure(make_store: Any) -> tuple[float, float]:
    """Median wall and CPU seconds per step over TURNS turns (one fresh session each).

    CPU time (this process, user + system) is less disturbed by other load on the machine;
    with the writer thread it includes that thread.
    """
    store = make_store()
    agent = Agent(
        model=FunctionModel(model, record=False),
        tools=[noop],
        store=store,
        max_iterations=STEPS + 1,
        max_tool_calls=STEPS + 1,
        max_result_chars=None,
    )
    await agent.run("warm up", session_id="warm")
    per_step, cpu = [], []
    for t in range(TURNS):
        t0, c0 = time.perf_counter(), time.process_time()
        r = await agent.run("go", session_id=f"s{t}")
        per_step.append((time.perf_counter() - t0) / STEPS)
        cpu.append((time.process_time() - c0) / STEPS)
        assert r.stop_reason == "completed", r
    await store.close()
    return statistics.median(per_step), statistics.median(cpu)


async def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    configs: dict[str, Any] = {
        "memory": lambda d: MemoryStore(),
        "sqlite_normal_inline": lambda d: SQLiteStore(d / "a.db"),
        "sqlite_full_inline": lambda d: SQLiteStore(d / "b.db", durability="full"),
        "sqlite_normal_thread": lambda d: SQLiteStore(d / "c.db", threaded=True),
        "sqlite_full_thread": lambda d: SQLiteStore(d / "d.db", durability="full", threaded=True),
    }
    # Interleaved rounds, median per config: the machine is shared and noisy. Each round gets
    # new database files: reusing them would resume round 1's sessions, so later SQLite rounds
    # would build contexts from longer histories than MemoryStore's fresh sessions.
    rounds: dict[str, list[tuple[float, float]]] = {name: [] for name in configs}
    for r in range(1 if QUICK else 3):
        folder = tmp / f"round{r}"
        folder.mkdir()
        for name, make in configs.items():
            rounds[name].append(await measure(functools.partial(make, folder)))
    results = {name: statistics.median(w for w, _ in v) for name, v in rounds.items()}
    cpus = {name: statistics.median(c for _, c in v) for name, v in rounds.items()}
    base, cpu_base = results["memory"], cpus["memory"]
    out = {
        "steps_per_turn": STEPS,
        "turns": TURNS,
        "configs": {
            name: {
                "us_per_step": round(s * 1e6, 1),
                "steps_per_s": round(1 / s),
                "overhead_us_per_step_vs_memory": round((s - base) * 1e6, 1),
                "cpu_us_per_step": round(cpus[name] * 1e6, 1),
                "cpu_overhead_us_per_step_vs_memory": round((cpus[name] - cpu_base) * 1e6, 1),
            }
            for name, s in results.items()
        },
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    asyncio.run(main())

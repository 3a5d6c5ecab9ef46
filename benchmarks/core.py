"""Core loop overhead: per-step cost, agent construction, in-flight memory, import time.

Zero-latency ``FunctionModel`` and one tool ``add(a, b)``, as in issue 2. Prints JSON.

    .venv/bin/python benchmarks/core.py            # full run (~1 min)
    .venv/bin/python benchmarks/core.py --quick    # fewer repetitions
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
from typing import Any

from loom import Agent, ModelResponse, ToolCall, tool
from loom.messages import Message
from loom.testing import FunctionModel
from loom.tools.base import ToolSpec


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool(blocking=False)
def add_inline(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def stepping_model(steps: int, tool_name: str) -> FunctionModel:
    """Calls the tool ``steps`` times (one call per model response), then answers."""
    call = ToolCall(id="call_1", name=tool_name, arguments={"a": 1, "b": 2})
    with_call = ModelResponse(tool_calls=[call])
    final = ModelResponse(text="3")

    def answer(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        done = 0
        for m in reversed(messages):
            if m.role == "user":
                break
            done += m.role == "tool"
        return with_call if done < steps else final

    return FunctionModel(answer, record=False)


def time_runs(agent: Agent, runs: int) -> list[float]:
    async def go() -> list[float]:
        out = []
        for i in range(runs):
            t0 = time.perf_counter()
            result = await agent.run("what is 1 + 2?", session_id=f"s{i}")
            out.append(time.perf_counter() - t0)
            assert result.output == "3", result
        return out

    return asyncio.run(go())


def per_step(tool_name: str, tool_obj: Any, runs: int) -> dict[str, float]:
    med: dict[int, float] = {}
    for steps in (1, 10):
        agent = Agent(
            name="bench",
            model=stepping_model(steps, tool_name),
            tools=[tool_obj],
            max_iterations=20,
        )
        time_runs(agent, 20)  # warm up
        med[steps] = statistics.median(time_runs(agent, runs))
    return {
        "run_1_step_us": med[1] * 1e6,
        "run_10_steps_us": med[10] * 1e6,
        "overhead_per_step_us": (med[10] - med[1]) / 9 * 1e6,
    }


def construction(n: int) -> dict[str, float]:
    model = stepping_model(1, "add")
    for _ in range(100):
        Agent(name="a", instructions="You add numbers.", model=model, tools=[add])
    samples = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(n):
            Agent(name="a", instructions="You add numbers.", model=model, tools=[add])
        samples.append((time.perf_counter() - t0) / n)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    keep = [
        Agent(name="a", instructions="You add numbers.", model=model, tools=[add])
        for _ in range(1000)
    ]
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    size = sum(s.size_diff for s in after.compare_to(before, "filename"))
    del keep
    return {"construct_us": statistics.median(samples) * 1e6, "construct_kib": size / 1000 / 1024}


def rss_kib() -> float:
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return float(line.split()[1])
    return 0.0


def in_flight(n: int) -> dict[str, float]:
    """Memory per run with ``n`` runs parked mid-turn (inside the model call).

    Measured in a fresh interpreter: in this one, memory freed by the earlier benchmarks would
    be reused and hide the growth. RSS is what the process costs; tracemalloc counts the Python
    objects a parked run holds (its task, turn, session and journal in the in-memory store).
    """

    def measure(mode: str) -> float:
        out = subprocess.run(
            [sys.executable, __file__, "--in-flight-only", str(n), "--in-flight-mode", mode],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return float(out.stdout)

    rss, traced = measure("rss"), measure("traced")  # tracemalloc's own tables would inflate RSS
    return {"in_flight_runs": n, "rss_kib_per_run": rss / n, "traced_kib_per_run": traced / n}


async def _in_flight_measure(n: int, mode: str) -> float:
    gate = asyncio.Event()
    gate.set()

    async def answer(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        await gate.wait()
        return ModelResponse(text="3")

    agent = Agent(name="f", model=FunctionModel(answer, record=False), tools=[add])
    for i in range(50):  # warm caches and lazy imports
        await agent.run("warm up", session_id=f"w{i}")
    gate.clear()
    gc.collect()
    base = rss_kib()
    if mode == "traced":
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    tasks = [asyncio.create_task(agent.run("what is 1 + 2?", session_id=f"s{i}")) for i in range(n)]
    for _ in range(200):
        await asyncio.sleep(0.02)
        if len(agent.store._sessions) >= n + 50:  # type: ignore[attr-defined]
            break
    await asyncio.sleep(0.2)
    gc.collect()
    traced = (tracemalloc.get_traced_memory()[0] - before) / 1024
    tracemalloc.stop()
    grown = rss_kib() - base
    gate.set()
    results = await asyncio.gather(*tasks)
    assert all(r.output == "3" for r in results)
    return traced if mode == "traced" else grown


def import_time(repeats: int) -> dict[str, float]:
    samples = []
    for _ in range(repeats):
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                "import time; t=time.perf_counter(); import loom; print(time.perf_counter()-t)",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        samples.append(float(out.stdout))
    return {"import_loom_ms": statistics.median(samples) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--in-flight-only", type=int, metavar="N", help=argparse.SUPPRESS)
    parser.add_argument("--in-flight-mode", default="rss", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.in_flight_only:
        print(asyncio.run(_in_flight_measure(args.in_flight_only, args.in_flight_mode)))
        return
    runs = 100 if args.quick else 300
    result: dict[str, Any] = {"runs_per_median": runs}
    result["thread_tool"] = per_step("add", add, runs)
    result["inline_tool"] = per_step("add_inline", add_inline, runs)
    result.update(construction(2000 if args.quick else 10000))
    result.update(in_flight(2000))
    result.update(import_time(5 if args.quick else 11))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

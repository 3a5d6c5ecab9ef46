"""Seed 002's crew figure: "Sequential: 3 tasks × 30 s = 90 s; Parallel: 3 tasks → 30 s".

Three members each call one tool that sleeps ``--seconds`` (default 3; ``--seconds 30`` for
the seed's own figure), on a zero-latency test model, once as ``Sequential`` and once as
``Parallel``; prints JSON with both wall times, the speed-up, and the crew overhead (wall time
minus the sleeping)::

    python benchmarks/crews.py
    python benchmarks/crews.py --seconds 30 --members 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from loom import Agent, ModelResponse, ToolCall, tool
from loom.crew import Crew, Parallel, Sequential
from loom.messages import Message, ToolSpec
from loom.testing import FunctionModel


def member(name: str, seconds: float) -> Agent:
    @tool(timeout=seconds * 4 + 10)
    async def work() -> str:
        """Do the task (sleeps)."""
        await asyncio.sleep(seconds)
        return "done"

    def model(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse | str:
        if messages[-1].role == "tool":
            return f"{name} finished"
        return ModelResponse(tool_calls=[ToolCall(name="work")])

    return Agent(name=name, model=FunctionModel(model, record=False), tools=[work])


async def measure(seconds: float, n: int) -> dict[str, float]:
    names = [f"m{i}" for i in range(n)]
    out: dict[str, float] = {}
    for label, plan in (("sequential", Sequential(*names)), ("parallel", Parallel(*names))):
        crew = Crew("bench", members={m: member(m, seconds) for m in names}, plan=plan)
        started = time.perf_counter()
        res = await crew.run("go")
        out[f"{label}_s"] = round(time.perf_counter() - started, 3)
        assert res.stop_reason == "completed", res.error
    out["speedup"] = round(out["sequential_s"] / out["parallel_s"], 2)
    out["parallel_overhead_ms"] = round((out["parallel_s"] - seconds) * 1000, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--members", type=int, default=3)
    args = parser.parse_args()
    result = asyncio.run(measure(args.seconds, args.members))
    print(json.dumps({"seconds_per_task": args.seconds, "members": args.members, **result}))


if __name__ == "__main__":
    main()

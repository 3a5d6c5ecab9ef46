"""Console page load for a long session: server time of ``GET /console/sessions/{id}``.

Builds a SQLite session of ``--turns`` turns (default 1,000; each turn a user message, a model
call asking for one tool call, the tool's result and a final answer, on a zero-latency
``loom.testing.FunctionModel``), then times the session page through the ASGI app in process
(``httpx.ASGITransport``: the server's time, no socket, no browser): ``--repeats`` loads,
median and p90 in ms. Target (issue 17): ≤ 300 ms for 1,000 turns. Prints JSON::

    python benchmarks/console.py              # 1,000 turns, 20 loads
    python benchmarks/console.py --turns 100  # quicker
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

TARGET_MS = 300.0


async def main(turns: int, repeats: int) -> dict[str, Any]:
    import httpx

    from loom import Agent, ModelResponse, ToolCall, tool
    from loom.engine.runtime import Runtime
    from loom.server import AgentRegistry
    from loom.server.app import create_app
    from loom.store.sqlite import SQLiteStore
    from loom.testing import FunctionModel

    @tool(effect="pure")
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    def model(messages: list[Any], tools: Any) -> Any:
        last = messages[-1]
        if last.role == "tool":
            return f"The sum is {last.content}."
        return ModelResponse(tool_calls=[ToolCall(name="add", arguments={"a": 2, "b": 3})])

    agent = Agent(name="calc", model=FunctionModel(model), tools=[add])
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(str(Path(tmp) / "bench.db"))
        runtime = Runtime(store=store)
        started = time.perf_counter()
        for i in range(turns):
            await runtime.run(agent, f"add 2 and 3 (turn {i})", session_id="long")
        build_s = time.perf_counter() - started
        events = len(await store.load_events("long"))
        app = create_app(AgentRegistry([agent]), runtime)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            first = await client.get("/console/sessions/long")
            assert first.status_code == 200, first.text[:500]
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                r = await client.get("/console/sessions/long")
                times.append((time.perf_counter() - t0) * 1000)
                assert r.status_code == 200
            older = await client.get("/console/sessions/long?page=5")
            assert older.status_code == 200
        await runtime.aclose()
    times.sort()
    median = statistics.median(times)
    return {
        "turns": turns,
        "events": events,
        "build_s": round(build_s, 1),
        "page_bytes": len(first.content),
        "loads": repeats,
        "median_ms": round(median, 1),
        "p90_ms": round(times[int(0.9 * (len(times) - 1))], 1),
        "target_ms": TARGET_MS,
        "met": median <= TARGET_MS,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.turns, args.repeats)), indent=2))

"""What budgets beyond one run (loom.budgets) cost per model call on SQLite: CPU time per run
(process time, not wall) and the ledger's SQL statements and write transactions per call, with
no limits and with two limits (owner/day in money, global/month in tokens).

    python benchmarks/budgets_overhead.py   # writes benchmarks/results/budgets_overhead.json
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from loom import Agent
from loom.engine.runtime import Runtime
from loom.messages import ModelResponse, Usage
from loom.models.base import ModelSettings
from loom.store.sqlite import SQLiteStore
from loom.testing import FunctionModel

RUNS = 300
LIMITS = [
    {"scope": "owner", "window": "day", "max_cost": 1000.0},
    {"scope": "global", "window": "month", "max_tokens": 10**11},
]
PRICES = {"function": {"input": 1.0, "output": 4.0}}


def _answer(messages: Any, tools: Any) -> ModelResponse:
    return ModelResponse(text="ok", usage=Usage(input_tokens=100, output_tokens=20, requests=1))


async def measure(budgets: list[dict[str, Any]] | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(str(Path(tmp) / "loom.db"))
        rt = Runtime(store, prices=PRICES, budgets=budgets or [])
        counts = {"statements": 0, "writes": 0}
        if rt.budget_guard is not None:
            tables: Any = rt.budget_guard.ledger.tables  # type: ignore[attr-defined]

            def counted(name: str, writes: bool) -> Any:
                inner = getattr(tables, name)

                async def call(*args: Any, **kwargs: Any) -> Any:
                    counts["statements"] += 1 + (len(args[2]) if name == "schedule_gated" else 0)
                    counts["writes"] += writes
                    return await inner(*args, **kwargs)

                return call

            rt.budget_guard.ledger.tables = SimpleNamespace(  # type: ignore[attr-defined]
                schedule_rows=counted("schedule_rows", False),
                schedule_execute=counted("schedule_execute", True),
                schedule_gated=counted("schedule_gated", True),
            )
        agent = Agent(
            name="a", model=FunctionModel(_answer), model_settings=ModelSettings(max_tokens=50)
        )
        for i in range(20):  # warm
            await rt.run(agent, "hi", session_id=f"w{i}")
        counts.update(statements=0, writes=0)
        cpu = time.process_time()
        for i in range(RUNS):
            r = await rt.run(agent, "hi", session_id=f"s{i}")
            assert r.stop_reason == "completed", r.error
        cpu = time.process_time() - cpu
        await store.close()
    return {
        "cpu_ms_per_run": cpu * 1000 / RUNS,
        "ledger_statements_per_call": counts["statements"] / RUNS,
        "ledger_write_transactions_per_call": counts["writes"] / RUNS,
    }


def main() -> None:
    off = asyncio.run(measure(None))
    on = asyncio.run(measure(LIMITS))
    out = {
        "runs": RUNS,
        "limits": LIMITS,
        "without_budgets": off,
        "with_two_limits": on,
        "cpu_ratio": on["cpu_ms_per_run"] / off["cpu_ms_per_run"],
    }
    path = Path(__file__).parent / "results" / "budgets_overhead.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

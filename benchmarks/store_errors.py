"""Error store write and read latency (seed 001 quotes 5 ms / 3 ms P50 for store / get).

    PYTHONPATH=src python benchmarks/store_errors.py [--quick]

Stores N errors (a ~3 KB traceback each) in a SQLite file, then reads them back by id and
lists them with filters; both durability settings. Prints JSON with P50 / P99 in µs.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from loom.store import SQLiteStore
from loom.store.base import StoredError, new_error_id

QUICK = "--quick" in sys.argv
N = 500 if QUICK else 3000
TRACE = "".join(
    f'  File "app/db.py", line {i}, in call_{i}\n    conn.execute(q)\n' for i in range(60)
)


def pct(values: list[float], q: float) -> float:
    return round(sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1e6, 1)


async def bench(path: Path, durability: str) -> dict[str, float]:
    store = SQLiteStore(path, durability=durability)  # type: ignore[arg-type]
    writes, ids = [], []
    for i in range(N):
        err = StoredError(
            new_error_id(),
            f"s{i % 50}",
            f"tool{i % 7}",
            {"code": "tool_exception", "message": f"boom {i}", "traceback": TRACE},
            f"boom {i}",
        )
        t = time.perf_counter()
        ids.append(await store.save_error(err))
        writes.append(time.perf_counter() - t)
    reads = []
    for eid in random.Random(1).sample(ids, min(N, 1000)):
        t = time.perf_counter()
        assert await store.get_error(eid) is not None
        reads.append(time.perf_counter() - t)
    lists = []
    for i in range(200):
        t = time.perf_counter()
        await store.list_errors(session_id=f"s{i % 50}", tool_name=f"tool{i % 7}", limit=10)
        lists.append(time.perf_counter() - t)
    await store.close()
    return {
        "store_p50_us": pct(writes, 0.5),
        "store_p99_us": pct(writes, 0.99),
        "get_p50_us": pct(reads, 0.5),
        "get_p99_us": pct(reads, 0.99),
        "list_p50_us": pct(lists, 0.5),
        "list_p99_us": pct(lists, 0.99),
    }


async def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    out = {"errors": N, "seed_p50_us": {"store": 5000, "get": 3000, "list": 10000}}
    for durability in ("normal", "full"):
        out[durability] = await bench(tmp / f"{durability}.db", durability)  # type: ignore[assignment]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    asyncio.run(main())

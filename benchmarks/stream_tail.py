"""Commit-to-frame latency of a queued run streamed from another process: NOTIFY vs polling.

    PYTHONPATH=src python benchmarks/stream_tail.py [--quick]

Starts a private PostgreSQL 15 cluster (``benchmarks/scale.py``'s, default durability) and,
per tail mode, a real ``loom serve --store postgres://... --queue`` process. The benchmark
plays the worker: it creates a background run through the server (so the run id is mapped to a
job), then commits the run's events to the journal itself (``PostgresStore.append``, one event
a commit, ``GAP`` seconds apart), while an ``httpx`` client streams the run from the server
(``GET /threads/{t}/runs/{r}/stream``, the ``events`` mode). Latency of an event = the time the
client read its frame minus the time its ``append`` returned (the commit is acknowledged).
Modes: ``notify`` (LISTEN/NOTIFY, 1 s safety poll) and ``poll`` at 100 ms and 25 ms. Also the
cost of the NOTIFY itself on an append (µs, appends with vs without events' notify are not
separable without editing the store, so this reports the append time in each mode's run).
Prints JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
from scale import cluster  # the private PostgreSQL cluster

from loom.events import AgentFinish, AgentStart, Warning
from loom.store.postgres import PostgresStore

QUICK = "--quick" in sys.argv
EVENTS = 20 if QUICK else 100
GAP = 0.03
SRC = str(Path(__file__).resolve().parents[1] / "src")

AGENTS = """
from loom import Agent
from loom.testing import FunctionModel
agents = [Agent(name="bench", model=FunctionModel(lambda m, t: "ok"))]
"""


def url_of(dsn: str, schema: str) -> str:
    d = dict(p.split("=", 1) for p in dsn.split())
    opts = quote(f"-c search_path={schema}")
    return f"postgresql://{d['user']}@{d['host']}:{d['port']}/{d['dbname']}?options={opts}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(url: str, workdir: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    (workdir / "bench_agents.py").write_text(AGENTS)
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loom",
            "serve",
            "--app",
            "bench_agents:agents",
            "--port",
            str(port),
            "--store",
            url,
            "--queue",
            "--log-level",
            "warning",
        ],
        env={**os.environ, **env, "PYTHONPATH": os.pathsep.join([SRC, str(workdir)])},
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the server did not start")


async def measure(url: str, dsn: str, base: str) -> dict[str, Any]:
    store = PostgresStore(dsn)
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        tid = (await client.post("/threads", json={})).json()["thread_id"]
        run = (
            await client.post(
                f"/threads/{tid}/runs",
                json={
                    "assistant_id": "bench",
                    "input": {"messages": [{"role": "user", "content": "x"}]},
                    "stream_mode": ["events"],
                },
            )
        ).json()
        run_id = run["run_id"]
        committed: dict[int, float] = {}
        received: dict[int, float] = {}
        appends: list[float] = []
        started = asyncio.Event()

        async def read() -> None:
            path = f"/threads/{tid}/runs/{run_id}/stream"
            async with client.stream("GET", path, params={"stream_mode": "events"}) as resp:
                started.set()
                async for line in resp.aiter_lines():
                    if line.startswith("data: ") and '"sequence"' in line:
                        received[json.loads(line[6:])["sequence"]] = time.perf_counter()

        reader = asyncio.ensure_future(read())
        await started.wait()
        for seq in range(EVENTS + 2):
            if seq == 0:
                ev: Any = AgentStart(run_id=run_id, session_id=tid, sequence=0, agent="bench")
            elif seq <= EVENTS:
                ev = Warning(run_id=run_id, session_id=tid, sequence=seq, warning=f"w{seq}")
            else:
                ev = AgentFinish(
                    run_id=run_id, session_id=tid, sequence=seq, stop_reason="completed"
                )
            t0 = time.perf_counter()
            await store.append(tid, events=[ev])
            committed[seq] = time.perf_counter()
            appends.append(committed[seq] - t0)
            await asyncio.sleep(GAP)
        await asyncio.wait_for(reader, 30)
    await store.close()
    lat = sorted((received[s] - committed[s]) * 1000 for s in committed if s in received)
    return {
        "frames": len(lat),
        "median_ms": round(statistics.median(lat), 2),
        "p90_ms": round(lat[int(0.9 * (len(lat) - 1))], 2),
        "max_ms": round(lat[-1], 2),
        "append_median_us": round(statistics.median(appends) * 1e6),
    }


def main() -> None:
    import psycopg

    modes = [
        ("notify", {"LOOM_QUEUE_TAIL": "notify"}),
        ("poll_100ms", {"LOOM_QUEUE_TAIL": "poll", "LOOM_QUEUE_POLL": "0.1"}),
        ("poll_25ms", {"LOOM_QUEUE_TAIL": "poll", "LOOM_QUEUE_POLL": "0.025"}),
    ]
    out: dict[str, Any] = {"events": EVENTS, "gap_s": GAP}
    with cluster() as dsn:
        for name, env in modes:
            schema = f"b_{name}"
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f"CREATE SCHEMA {schema}")
            url = url_of(dsn, schema)
            with tempfile.TemporaryDirectory() as tmp:
                proc, base = serve(url, Path(tmp), env)
                try:
                    out[name] = asyncio.run(
                        measure(url, f"{dsn} options='-c search_path={schema}'", base)
                    )
                finally:
                    proc.terminate()
                    proc.wait(15)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

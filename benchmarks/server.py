"""`loom serve` on issue 13's workload: latency, per-step cost, SSE, throughput, memory, cold start.

The workload is ``benchmarks/core.py``'s: one async tool ``add(a, b)`` and a zero-latency
``FunctionModel`` that answers its call ``i`` of a run with ``add(a=i, b=1)`` while ``i < K``,
then ``"done"`` (``i`` is read from the run's own messages, so concurrent runs do not share a
counter). Two agents are served, ``k1`` (K=1) and ``k10`` (K=10), by a real ``loom serve``
subprocess on the default SQLite store (``.loom/loom.db`` in a fresh directory), and driven by
plain ``httpx`` clients over loopback. One run is two requests: ``POST /threads`` then
``POST /threads/{id}/runs/wait`` (or ``/runs/stream``). Each part starts a fresh server, so one
part's threads never weigh on the next. Prints JSON::

    python benchmarks/server.py             # full run (about three minutes)
    python benchmarks/server.py --quick     # short runs (a smoke test)
    python benchmarks/server.py --only latency --profile /tmp/server.prof   # cProfile the server

Measures:
    latency       median / p90 ms of create-thread + blocking run, K=1 and K=10 (one client, in
                  sequence); per-step cost = (median(K=10) - median(K=1)) / 9; server CPU ms per run
    sse           time to the first SSE event and to the end of a streamed K=1 run
    throughput    runs/s with 16 and 64 concurrent clients (each loops: create a thread, run once),
                  with the server's CPU ms per run (``/proc/<pid>/stat`` utime+stime)
    memory        server RSS and SQLite bytes (db + WAL files; and the db alone after a WAL
                  checkpoint) per thread after 1,000 threads with one finished run each (from a
                  warmed-up baseline), and RSS per thread over 1,000 threads more
    long_thread   server RSS after turns 10, 100, ..., 500 of one thread (a blocking K=1 run each)
    long_thread_stream  the same with each run streamed in every mode
    cold_start    ``loom serve`` spawn to /readyz 200, and to the first successful run (fresh
                  interpreter each, median of several)

``--profile FILE`` runs every server under cProfile (statistics of the last one stopped are
written to FILE when it shuts down); the figures of a profiled run are not the real ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

SRC = str(Path(__file__).resolve().parents[1] / "src")  # this checkout, not an installed loom
K_SMALL, K_LARGE = 1, 10
CLK_TCK = os.sysconf("SC_CLK_TCK")
TARGETS = {
    "run_k1_ms": 5.0,
    "server_cpu_ms_per_run": 3.0,
    "runs_per_s_64_clients": 150.0,
    "rss_kib_per_idle_thread": 8.0,
    "ready_s": 1.5,
}
# The same workload measured against other servers on a machine of this kind (issue 13).
PEERS = {
    "langgraph_dev_inmem": {
        "run_k1_ms": 1016,
        "per_step_ms": 8.2,
        "runs_per_s_16": 18,
        "server_cpu_ms_per_run": "46-58",
        "rss_kib_per_thread": 37,
        "ready_s": 2.7,
    },
    "agno_agentos_sqlite": {
        "run_k1_ms": 19,
        "per_step_ms": 1.5,
        "runs_per_s": "40-42",
        "server_cpu_ms_per_run": "19-21",
        "rss_kib_per_thread": 2.8,
        "disk_kib_per_thread": 4.9,
        "ready_s": 3.3,
    },
    "fastapi_pydantic_ai_no_persistence": {
        "run_k1_ms": 13.6,
        "per_step_ms": 3.9,
        "runs_per_s": "71-82",
        "server_cpu_ms_per_run": 12,
    },
    "empty_fastapi": {
        "run_k1_ms": 2.6,
        "runs_per_s": "200-250",
        "server_cpu_ms_per_run": 0.9,
        "ready_s": 0.8,
    },
}

AGENTS = '''
"""The benchmark's agents: benchmarks/core.py's workload with K=1 and K=10."""

from loom import Agent, ModelResponse, ToolCall, tool
from loom.server import AgentRegistry
from loom.testing import FunctionModel


@tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def model(k):
    def answer(messages, tools):
        i = 0  # tool results since the run's user message = calls made so far in this run
        for message in reversed(messages):
            if message.role == "user":
                break
            i += message.role == "tool"
        if i < k:
            return ModelResponse(tool_calls=[ToolCall(id=f"c{i}", name="add",
                                                      arguments={"a": i, "b": 1})])
        return ModelResponse(text="done")

    return FunctionModel(answer, record=False)


registry = AgentRegistry([
    Agent(name=f"k{k}", model=model(k), tools=[add], max_iterations=20) for k in (1, 10)
])
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    workdir: Path
    spawned: float  # perf_counter at spawn

    def cpu_s(self) -> float:
        """The server's user + system CPU seconds so far."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def runqueue_wait_s(self) -> float:
        """Seconds the server's main thread (the event loop) was runnable but waited for a CPU
        (``/proc/<pid>/schedstat``): the share of its time other processes took."""
        return int(Path(f"/proc/{self.process.pid}/schedstat").read_text().split()[1]) / 1e9

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def disk_bytes(self) -> int:
        db = self.workdir / ".loom"
        return sum(p.stat().st_size for p in db.glob("loom.db*"))

    def checkpointed_db_bytes(self) -> int:
        """The database file's size after its WAL was copied in and truncated: the pages the
        data takes, without the WAL's size (which grows and is reused in steps)."""
        import sqlite3

        path = self.workdir / ".loom" / "loom.db"
        conn = sqlite3.connect(path, timeout=30)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        finally:
            conn.close()
        return path.stat().st_size


def _spawn(workdir: Path, profile: str | None) -> Server:
    (workdir / "bench_agents.py").write_text(AGENTS)
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, str(workdir)]))
    args = [
        "serve",
        "--app",
        "bench_agents:registry",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    if profile:
        # uvicorn re-raises SIGTERM after its graceful shutdown: make that an exit that
        # cProfile.run survives, so it writes its statistics
        code = (
            "import cProfile, signal, sys; from loom.cli import main; out = sys.argv[1]; "
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
            "sys.argv = ['loom', *sys.argv[2:]]; cProfile.run('main()', out)"
        )
        cmd = [sys.executable, "-c", code, profile, *args]
    else:
        cmd = [sys.executable, "-m", "loom", *args]
    log = (workdir / "server.log").open("wb")
    t0 = time.perf_counter()
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir)
    return Server(f"http://127.0.0.1:{port}", process, workdir, t0)


def _wait_ready(server: Server, client: httpx.Client) -> float:
    """Seconds from spawn to the first /readyz 200."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError((server.workdir / "server.log").read_text())
        try:
            if client.get(f"{server.url}/readyz", timeout=1).status_code == 200:
                return time.perf_counter() - server.spawned
        except httpx.HTTPError:
            pass
        time.sleep(0.005)
    raise RuntimeError("the server did not become ready in 60 s")


def _stop(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


@contextmanager
def served(profile: str | None) -> Iterator[tuple[Server, httpx.Client]]:
    with tempfile.TemporaryDirectory() as tmp, httpx.Client(timeout=60) as client:
        server = _spawn(Path(tmp), profile)
        try:
            _wait_ready(server, client)
            yield server, client
        finally:
            _stop(server)


RUN_BODY = {"input": {"messages": [{"role": "user", "content": "go"}]}}


def one_run(client: httpx.Client, url: str, agent: str) -> None:
    thread = client.post(f"{url}/threads", json={})
    thread.raise_for_status()
    tid = thread.json()["thread_id"]
    done = client.post(f"{url}/threads/{tid}/runs/wait", json={"assistant_id": agent, **RUN_BODY})
    done.raise_for_status()
    messages = done.json()["messages"]
    assert messages[-1]["content"] == "done", messages[-1]


def _loadavg() -> list[float]:
    """The machine's 1, 5 and 15-minute load averages (2 cores: above 2 means queued work)."""
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def latency(runs: int, warm: int, profile: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": runs}
    with served(profile) as (server, client):
        for k in (K_SMALL, K_LARGE):
            agent = f"k{k}"
            for _ in range(warm):
                one_run(client, server.url, agent)
            times = []
            cpu0 = server.cpu_s()
            for _ in range(runs):
                t0 = time.perf_counter()
                one_run(client, server.url, agent)
                times.append(time.perf_counter() - t0)
            cpu = (server.cpu_s() - cpu0) / runs
            out[f"run_k{k}_ms"] = statistics.median(times) * 1e3
            out[f"run_k{k}_p90_ms"] = _pct(times, 0.9) * 1e3
            out[f"server_cpu_ms_per_run_k{k}"] = cpu * 1e3
        # the two halves of a K=1 run: creating the thread, and the blocking run
        create, wait = [], []
        for _ in range(runs):
            t0 = time.perf_counter()
            tid = client.post(f"{server.url}/threads", json={}).json()["thread_id"]
            t1 = time.perf_counter()
            client.post(
                f"{server.url}/threads/{tid}/runs/wait", json={"assistant_id": "k1", **RUN_BODY}
            ).raise_for_status()
            create.append(t1 - t0)
            wait.append(time.perf_counter() - t1)
        out["create_thread_ms"] = statistics.median(create) * 1e3
        out["runs_wait_k1_ms"] = statistics.median(wait) * 1e3
        # the HTTP floor of this server: a GET that does nothing
        health = []
        for _ in range(runs):
            t0 = time.perf_counter()
            client.get(f"{server.url}/healthz").raise_for_status()
            health.append(time.perf_counter() - t0)
        out["healthz_ms"] = statistics.median(health) * 1e3
    out["per_step_ms"] = (out["run_k10_ms"] - out["run_k1_ms"]) / (K_LARGE - K_SMALL)
    out["per_step_server_cpu_ms"] = (
        out["server_cpu_ms_per_run_k10"] - out["server_cpu_ms_per_run_k1"]
    ) / (K_LARGE - K_SMALL)
    return out


def sse(runs: int, warm: int, profile: str | None) -> dict[str, Any]:
    first, end = [], []
    with served(profile) as (server, client):
        for i in range(warm + runs):
            tid = client.post(f"{server.url}/threads", json={}).json()["thread_id"]
            body = {"assistant_id": "k1", "stream_mode": ["values"], **RUN_BODY}
            t0 = time.perf_counter()
            t_first = None
            events = []
            with client.stream("POST", f"{server.url}/threads/{tid}/runs/stream", json=body) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if line.startswith("event:"):
                        t_first = t_first or time.perf_counter()
                        events.append(line[6:].strip())
            t_end = time.perf_counter()
            assert events[0] == "metadata" and events[-1] == "end", events
            if i >= warm and t_first is not None:
                first.append(t_first - t0)
                end.append(t_end - t0)
    return {
        "runs": runs,
        "first_event_ms": statistics.median(first) * 1e3,
        "first_event_p90_ms": _pct(first, 0.9) * 1e3,
        "stream_end_ms": statistics.median(end) * 1e3,
        "stream_end_p90_ms": _pct(end, 0.9) * 1e3,
    }


async def _clients(server: Server, n: int, seconds: float) -> dict[str, float]:
    url = server.url
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    done = 0
    times: list[float] = []
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def loop(deadline: float) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                tid = (await client.post(f"{url}/threads", json={})).json()["thread_id"]
                r = await client.post(
                    f"{url}/threads/{tid}/runs/wait", json={"assistant_id": "k1", **RUN_BODY}
                )
                r.raise_for_status()
                done += 1
                times.append(time.perf_counter() - t0)

        await asyncio.gather(*(loop(time.perf_counter() + 1.0) for _ in range(n)))  # warm up
        done, times = 0, []
        cpu0, client_cpu0, t0 = server.cpu_s(), time.process_time(), time.perf_counter()
        waited0 = server.runqueue_wait_s()
        await asyncio.gather(*(loop(t0 + seconds) for _ in range(n)))
        wall, cpu = time.perf_counter() - t0, server.cpu_s() - cpu0
        client_cpu = time.process_time() - client_cpu0
        waited = server.runqueue_wait_s() - waited0
    return {
        "runs": done,
        "runs_per_s": done / wall,
        "run_median_ms": statistics.median(times) * 1e3,
        "run_p90_ms": _pct(times, 0.9) * 1e3,
        "server_cpu_ms_per_run": cpu / max(done, 1) * 1e3,
        "server_cpu_share": cpu / wall,  # of one core
        "server_runqueue_wait_share": waited / wall,  # runnable, but another process had the CPU
        "client_cpu_ms_per_run": client_cpu / max(done, 1) * 1e3,
        "loadavg_after": _loadavg()[0],
    }


def throughput(seconds: float, profile: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"seconds": seconds}
    for n in (16, 64):
        with served(profile) as (server, _):
            out[f"clients_{n}"] = asyncio.run(_clients(server, n, seconds))
    return out


def memory(threads: int, profile: str | None) -> dict[str, Any]:
    with served(profile) as (server, client):
        for _ in range(50):
            one_run(client, server.url, "k1")
        time.sleep(0.5)
        rss0, disk0 = server.rss_kib(), server.disk_bytes()
        pages0 = server.checkpointed_db_bytes()
        for _ in range(threads):
            one_run(client, server.url, "k1")
        time.sleep(0.5)
        rss1, disk1 = server.rss_kib(), server.disk_bytes()
        pages1 = server.checkpointed_db_bytes()
        # as many threads again: the bounded caches (SQLite's page cache, the runtime's
        # transcripts, the runs held) are full by now, so what grows is what each thread leaves
        for _ in range(threads):
            one_run(client, server.url, "k1")
        time.sleep(0.5)
        rss2 = server.rss_kib()
    return {
        "threads": threads,
        "rss_baseline_kib": rss0,
        "rss_after_kib": rss1,
        "rss_kib_per_thread": (rss1 - rss0) / threads,
        "rss_kib_per_thread_second_batch": (rss2 - rss1) / threads,
        "disk_kib_per_thread": (disk1 - disk0) / threads / 1024,  # db + WAL files
        "db_kib_per_thread": (pages1 - pages0) / threads / 1024,  # checkpointed db pages
    }


def long_thread(turns: int, profile: str | None, stream: bool = False) -> dict[str, Any]:
    """One thread, ``turns`` K=1 runs in sequence (blocking; with ``stream``, streamed in every
    mode and read to the end): the server's RSS after 10, 100, ...

    Issue 26: the 500th turn of one thread must cost the server no more memory than the 10th.
    """
    marks = sorted({10, *range(100, turns + 1, 100)} & set(range(1, turns + 1)))
    rss: dict[str, int] = {}
    cpu: dict[str, float] = {}
    with served(profile) as (server, client):
        tid = client.post(f"{server.url}/threads", json={}).json()["thread_id"]
        cpu0 = server.cpu_s()
        for turn in range(1, turns + 1):
            if stream:
                modes = ["values", "updates", "messages-tuple", "events"]
                body = {"assistant_id": "k1", "stream_mode": modes, **RUN_BODY}
                done = client.post(f"{server.url}/threads/{tid}/runs/stream", json=body)
                assert done.text.rstrip().endswith("}"), done.text[-200:]
            else:
                done = client.post(
                    f"{server.url}/threads/{tid}/runs/wait",
                    json={"assistant_id": "k1", **RUN_BODY},
                )
            done.raise_for_status()
            if turn in marks:
                rss[str(turn)] = server.rss_kib()
                cpu[str(turn)] = server.cpu_s() - cpu0
        disk = server.disk_bytes()
    first, last = str(marks[0]), str(marks[-1])
    return {
        "turns": turns,
        "rss_kib_after_turn": rss,
        "server_cpu_s_after_turn": cpu,
        "rss_growth_ratio": rss[last] / rss[first],
        "rss_growth_kib_per_turn": (rss[last] - rss[first]) / (int(last) - int(first)),
        "disk_kib": disk / 1024,
    }


def cold_start(repeats: int, profile: str | None) -> dict[str, Any]:
    ready, first_run = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp, httpx.Client(timeout=60) as client:
            server = _spawn(Path(tmp), profile)
            try:
                ready.append(_wait_ready(server, client))
                one_run(client, server.url, "k1")
                first_run.append(time.perf_counter() - server.spawned)
            finally:
                _stop(server)
    return {
        "repeats": repeats,
        "ready_s": statistics.median(ready),
        "ready_s_all": [round(x, 3) for x in ready],
        "first_run_s": statistics.median(first_run),
        "first_run_s_all": [round(x, 3) for x in first_run],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke test)")
    parser.add_argument("--only", help="comma-separated parts (latency, sse, throughput, ...)")
    parser.add_argument("--profile", help="run the servers under cProfile, stats to this file")
    args = parser.parse_args()
    quick, prof = args.quick, args.profile
    only = set(args.only.split(",")) if args.only else None

    def want(part: str) -> bool:
        return only is None or part in only

    result: dict[str, Any] = {
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "store": "SQLite, the default (.loom/loom.db)",
        "loadavg_before": _loadavg(),
    }
    if want("latency"):
        result["latency"] = latency(50 if quick else 300, 10 if quick else 30, prof)
    if want("sse"):
        result["sse"] = sse(30 if quick else 200, 5 if quick else 20, prof)
    if want("throughput"):
        result["throughput"] = throughput(3.0 if quick else 20.0, prof)
    if want("memory"):
        result["memory"] = memory(200 if quick else 1000, prof)
    if want("long_thread"):
        result["long_thread"] = long_thread(100 if quick else 500, prof)
    if want("long_thread_stream"):
        result["long_thread_stream"] = long_thread(100 if quick else 500, prof, stream=True)
    if want("cold_start"):
        result["cold_start"] = cold_start(2 if quick else 5, prof)
    result["loadavg_after"] = _loadavg()
    result["targets"] = TARGETS
    result["peers"] = PEERS
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

"""Tracing overhead per loop step: OpenTelemetry SDK with an in-memory exporter vs tracing off.

The workload is ``benchmarks/core.py``'s (one async tool ``add``, a zero-latency
``FunctionModel`` calling it K times, then answering "done"); a step's cost is
``(t(K=10) - t(K=1)) / 9``. Two figures:

    end_to_end   per-step cost with ``Runtime(observers=[OtelObserver(sdk provider)])`` (a
                 ``SimpleSpanProcessor`` into an ``InMemorySpanExporter``, and an SDK meter
                 provider) minus the same without an observer. Off and on are measured in
                 alternating rounds in one interpreter and the median of the rounds' differences
                 is kept, so the machine's drift cancels out; CPU time (``process_time``).
    replay       the observer alone: the events of one K=10 run (recorded once) fed through a
                 fresh observer again and again, per step: ``(t(K=10 events) - t(K=1)) / 9``;
                 ``replay_batch_processor`` with a ``BatchSpanProcessor`` (what
                 ``loom.observability.configure`` uses) instead of the simple one;
                 ``replay_api_only`` with no SDK (the API's no-op tracer and meter).

The exporter keeps the spans in memory (it is cleared every round): export cost to a real
collector happens on the ``BatchSpanProcessor``'s thread, not in the run. Prints JSON::

    PYTHONPATH=src python benchmarks/tracing.py            # full run (about a minute)
    PYTHONPATH=src python benchmarks/tracing.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from core import K_LARGE, K_SMALL, workload

TARGET_US = 15.0


def _observer(batch: bool = False) -> tuple[Any, Any]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from loom.observability import OtelObserver

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    processor = BatchSpanProcessor if batch else SimpleSpanProcessor
    provider.add_span_processor(processor(exporter))
    return OtelObserver(provider, MeterProvider()), exporter


async def _cpu_per_run(rt: Any, agent: Any, runs: int, tag: str) -> float:
    samples = []
    for i in range(runs):
        c0 = time.process_time()
        result = await rt.run(agent, "go", session_id=f"{tag}{i}")
        samples.append(time.process_time() - c0)
        assert result.output == "done", result
    return statistics.median(samples)


def end_to_end(rounds: int, runs: int) -> dict[str, Any]:
    from loom import Agent
    from loom.engine.runtime import Runtime

    observer, exporter = _observer()
    agents = {}
    for k in (K_SMALL, K_LARGE):
        add, model = workload(k)
        agents[k] = Agent(name="bench", model=model, tools=[add], max_iterations=20)
    runtimes = {"off": Runtime(), "on": Runtime(observers=[observer])}

    async def go() -> dict[str, Any]:
        for rt in runtimes.values():  # warm up both
            for k in (K_SMALL, K_LARGE):
                await _cpu_per_run(rt, agents[k], 20, f"w{k}")
        per_step: dict[str, list[float]] = {"off": [], "on": []}
        for r in range(rounds):
            for mode, rt in runtimes.items():
                exporter.clear()
                t1 = await _cpu_per_run(rt, agents[K_SMALL], runs, f"{mode}{r}a")
                t10 = await _cpu_per_run(rt, agents[K_LARGE], runs, f"{mode}{r}b")
                per_step[mode].append((t10 - t1) / (K_LARGE - K_SMALL) * 1e6)
        diffs = [on - off for on, off in zip(per_step["on"], per_step["off"], strict=True)]
        return {
            "step_off_us": statistics.median(per_step["off"]),
            "step_on_us": statistics.median(per_step["on"]),
            "overhead_per_step_us": statistics.median(diffs),
            "round_overheads_us": [round(d, 1) for d in diffs],
        }

    return asyncio.run(go())


def replay(reps: int, sdk: bool = True, batch: bool = False) -> dict[str, Any]:
    from loom import Agent
    from loom.engine.runtime import Runtime

    async def record(k: int) -> list[Any]:
        add, model = workload(k)
        agent = Agent(name="bench", model=model, tools=[add], max_iterations=20)
        events: list[Any] = []
        await Runtime(observers=[events.append]).run(agent, "go", session_id="rec")
        return events

    streams = {k: asyncio.run(record(k)) for k in (K_SMALL, K_LARGE)}
    if sdk:
        observer, exporter = _observer(batch)
    else:  # the API alone (no SDK configured): its no-op tracer and meter
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from loom.observability import OtelObserver

        observer, exporter = OtelObserver(), InMemorySpanExporter()
    med = {}
    for k, events in streams.items():
        samples = []
        for i in range(reps):
            run_id = f"run_{k}_{i}"
            t0 = time.perf_counter()
            observer.start_run(run_id=run_id, session_id="s", agent="bench", model="function")
            for e in events:
                e.run_id = run_id
                observer(e)
            samples.append(time.perf_counter() - t0)
            if i % 200 == 0:
                exporter.clear()
        med[k] = statistics.median(samples)
    return {
        "observer_per_step_us": (med[K_LARGE] - med[K_SMALL]) / (K_LARGE - K_SMALL) * 1e6,
        "observer_per_run_k1_us": med[K_SMALL] * 1e6,
        "events_per_step": (len(streams[K_LARGE]) - len(streams[K_SMALL])) / (K_LARGE - K_SMALL),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    rounds, runs, reps = (3, 30, 300) if args.quick else (9, 100, 2000)
    e2e = end_to_end(rounds, runs)
    out = {
        "end_to_end": e2e,
        "replay": replay(reps),
        "replay_batch_processor": replay(reps, batch=True),
        "replay_api_only": replay(reps, sdk=False),
        "target_us": TARGET_US,
        "met": e2e["overhead_per_step_us"] <= TARGET_US,
        "python": sys.version.split()[0],
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

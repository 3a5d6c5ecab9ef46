"""Pattern matching and judge-panel figures (issue 6). Prints JSON.

- match latency (P50/P99) over 65 and 1,000 generated patterns (seed: < 10 ms P50 for 65;
  target <= 1 ms for 1,000), plus the 15-pattern example library;
- index rebuild time: cold load (read + parse + validate every file + fit TF-IDF) and a
  reload (files whose bytes did not change are not parsed again; the index is refitted);
- hot-reload latency: from a file write to the new index answering ``match`` (seed: 89-143 ms),
  with the default watcher settings (step 50 ms);
- judge-panel overhead: ``JudgePanel.evaluate`` time beyond the judges' own work, and the
  cost of a passing panel on a whole turn.

    PYTHONPATH=src .venv/bin/python benchmarks/patterns_judge.py            # ~1 min
    PYTHONPATH=src .venv/bin/python benchmarks/patterns_judge.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from loom import Agent
from loom.judge import FunctionJudge, JudgeContext, JudgePanel
from loom.patterns import PatternLibrary
from loom.testing import FunctionModel

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "patterns"
SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ter",
    "van",
    "sol",
    "qu",
    "rin",
    "dex",
    "por",
    "shi",
    "ul",
    "bre",
    "tam",
    "gon",
    "fel",
    "zu",
    "nor",
    "wik",
    "ap",
]


def vocabulary(rng: random.Random, size: int = 6000) -> list[str]:
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))))
    return sorted(words)


def pattern_doc(i: int, rng: random.Random, vocab: list[str]) -> dict[str, Any]:
    topic = rng.sample(vocab, 12)  # words that make this pattern distinct

    def text(n: int) -> str:
        return " ".join(
            rng.choice(topic) if rng.random() < 0.5 else rng.choice(vocab) for _ in range(n)
        )

    return {
        "name": f"pattern-{i:04d}",
        "title": text(5),
        "description": text(30),
        "keywords": [" ".join(rng.sample(topic, 2)) for _ in range(8)],
        "instructions": text(40),
        "examples": [text(12), text(12)],
        "tools": ["run_sql"],
        "_topic": topic,
    }


def write_library(root: Path, n: int, seed: int = 1) -> list[list[str]]:
    rng = random.Random(seed)
    vocab = vocabulary(rng)
    topics = []
    for i in range(n):
        doc = pattern_doc(i, rng, vocab)
        topics.append(doc.pop("_topic"))
        (root / f"{doc['name']}.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    return topics


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_match(n: int, queries: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        topics = write_library(root, n)
        cold = []
        for _ in range(3):
            started = time.perf_counter()
            library = PatternLibrary.from_dir(root)
            cold.append((time.perf_counter() - started) * 1000)
        rng = random.Random(2)
        messages = []
        for _ in range(queries):
            target = rng.randrange(n)
            words = [*rng.sample(topics[target], 6), "please", "help", "with", "my", "problem"]
            rng.shuffle(words)
            messages.append((target, " ".join(words)))
        for _, m in messages[:50]:  # warm up
            library.match(m)
        times, hits = [], 0
        for target, m in messages:
            started = time.perf_counter()
            result = library.match(m, k=3)
            times.append((time.perf_counter() - started) * 1000)
            hits += bool(result) and result[0][0].name == f"pattern-{target:04d}"
        rebuild = []
        for _ in range(5):
            started = time.perf_counter()
            index = library.reload()
            rebuild.append((time.perf_counter() - started) * 1000)
        return {
            "patterns": n,
            "queries": queries,
            "match_p50_ms": round(statistics.median(times), 4),
            "match_p99_ms": round(percentile(times, 0.99), 4),
            "top1_accuracy": round(hits / queries, 3),
            "cold_load_p50_ms": round(statistics.median(cold), 2),
            "rebuild_unchanged_files_p50_ms": round(statistics.median(rebuild), 2),
            "index_fit_ms": round(index.build_ms, 2),
        }


def bench_examples(queries: int) -> dict[str, Any]:
    library = PatternLibrary.from_dir(EXAMPLES)
    message = "My report query on the orders table has become really slow and times out"
    times = []
    for _ in range(queries):
        started = time.perf_counter()
        library.match(message)
        times.append((time.perf_counter() - started) * 1000)
    return {"patterns": len(library), "match_p50_ms": round(statistics.median(times), 4)}


def bench_hot_reload(n: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_library(root, n)
        latencies = []
        with PatternLibrary.from_dir(root, watch=True) as library:
            time.sleep(1.2)  # let the OS watcher start
            for r in range(rounds):
                name = f"hot-{r}"
                doc = {
                    "name": name,
                    "title": f"zebra{r} unicorn",
                    "description": "new pattern",
                    "keywords": [f"zebra{r} unicorn"],
                    "instructions": "x",
                }
                target = library.version + 1
                started = time.perf_counter()
                (root / f"{name}.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
                while True:  # new index in use: match answers with the new pattern
                    if library.version >= target and library.match(f"zebra{r} unicorn"):
                        break
                    time.sleep(0.0005)
                latencies.append((time.perf_counter() - started) * 1000)
                time.sleep(0.1)
        return {
            "patterns": n,
            "rounds": rounds,
            "watch_step_ms": 50,
            "reload_p50_ms": round(statistics.median(latencies), 1),
            "reload_min_ms": round(min(latencies), 1),
            "reload_max_ms": round(max(latencies), 1),
        }


async def bench_panel(rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in (1, 3, 10):
        panel = JudgePanel(
            [FunctionJudge(lambda q, a, c: (0.9, "ok"), name=f"j{i}") for i in range(n)]
        )
        for _ in range(50):
            await panel.evaluate("q", "a")
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            await panel.evaluate("q", "a")
            times.append((time.perf_counter() - started) * 1000)
        out[f"instant_judges_{n}_p50_ms"] = round(statistics.median(times), 4)

    async def slow(q: str, a: str, c: JudgeContext) -> float:
        await asyncio.sleep(0.02)
        return 0.9

    panel = JudgePanel([FunctionJudge(slow, name=f"s{i}") for i in range(5)])
    over = []
    for _ in range(max(rounds // 20, 20)):
        started = time.perf_counter()
        await panel.evaluate("q", "a")
        over.append((time.perf_counter() - started) * 1000 - 20.0)
    out["five_20ms_judges_overhead_p50_ms"] = round(statistics.median(over), 3)

    # A whole turn with a passing one-judge panel vs without judges (zero-latency model).
    def answer(messages: list, tools: list) -> str:
        return "fine"

    async def turns(agent: Agent) -> float:
        for _ in range(30):
            await agent.run("hello")
        times = []
        for _ in range(rounds // 2):
            started = time.perf_counter()
            await agent.run("hello")
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)

    plain = await turns(Agent("a", "x", model=FunctionModel(answer, record=False)))
    judged = await turns(
        Agent(
            "a",
            "x",
            model=FunctionModel(answer, record=False),
            judges=[FunctionJudge(lambda q, a, c: 1.0, name="ok")],
        )
    )
    out["turn_without_judges_p50_ms"] = round(plain, 4)
    out["turn_with_one_judge_p50_ms"] = round(judged, 4)
    out["turn_judge_overhead_ms"] = round(judged - plain, 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    queries = 300 if args.quick else 2000
    rounds = 5 if args.quick else 20
    result = {
        "benchmark": "patterns_judge",
        "quick": args.quick,
        "match": [bench_match(65, queries), bench_match(1000, queries)],
        "match_examples": bench_examples(queries),
        "hot_reload": [bench_hot_reload(65, rounds), bench_hot_reload(1000, max(rounds // 2, 3))],
        "judge_panel": asyncio.run(bench_panel(200 if args.quick else 1000)),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

"""What an embedding costs (issue #29): CPU milliseconds per text and texts per second, for the
local WordLlama embedder, llama.cpp with the bundled SmolLM2-135M and the hash embedder.

    PYTHONPATH=src python benchmarks/embedding_cost.py [--texts N] [--llama-texts N]

The texts are 1,000 short memory-like sentences ("Ana's daughter is called Rex.", "The user
prefers tea over coffee.", ...; 5 to 10 words, generated from a fixed seed). Each embedder
embeds them twice, through its public ``embed``: in batches of 64 (how a re-index or a bulk
import runs) and one text per call (how ``put`` embeds an item). llama.cpp runs a 135M
transformer over every token (a few ms of CPU per token here): ``--llama-texts N`` embeds only
the first N with it (default: all), for a quicker run; its figures are per text all the same.

CPU is ``time.process_time`` (every thread of the process, so the tokenizer's and llama.cpp's
threads count), which the machine's load cannot inflate much; texts per second is wall time,
on a shared machine: compare the embedders with each other in one run. ``load`` is the first
call (reading the model) apart; ``rss_mb`` what the process's peak RSS grew by while loading.
Writes benchmarks/results/embedding_cost.json; prints it too.
"""

from __future__ import annotations

import asyncio
import json
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any

from loom.embedding import Embedder, HashEmbedder, LlamaCppEmbedder, LocalEmbedder

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "embedding_cost.json"
TEXTS = int(sys.argv[sys.argv.index("--texts") + 1]) if "--texts" in sys.argv else 1000
LLAMA_TEXTS = (
    int(sys.argv[sys.argv.index("--llama-texts") + 1]) if "--llama-texts" in sys.argv else TEXTS
)
BATCH = 64

NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Farah", "Goran", "Hana", "Ivo", "Jun"]
THINGS = ["tea", "coffee", "jazz", "hiking", "chess", "sushi", "Python", "cycling", "opera"]
PLACES = ["Lisbon", "Osaka", "Nairobi", "Lima", "Oslo", "Quebec", "Hanoi", "Tbilisi"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
TEMPLATES = [
    "{name}'s daughter is called {other}.",
    "The user prefers {thing} over {thing2}.",
    "{name} moved to {place} last year.",
    "The meeting with {name} is on {day} at {hour} o'clock.",
    "{name} is allergic to {thing}.",
    "The user's favourite city is {place}.",
    "{name} asked to be reminded about {thing} every {day}.",
    "The project deadline moved to {day}; {name} owns it.",
]


def sentences(n: int) -> list[str]:
    rng = random.Random(29)
    return [
        rng.choice(TEMPLATES).format(
            name=rng.choice(NAMES),
            other=rng.choice(NAMES),
            thing=rng.choice(THINGS),
            thing2=rng.choice(THINGS),
            place=rng.choice(PLACES),
            day=rng.choice(DAYS),
            hour=rng.randint(8, 18),
        )
        for _ in range(n)
    ]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def measure(embedder: Embedder, texts: list[str]) -> dict[str, Any]:
    rss, cpu, wall = peak_rss_mb(), time.process_time(), time.perf_counter()
    await embedder.embed(texts[:1])  # loads the model
    load = {
        "cpu_ms": round((time.process_time() - cpu) * 1000, 1),
        "wall_ms": round((time.perf_counter() - wall) * 1000, 1),
        "rss_mb": round(peak_rss_mb() - rss, 1),
    }
    cpu, wall = time.process_time(), time.perf_counter()
    for start in range(0, len(texts), BATCH):
        await embedder.embed(texts[start : start + BATCH])
    batched_cpu, batched_wall = time.process_time() - cpu, time.perf_counter() - wall
    cpu, wall = time.process_time(), time.perf_counter()
    for text in texts:
        await embedder.embed([text])
    single_cpu, single_wall = time.process_time() - cpu, time.perf_counter() - wall
    n = len(texts)
    return {
        "name": embedder.name,
        "dimensions": embedder.dimensions,
        "texts": n,
        "load": load,
        f"batches_of_{BATCH}": {
            "cpu_ms_per_text": round(batched_cpu * 1000 / n, 3),
            "texts_per_s": round(n / batched_wall, 1),
        },
        "one_per_call": {
            "cpu_ms_per_text": round(single_cpu * 1000 / n, 3),
            "texts_per_s": round(n / single_wall, 1),
        },
    }


async def main() -> dict[str, Any]:
    texts = sentences(TEXTS)
    words = sum(len(t.split()) for t in texts) / len(texts)
    results = {
        "hash": await measure(HashEmbedder(), texts),
        "local": await measure(LocalEmbedder(), texts),
        "llama": await measure(LlamaCppEmbedder(), texts[:LLAMA_TEXTS]),
    }
    return {
        "command": "PYTHONPATH=src python benchmarks/embedding_cost.py",
        "texts": TEXTS,
        "mean_words_per_text": round(words, 1),
        "embedders": results,
        "note": (
            "cpu_ms_per_text from time.process_time (all threads); texts_per_s is wall time on "
            "a shared 2-core machine: compare within this run only. llama embedded the first "
            f"{min(LLAMA_TEXTS, TEXTS)} texts."
        ),
    }


if __name__ == "__main__":
    report = asyncio.run(main())
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))

"""Cross-session recall (issue #29): facts planted in 200 sessions, asked about in new ones.

The set (``benchmarks/data/memory_recall_facts.json``): 40 fact templates, each planted once
for five relations (mother, father, wife, brother, best friend): 200 sessions. Every session
holds three ordinary requests and one fact ("My brother drives a red Volvo."); every user
message becomes a memory item, as a "remember what the user said" policy would store them
(800 items, one owner). Each question is asked as a new session would ask it, paraphrased:
the relation by a synonym ("sibling"), the topic mostly by other words ("What vehicle does my
sibling own?"). A hit is the planted fact among the top 5 results of ``search_items``
(recall@5), for keyword (FTS5 BM25), semantic (the embedder's cosine) and hybrid (both, fused
by rank) search on one SQLite store.

A second, differently built set (``--set keywords``,
``benchmarks/data/memory_recall_keywords.json``) checks that the fusion was not fitted to the
first: 80 facts, each planted in its own session among three of the same ordinary requests (320
items), whose questions share the fact's key word. 20 pairs of near-identical facts differ in
one key word ("The wifi password at the cabin is ..." / "... at the office is ..."; "What's the
cabin wifi password again?"), and 40 facts name an identifier (a ticket or order number, a
surname, a room code) among nine alike but for theirs ("Ticket 48213 is about the broken
password reset email." / "What was ticket 48213 about?"). There the exact word decides: the case
hybrid search is for. Recall@1 is reported beside recall@5 (with so few close candidates the top
five nearly always hold the fact).

How the public long-memory benchmarks differ: LongMemEval (500 questions over chat histories of
~50-500 sessions) and LoCoMo (10 very long two-person conversations, ~300 turns each) score
an *answer* written by a model from what memory retrieved, judged by another model, and test
temporal reasoning, knowledge updates, multi-hop questions and abstention. This benchmark
scores *retrieval only*, single-hop, with templated sentences and no model in the loop: it
says whether the right memory reaches the context, not whether an agent answers well. Its
figures are not comparable to theirs.

    PYTHONPATH=src python benchmarks/memory_recall.py [--embedder local] [--set keywords]

Writes ``benchmarks/results/memory_recall.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from loom.embedding import embedder_from_spec
from loom.store import SQLiteStore

DATA = Path(__file__).parent / "data" / "memory_recall_facts.json"
KEYWORD_DATA = Path(__file__).parent / "data" / "memory_recall_keywords.json"
MODES = ("keyword", "semantic", "hybrid")
K = 5


Built = tuple[list[list[str]], list[tuple[str, int]], dict[int, str]]


def build_set(seed: int) -> Built:
    """The paraphrase set: the sessions (user messages each), the questions (text, index of
    its session) and each session's planted fact."""
    data = json.loads(DATA.read_text())
    rng = random.Random(seed)
    sessions: list[list[str]] = []
    questions: list[tuple[str, int]] = []
    facts: dict[int, str] = {}
    for statement, question, values in data["templates"]:
        for (relation, synonym), value in zip(data["relations"], values, strict=True):
            fact = statement.format(r=relation, v=value)
            messages = rng.sample(data["filler"], 3)
            messages.insert(rng.randrange(4), fact)
            questions.append((question.format(q=synonym), len(sessions)))
            facts[len(sessions)] = fact
            sessions.append(messages)
    return sessions, questions, facts


def build_keyword_set(seed: int) -> Built:
    """The key-word set (``KEYWORD_DATA``), shaped as :func:`build_set`'s."""
    data = json.loads(KEYWORD_DATA.read_text())
    filler = json.loads(DATA.read_text())["filler"]
    rng = random.Random(seed)
    sessions: list[list[str]] = []
    questions: list[tuple[str, int]] = []
    facts: dict[int, str] = {}
    planted = [(fact, question) for pair in data["pairs"] for fact, question in pair]
    for statement, question, named in data["ids"]:
        for ident, detail in named:
            planted.append((statement.format(id=ident, detail=detail), question.format(id=ident)))
    for fact, question in planted:
        messages = rng.sample(filler, 3)
        messages.insert(rng.randrange(4), fact)
        questions.append((question, len(sessions)))
        facts[len(sessions)] = fact
        sessions.append(messages)
    return sessions, questions, facts


SETS = {"paraphrase": build_set, "keywords": build_keyword_set}


async def run(embedder_spec: str, seed: int, which: str) -> dict[str, Any]:
    sessions, questions, facts = SETS[which](seed)
    embedder = embedder_from_spec(embedder_spec)
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "recall.db", embedder=embedder)
        try:
            started = time.process_time()
            for i, messages in enumerate(sessions):
                for n, text in enumerate(messages):
                    await store.put_item(("memories", "bench"), f"s{i}-m{n}", {"text": text})
            put_cpu = time.process_time() - started
            results: dict[str, Any] = {}
            for mode in MODES:
                hits, ranks = 0, []
                for question, session in questions:
                    found = await store.search_items(
                        ("memories",), query=question, limit=K, mode=mode
                    )
                    texts = [item.value["text"] for item in found]
                    if facts[session] in texts:
                        hits += 1
                        ranks.append(texts.index(facts[session]) + 1)
                results[mode] = {
                    "recall_at_5": round(hits / len(questions), 3),
                    "recall_at_1": round(ranks.count(1) / len(questions), 3),
                    "hits": hits,
                    "mean_rank_of_hits": round(sum(ranks) / len(ranks), 2) if ranks else None,
                }
        finally:
            await store.close()
    return {
        "set": which,
        "embedder": embedder_spec,
        "sessions": len(sessions),
        "items": sum(len(s) for s in sessions),
        "questions": len(questions),
        "k": K,
        "put_cpu_s_with_embedding": round(put_cpu, 3),
        "modes": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embedder", default="local", help="an embedder spec (local, hash, ...)")
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--set", choices=[*SETS, "both"], default="both")
    args = parser.parse_args()
    chosen = list(SETS) if args.set == "both" else [args.set]
    report = {which: asyncio.run(run(args.embedder, args.seed, which)) for which in chosen}
    out = Path(__file__).parent / "results" / "memory_recall.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

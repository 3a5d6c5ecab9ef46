"""Instructions per loop step (valgrind --tool=callgrind): a figure load cannot move.

The workload is ``benchmarks/core.py``'s (one async tool ``add``, a zero-latency
``FunctionModel`` that calls it ``K`` times, then answers), ``--runs`` runs of K=1 and of K=10
on a fresh SQLite file (``--store sqlite``) or the in-memory store (``--store memory``), each
under callgrind in a fresh interpreter. Instructions per step = (Ir(K=10) - Ir(K=1)) / (9 x
runs): the import and start-up cancel out. Compare two trees by pointing ``PYTHONPATH`` at
each::

    PYTHONPATH=src python benchmarks/step_instructions.py --store sqlite
    PYTHONPATH=../old/src python benchmarks/step_instructions.py --store sqlite

``--store floor`` measures the floor the same way: a hand-written Python loop doing the same
work (dict messages, a model function answering with the same calls as JSON text, ``json.loads``
of the arguments, a type check, await the tool, append the result), no framework. ``--all``
measures floor, memory and sqlite and writes ``benchmarks/results/step_instructions.json``
with each figure's ratio to the floor.

``--effect`` declares the ``add`` tool ``pure`` (default: it is one) or ``at_most_once`` (the
``@tool`` default): a durable step commits once when the tool's result may be folded into the
next model answer's commit (pure and idempotent tools, nobody streaming the run, no user
hooks), twice for an ``at_most_once`` tool, whose result is committed as soon as it exists.
``commits_per_step`` counts ``Store.append`` calls the same way (K=10 minus K=1).

Prints JSON. Needs valgrind (Debian's ``valgrind``); a run takes about a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any


def floor_workload(k: int, runs: int) -> None:
    """The floor: the same ``runs`` runs of ``k`` steps as a hand-written loop."""

    async def add(a: int, b: int) -> int:
        return a + b

    tools = {"add": add}

    def answer(messages: list[dict[str, Any]]) -> dict[str, Any]:
        done = sum(1 for m in messages if m["role"] == "tool")
        if done < k:
            arguments = json.dumps({"a": done, "b": 1})
            call = {"id": f"call_{done}", "name": "add", "arguments": arguments}
            return {"role": "assistant", "content": "", "tool_calls": [call]}
        return {"role": "assistant", "content": "done", "tool_calls": []}

    async def run(message: str) -> str:
        messages: list[dict[str, Any]] = [{"role": "user", "content": message}]
        while True:
            reply = answer(messages)
            messages.append(reply)
            if not reply["tool_calls"]:
                return str(reply["content"])
            for call in reply["tool_calls"]:
                arguments = json.loads(call["arguments"])
                if not isinstance(arguments, dict):
                    raise TypeError("arguments must be a JSON object")
                result = await tools[call["name"]](**arguments)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})

    async def main() -> None:
        await run("warm up")
        for _ in range(runs):
            await run("go")

    asyncio.run(main())


COMMITS = [0]  # Store.append calls after the warm-up run

# The ablations (memory store): appends that store nothing ("no-store", what the store and
# its codec cost), a context builder that sends the transcript verbatim ("no-context", what
# the segmented builder costs), and both.
STORES = ["sqlite", "memory", "floor", "memory-no-store", "memory-no-context", "memory-bare"]
# memory-bare: both ablations (what is left: the loop, the journal, events, the tool call)
ABLATIONS = ["memory-no-store", "memory-no-context", "memory-bare"]


def workload(k: int, runs: int, store: str, effect: str = "pure") -> None:
    """``runs`` runs of ``k`` steps (what callgrind counts)."""
    if store == "floor":
        floor_workload(k, runs)
        return
    from loom import Agent, ModelResponse, Runtime, ToolCall, tool
    from loom.context import AssembledContext, ContextRequest
    from loom.testing import FunctionModel

    class Verbatim:
        """A context builder that sends the transcript as it is (an ablation: no budgets,
        no memory tiers, no component events)."""

        async def build(self, request: ContextRequest) -> AssembledContext:
            return AssembledContext(list(request.history), list(request.tool_specs), 0)

    @tool(effect=effect)  # type: ignore[arg-type]
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    def answer(messages: list[Any], tools: list[Any]) -> ModelResponse | str:
        done = sum(1 for m in messages if m.role == "tool")
        if done < k:
            return ModelResponse(tool_calls=[ToolCall(name="add", arguments={"a": done, "b": 1})])
        return "done"

    async def main() -> None:
        if store == "sqlite":
            from loom.store import SQLiteStore

            runtime = Runtime(SQLiteStore(os.path.join(tempfile.mkdtemp(), "steps.db")))
        else:
            runtime = Runtime()
        builder = Verbatim() if store in ("memory-no-context", "memory-bare") else None
        agent = Agent(
            name="steps",
            model=FunctionModel(answer, record=False),
            tools=[add],
            max_iterations=20,
            context_builder=builder,
        )
        await runtime.run(agent, "warm up", session_id="warm")
        append = runtime.store.append
        keep = store not in ("memory-no-store", "memory-bare")

        async def counted(*args: Any, **kwargs: Any) -> None:
            COMMITS[0] += 1
            if keep:
                await append(*args, **kwargs)

        runtime.store.append = counted  # type: ignore[method-assign]
        for n in range(runs):
            await runtime.run(agent, "go", session_id=f"s{n}")
        await runtime.store.close()

    asyncio.run(main())
    print(f"commits={COMMITS[0]}", file=sys.stderr)


def instructions(k: int, runs: int, store: str, effect: str) -> tuple[int, int]:
    """Ir of one interpreter running the workload under callgrind, and its commits."""
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={tmp}/cg.out",
                sys.executable,
                __file__,
                "--part",
                str(k),
                str(runs),
                store,
                effect,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no total:\n{done.stderr[-2000:]}")
    commits = re.search(r"commits=(\d+)", done.stderr)
    return int(found.group(1)), int(commits.group(1)) if commits else 0


def measure(store: str, runs: int, effect: str) -> dict[str, Any]:
    """Instructions (and commits) per step of one store, K=10 minus K=1."""
    (small, c1), (large, c10) = (instructions(k, runs, store, effect) for k in (1, 10))
    out: dict[str, Any] = {"store": store, "runs": runs, "ir_k1": small, "ir_k10": large}
    if store != "floor":
        out["tool_effect"] = effect
        out["commits_per_step"] = round((c10 - c1) / (9 * runs), 3)
    return {**out, "instructions_per_step": round((large - small) / (9 * runs))}


AREAS = [  # (area, fragments of "path:function" whose own time counts for it), first match
    ("context builder (loom.memory, loom.context)", ("loom/memory/", "loom/context")),
    ("store and codec (loom.store)", ("loom/store/",)),
    ("journal (numbering, commits, emission)", ("loom/engine/journal",)),
    ("events and messages (loom.events, loom.messages)", ("loom/events", "loom/messages")),
    ("tool call (executor, tools, permission check)", ("loom/tools/", "loom/policy/")),
    ("the test model (FunctionModel, the model function)", ("loom/testing", "step_instructions")),
    (
        "turn and call runner (loom.engine, hooks, pricing)",
        ("loom/engine/", "loom/hooks", "pricing"),
    ),
    ("pydantic (validation, serialisation)", ("pydantic",)),
    ("asyncio", ("asyncio/",)),
]


def split(store: str, runs: int) -> dict[str, float]:
    """Each area's share of a step's own Python time (cProfile, K=10 minus K=1): what the
    instruction count is spent on, approximately (the profiler inflates small calls)."""
    import cProfile
    import pstats

    def own_times(k: int) -> dict[str, float]:
        profile = cProfile.Profile()
        profile.enable()
        workload(k, runs, store)
        profile.disable()
        out: dict[str, float] = {}
        stats: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
        for (path, _, name), (_, _, own, _, _) in stats.items():
            where = f"{path}:{name}"
            area = next((a for a, keys in AREAS if any(k in where for k in keys)), "other")
            out[area] = out.get(area, 0.0) + own
        return out

    workload(1, 1, store)  # imports and first-use work out of the way
    small, large = own_times(1), own_times(10)
    per_step = {a: large.get(a, 0.0) - small.get(a, 0.0) for a in {*small, *large}}
    total = sum(v for v in per_step.values() if v > 0)
    shares = {a: round(max(v, 0.0) / total, 3) for a, v in per_step.items()}
    return dict(sorted(shares.items(), key=lambda kv: -kv[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", choices=STORES, default="sqlite")
    parser.add_argument("--effect", choices=["pure", "at_most_once"], default="pure")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--all", action="store_true", help="floor, memory, sqlite: write JSON")
    parser.add_argument("--part", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--split", action="store_true", help="cProfile shares per area")
    args = parser.parse_args()
    if args.split:
        print(json.dumps(split(args.store, args.runs), indent=2))
        return
    if args.part:
        workload(int(args.part[0]), int(args.part[1]), args.part[2], args.part[3])
        return
    if not args.all:
        print(json.dumps(measure(args.store, args.runs, args.effect), indent=2))
        return
    floor = measure("floor", args.runs, "pure")
    rows = [
        floor,
        measure("memory", args.runs, "pure"),
        measure("sqlite", args.runs, "pure"),
        measure("sqlite", args.runs, "at_most_once"),
        measure("memory", args.runs, "at_most_once"),
        *(measure(name, args.runs, "pure") for name in ABLATIONS),
    ]
    for row in rows:
        row["ratio_to_floor"] = round(
            row["instructions_per_step"] / floor["instructions_per_step"], 2
        )
    targets = {"memory": 250_000, "sqlite": 500_000, "sqlite_commits_per_step": 1}
    out = {"workload": "benchmarks/core.py's: one async add tool, K=10 vs K=1", "rows": rows}
    text = json.dumps({**out, "targets": targets}, indent=2)
    print(text)
    results = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    with open(os.path.join(results, "step_instructions.json"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()

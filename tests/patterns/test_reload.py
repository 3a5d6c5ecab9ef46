"""Hot reload with a real watcher on real files, including turns running during a reload."""

from __future__ import annotations

import asyncio
import random
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from loom import Agent, ModelResponse, ToolCall, tool
from loom.messages import Message
from loom.patterns import PatternLibrary
from loom.testing import FunctionModel

from .conftest import pattern_yaml

WritePattern = Callable[..., Path]


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def names(lib: PatternLibrary, text: str) -> list[str]:
    return [p.name for p, _ in lib.match(text)]


@pytest.fixture
def lib(tmp_path: Path, write_pattern: WritePattern):  # type: ignore[no-untyped-def]
    write_pattern("deploy-rollback", keywords=["rollback deploy"], instructions="VERSION-0")
    library = PatternLibrary.from_dir(tmp_path, watch=True)
    assert library.watching
    yield library
    library.close()


def test_added_changed_and_deleted_files_are_picked_up(
    lib: PatternLibrary, tmp_path: Path, write_pattern: WritePattern
) -> None:
    assert names(lib, "kafka consumer lag") == []
    path = write_pattern("kafka-lag", keywords=["kafka consumer lag"])
    assert wait_until(lambda: names(lib, "kafka consumer lag") == ["kafka-lag"])
    v = lib.version
    assert v >= 1

    write_pattern("kafka-lag", keywords=["kafka consumer lag"], instructions="NEW TEXT")
    assert wait_until(
        lambda: lib.get("kafka-lag") is not None and lib.get("kafka-lag").instructions == "NEW TEXT"
    )  # type: ignore[union-attr]
    assert lib.version > v

    path.unlink()
    assert wait_until(lambda: lib.get("kafka-lag") is None)
    assert names(lib, "kafka consumer lag") == []
    assert names(lib, "rollback deploy") == ["deploy-rollback"]


def test_a_broken_edit_skips_that_file_and_a_fix_restores_it(
    lib: PatternLibrary, tmp_path: Path, write_pattern: WritePattern
) -> None:
    write_pattern("kafka-lag", keywords=["kafka consumer lag"])
    assert wait_until(lambda: lib.get("kafka-lag") is not None)
    (tmp_path / "kafka-lag.yaml").write_text("name: kafka-lag\nkeywords: [\n")
    assert wait_until(lambda: lib.get("kafka-lag") is None)
    assert [Path(p.path).name for p in lib.problems] == ["kafka-lag.yaml"]
    assert "malformed YAML" in lib.problems[0].message
    assert names(lib, "rollback deploy") == ["deploy-rollback"]  # the rest still loads
    write_pattern("kafka-lag", keywords=["kafka consumer lag"])
    assert wait_until(lambda: lib.get("kafka-lag") is not None and not lib.problems)


def test_deleting_every_file_empties_the_library_and_says_so(
    lib: PatternLibrary, tmp_path: Path
) -> None:
    (tmp_path / "deploy-rollback.yaml").unlink()
    assert wait_until(lambda: len(lib) == 0)
    assert [p.kind for p in lib.problems] == ["empty"]
    assert lib.match("rollback deploy") == []


def test_a_write_right_after_start_is_not_lost(tmp_path: Path, write_pattern: WritePattern) -> None:
    write_pattern("a-one", keywords=["alpha"])
    with PatternLibrary.from_dir(tmp_path, watch=True) as library:
        write_pattern("b-two", keywords=["bravo"])  # possibly before the OS watcher is up
        assert wait_until(lambda: library.get("b-two") is not None, timeout=5)


def test_close_stops_watching(tmp_path: Path, write_pattern: WritePattern) -> None:
    write_pattern("a-one", keywords=["alpha"])
    library = PatternLibrary.from_dir(tmp_path, watch=True)
    started = time.monotonic()
    library.close()
    assert time.monotonic() - started < 3
    assert not library.watching
    write_pattern("b-two", keywords=["bravo"])
    time.sleep(0.5)
    assert library.get("b-two") is None and library.version == 0
    library.close()  # idempotent


def test_snapshots_are_unchanged_by_a_reload(
    lib: PatternLibrary, write_pattern: WritePattern
) -> None:
    before = lib.snapshot()
    write_pattern("deploy-rollback", keywords=["rollback deploy"], instructions="VERSION-1")
    assert lib.wait_for_version(before.version + 1, timeout=10)
    assert before.get("deploy-rollback").instructions == "VERSION-0"  # type: ignore[union-attr]
    assert lib.snapshot().get("deploy-rollback").instructions == "VERSION-1"  # type: ignore[union-attr]


# -- turns in flight --------------------------------------------------------------------------
@tool
def check() -> str:
    """Check the deploy."""
    return "ok"


def versions_in(messages: list[Message]) -> set[str]:
    return set(re.findall(r"VERSION-\d+", messages[0].content))


async def test_turns_in_flight_keep_their_index_and_new_turns_see_the_reload(
    lib: PatternLibrary, write_pattern: WritePattern
) -> None:
    gate, all_waiting = asyncio.Event(), asyncio.Event()
    seen: dict[str, list[set[str]]] = defaultdict(list)

    async def model(messages: list[Message], tools: list) -> ModelResponse | str:
        turn = next(m.content for m in messages if m.role == "user")
        seen[turn].append(versions_in(messages))
        if messages[-1].role == "user":  # first call of the turn: call a tool, maybe wait
            if turn.startswith("early"):
                if len(seen) == 5:
                    all_waiting.set()
                await gate.wait()
            return ModelResponse(tool_calls=[ToolCall(name="check")])
        return "done"

    agent = Agent("ops", "Ops.", model=FunctionModel(model), tools=[check], patterns=lib)
    early = [asyncio.create_task(agent.run(f"early {i}: rollback deploy")) for i in range(5)]
    await asyncio.wait_for(all_waiting.wait(), 10)  # every early turn matched and waits

    version = lib.version
    write_pattern("deploy-rollback", keywords=["rollback deploy"], instructions="VERSION-1")
    assert await asyncio.to_thread(lib.wait_for_version, version + 1, 10)
    late = [await agent.run(f"late {i}: rollback deploy") for i in range(3)]
    gate.set()
    results = await asyncio.gather(*early)

    assert all(r.output == "done" for r in [*results, *late])
    for turn, calls in seen.items():
        assert len(calls) == 2, turn
        expected = {"VERSION-0"} if turn.startswith("early") else {"VERSION-1"}
        assert calls == [expected, expected], (turn, calls)


async def test_many_turns_during_repeated_reloads_each_see_one_consistent_version(
    tmp_path: Path, write_pattern: WritePattern
) -> None:
    write_pattern("deploy-rollback", keywords=["rollback deploy"], instructions="VERSION-0")
    write_pattern("other-thing", keywords=["unrelated words"])
    library = PatternLibrary.from_dir(tmp_path, watch=True, step_ms=20)
    seen: dict[str, list[set[str]]] = defaultdict(list)
    rng = random.Random(7)

    async def model(messages: list[Message], tools: list) -> ModelResponse | str:
        turn = next(m.content for m in messages if m.role == "user")
        seen[turn].append(versions_in(messages))
        await asyncio.sleep(rng.uniform(0, 0.05))
        if messages[-1].role == "user":
            return ModelResponse(tool_calls=[ToolCall(name="check")])
        return "done"

    stop = threading.Event()
    last = 0

    def writer() -> None:
        nonlocal last
        path = tmp_path / "deploy-rollback.yaml"
        for n in range(1, 16):
            # Write a temp file and rename it, as editors do, so no half-written file is read.
            tmp = tmp_path / ".deploy-rollback.yaml.tmp"
            tmp.write_text(
                pattern_yaml(
                    "deploy-rollback", keywords=["rollback deploy"], instructions=f"VERSION-{n}"
                )
            )
            tmp.replace(path)
            last = n
            time.sleep(0.04)
        stop.set()

    agent = Agent("ops", "Ops.", model=FunctionModel(model), tools=[check], patterns=library)
    try:
        thread = threading.Thread(target=writer)
        thread.start()

        async def staggered(i: int) -> str:  # turns start all through the writes
            await asyncio.sleep(i * 0.02)
            return (await agent.run(f"turn {i}: rollback deploy")).output

        results = await asyncio.gather(*(staggered(i) for i in range(40)))
        await asyncio.to_thread(thread.join)
        assert results == ["done"] * 40
        for turn, calls in seen.items():
            assert len(calls) == 2 and len(calls[0]) == 1 and calls[0] == calls[1], (turn, calls)
        assert len({next(iter(c[0])) for c in seen.values()}) >= 2  # reloads really happened
        final = f"VERSION-{last}"
        assert await asyncio.to_thread(
            wait_until, lambda: library.get("deploy-rollback").instructions == final
        )  # type: ignore[union-attr]
        after = await agent.run("after: rollback deploy")
        assert after.output == "done" and seen["after: rollback deploy"][0] == {final}
    finally:
        library.close()

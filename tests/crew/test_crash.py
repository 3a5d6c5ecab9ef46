"""A crew killed (SIGKILL) while a member's tool runs carries that member's turn on when it
resumes: the member's message is never sent again, an ``at_most_once`` call is not repeated
(it gets an ``interrupted`` result) and an idempotent one runs again exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from loom import Agent, ModelResponse, ToolCall, tool
from loom.crew import Crew
from loom.engine.runtime import Runtime
from loom.errors import LeaseLost
from loom.events import RunRecovered, UserMessage
from loom.store.base import Lease
from loom.store.memory import MemoryStore
from loom.store.sqlite import SQLiteStore
from loom.testing import ScriptedModel

SRC = str(Path(__file__).resolve().parents[2] / "src")

SCRIPT = textwrap.dedent('''
    import asyncio, json, sys
    from loom import Agent, ModelResponse, ToolCall, tool
    from loom.crew import Crew, Sequential
    from loom.engine.runtime import Runtime
    from loom.store.sqlite import SQLiteStore
    from loom.testing import FunctionModel

    db, marker, effect, mode = sys.argv[1:5]

    @tool(effect=effect)
    def send_invoice() -> str:
        """Send the invoice."""
        with open(marker, "a") as f:
            f.write("ran\\n")
        if mode == "first":
            print("IN-TOOL", flush=True)  # the test kills this process once it reads this
            sys.stdin.readline()  # blocks: the test never writes
        return "invoice sent"

    def clerk(messages, tools):
        if messages[-1].role == "tool":
            return "clerk: " + messages[-1].content
        return ModelResponse(tool_calls=[ToolCall(name="send_invoice")])

    crew = Crew("office", members={
        "intake": Agent(name="intake", model=FunctionModel(lambda m, t: "bill ACME")),
        "clerk": Agent(name="clerk", model=FunctionModel(clerk), tools=[send_invoice]),
    }, plan=Sequential("intake", "clerk"))

    async def main():
        store = SQLiteStore(db)
        try:
            res = await crew.run("invoice ACME", session_id="office-1", runtime=Runtime(store))
            print(json.dumps({"output": res.output, "stop": res.stop_reason,
                              "resumed_from": res.resumed_from,
                              "members": [[m.path, m.stop_reason, m.reused]
                                          for m in res.members]}), flush=True)
        finally:
            await store.close()

    asyncio.run(main())
''')


def start(tmp_path: Path, effect: str, mode: str) -> subprocess.Popen[str]:
    script = tmp_path / "crew_crash.py"
    script.write_text(SCRIPT)
    args = [str(tmp_path / "crew.db"), str(tmp_path / "marker.txt"), effect, mode]
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        env={**os.environ, "PYTHONPATH": SRC},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize(
    ("effect", "runs", "answer"),
    [
        ("at_most_once", 1, "interrupted"),  # not repeated: its outcome is unknown
        ("idempotent", 2, "invoice sent"),  # repeated once, with the same idempotency key
    ],
)
async def test_a_crew_killed_in_a_member_tool_carries_the_member_turn_on(
    tmp_path: Path, effect: str, runs: int, answer: str
) -> None:
    first = start(tmp_path, effect, "first")
    try:
        assert first.stdout is not None
        line = first.stdout.readline()  # the tool is running (and blocked) now
        assert line.strip() == "IN-TOOL", first.stderr.read() if first.stderr else ""
        first.send_signal(signal.SIGKILL)
    finally:
        first.kill()
        first.communicate(timeout=60)
    assert (tmp_path / "marker.txt").read_text().splitlines() == ["ran"]

    second = start(tmp_path, effect, "resume")
    out_text, err = second.communicate("", timeout=120)
    assert second.returncode == 0, err
    out = json.loads(out_text)
    # the side effect ran once (at_most_once) or was repeated exactly once (idempotent)
    assert (tmp_path / "marker.txt").read_text().splitlines() == ["ran"] * runs
    assert out["output"].startswith("clerk: ") and answer in out["output"]
    assert out["stop"] == "completed" and out["resumed_from"] is not None
    assert out["members"] == [
        ["office/intake", "completed", True],
        ["office/clerk", "completed", False],
    ]

    store = SQLiteStore(tmp_path / "crew.db")
    try:
        child = "office-1:office/clerk"
        asked = [e for e in await store.load_events(child) if isinstance(e, UserMessage)]
        assert [e.content for e in asked] == ["bill ACME"]  # the member's message, once
        # the member's turn went on: one call, its one result, one answer; no second exchange
        roles = [m.role for m in await store.load_messages(child)]
        assert roles == ["user", "assistant", "tool", "assistant"]
        crew_events = await store.load_events("office-1")
        recovered = [e for e in crew_events if isinstance(e, RunRecovered)]
        assert [e.recovered_run_id for e in recovered] == [out["resumed_from"]]
        assert await store.open_runs("office-1") == []
        assert await store.open_runs(child) == []
    finally:
        await store.close()


def kill_in_tool(tmp_path: Path, effect: str) -> None:
    """Run the crew until its member's tool runs (and blocks), then SIGKILL it."""
    proc = start(tmp_path, effect, "first")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "IN-TOOL", proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate(timeout=60)


async def test_a_crew_killed_twice_still_never_resends_the_member_message(
    tmp_path: Path,
) -> None:
    kill_in_tool(tmp_path, "idempotent")
    kill_in_tool(tmp_path, "idempotent")  # killed again in the carried-on turn's rerun
    done = start(tmp_path, "idempotent", "resume")
    out_text, err = done.communicate("", timeout=120)
    assert done.returncode == 0, err
    out = json.loads(out_text)
    assert out["stop"] == "completed" and out["output"] == "clerk: invoice sent"
    # one run per process: the first, and one rerun in each resumed process
    assert (tmp_path / "marker.txt").read_text().splitlines() == ["ran"] * 3
    store = SQLiteStore(tmp_path / "crew.db")
    try:
        child = "office-1:office/clerk"
        asked = [e for e in await store.load_events(child) if isinstance(e, UserMessage)]
        assert [e.content for e in asked] == ["bill ACME"]
        assert [m.role for m in await store.load_messages(child)] == [
            "user",
            "assistant",
            "tool",
            "assistant",
        ]
        assert await store.open_runs("office-1") == [] and await store.open_runs(child) == []
    finally:
        await store.close()


class TakenOver(MemoryStore):
    """A view of a store on which another process takes the crew session's lease over once
    ``taken`` is set (its renewal is refused, as a store does for a stale token)."""

    def __init__(self, inner: MemoryStore, session_id: str) -> None:
        self.inner, self.session_id, self.taken = inner, session_id, asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        if self.taken.is_set() and lease.session_id == self.session_id:
            raise LeaseLost(f"session {self.session_id!r} was taken over by another process")
        return await self.inner.renew_lease(lease, ttl)


async def test_a_crew_whose_lease_is_taken_over_stops() -> None:
    store = TakenOver(MemoryStore(), "crew-lost")
    in_tool = asyncio.Event()

    @tool(effect="pure")
    async def hang() -> str:
        """Hang until the crew is stopped."""
        in_tool.set()
        await asyncio.Event().wait()
        return "never"

    worker = Agent(
        name="worker",
        tools=[hang],
        model=ScriptedModel([ModelResponse(tool_calls=[ToolCall(name="hang")]), "done"]),
    )
    crew = Crew("c", members={"worker": worker}, plan="worker")
    job = asyncio.ensure_future(
        crew.run("go", session_id="crew-lost", runtime=Runtime(store, lease_ttl=0.3))
    )
    await in_tool.wait()
    store.taken.set()  # the next renewal (every ttl/3) finds the lease gone
    with pytest.raises(LeaseLost):
        async with asyncio.timeout(10):  # before the fix: the crew ran on, holding nothing
            await job

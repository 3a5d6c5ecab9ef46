"""Shared helpers of the scheduling tests: an injected clock, agents, stores."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from loom import Agent
from loom.engine.runtime import Runtime
from loom.schedule import MonitorStore, RuntimeLauncher, Scheduler, ScheduleStore
from loom.store import SQLiteStore
from loom.testing import FunctionModel


class Clock:
    """A clock tests move by hand."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def at(text: str, tz: str = "UTC") -> float:
    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(tz)).timestamp()


class Gate:
    """Runs of the ``slow`` agent wait here until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = 0
        self.changed = asyncio.Condition()

    async def enter(self) -> None:
        async with self.changed:
            self.started += 1
            self.changed.notify_all()
        await self.release.wait()

    async def wait_started(self, n: int) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: self.started >= n)


def agents(gate: Gate | None = None) -> dict[str, Agent]:
    async def slow(messages: Any, tools: Any) -> str:
        assert gate is not None
        await gate.enter()
        return "done"

    echo = Agent(name="echo", model=FunctionModel(lambda m, t: f"echo: {m[-1].content}"))
    out = {"echo": echo}
    if gate is not None:
        out["slow"] = Agent(name="slow", model=FunctionModel(slow))
    return out


class Rig:
    def __init__(self, store: SQLiteStore, clock: Clock, gate: Gate) -> None:
        self.store, self.clock, self.gate = store, clock, gate
        self.agents = agents(gate)
        self.runtime = Runtime(store=store)
        self.schedules = ScheduleStore(store, clock=clock, agents=self.agents)
        self.monitors = MonitorStore(store, clock=clock)
        self.scheduler = Scheduler(
            self.schedules,
            RuntimeLauncher(self.runtime, self.agents),
            clock=clock,
            monitors=self.monitors,
        )

    async def runs(self, schedule_id: str) -> list[Any]:
        return sorted(
            await self.schedules.schedule_runs(schedule_id, limit=0), key=lambda r: r.tick
        )


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    store = SQLiteStore(tmp_path / "loom.db")
    rig = Rig(store, Clock(at("2025-01-06T08:00:00")), Gate())
    yield rig
    rig.gate.release.set()
    await rig.scheduler.aclose()
    await rig.runtime.aclose()
    await store.close()

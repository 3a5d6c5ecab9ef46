"""The ``extract`` background job: run by the scheduler, off the turn path."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from tests.schedule.conftest import Rig

from loom import Message
from loom.errors import ModelUnavailable
from loom.memory.extraction import ExtractionSettings
from loom.schedule import JobRunner, build_scheduler
from loom.schedule.jobs import MaintenanceSettings, builtin_jobs, job_schedule
from loom.testing import FunctionModel


def facts(messages: list[Message], tools: Any) -> str:
    said = messages[-1].content.split("\n")[1]  # "User:\n<text>\n\nAssistant:..."
    return json.dumps({"memories": [{"text": "fact: " + said}]})


async def wire(rig: Rig, settings: ExtractionSettings) -> None:
    maintenance = MaintenanceSettings(extraction=settings)
    jobs = {j.name: j for j in builtin_jobs(rig.store, rig.schedules, rig.monitors, maintenance)}
    assert "extract" in jobs
    for job in jobs.values():
        await rig.schedules.ensure(job_schedule(job))

    async def no_wait(seconds: float) -> None:
        return None

    rig.scheduler.jobs = JobRunner(jobs, sleep=no_wait)


async def test_a_turn_completes_while_the_extraction_model_is_blocked(rig: Rig) -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def blocked(messages: list[Message], tools: Any) -> str:
        entered.set()
        await release.wait()
        return facts(messages, tools)

    echo = rig.agents["echo"]
    await rig.runtime.run(echo, "my dog is called Rex", session_id="s1")
    await wire(rig, ExtractionSettings(model=FunctionModel(blocked), every=600))
    rig.clock.advance(600)
    await rig.scheduler.poll()
    await entered.wait()  # the job's model call is in flight, and stays there
    result = await rig.runtime.run(echo, "I live in Oslo", session_id="s1")
    assert (result.stop_reason, result.output) == ("completed", "echo: I live in Oslo")
    assert not release.is_set() and rig.scheduler.tasks  # the job is still waiting
    release.set()
    await rig.scheduler.drain()
    [run] = await rig.schedules.schedule_runs("job:extract")
    assert (run.status, run.attempts) == ("finished", 1)
    found = await rig.store.search_items(("memories",), limit=10)
    assert [i.value["text"] for i in found] == ["fact: my dog is called Rex"]
    # the turn that finished meanwhile is the next tick's
    rig.clock.advance(600)
    await rig.scheduler.poll()
    await rig.scheduler.drain()
    found = await rig.store.search_items(("memories",), limit=10)
    assert sorted(i.value["text"] for i in found) == [
        "fact: I live in Oslo",
        "fact: my dog is called Rex",
    ]


async def test_a_model_that_is_down_is_a_failed_run_retried_with_nothing_written(
    rig: Rig,
) -> None:
    calls = 0

    def down(messages: list[Message], tools: Any) -> str:
        nonlocal calls
        calls += 1
        raise ModelUnavailable("503 from the provider")

    await rig.runtime.run(rig.agents["echo"], "my dog is called Rex", session_id="s1")
    await wire(rig, ExtractionSettings(model=FunctionModel(down), every=600))
    rig.clock.advance(600)
    await rig.scheduler.poll()
    await rig.scheduler.drain()
    [run] = await rig.schedules.schedule_runs("job:extract")
    assert (run.status, run.attempts, calls) == ("failed", 3, 3)
    assert "503 from the provider" in (run.error or "")
    assert await rig.store.search_items(("memories",), limit=10) == []


async def test_build_scheduler_registers_the_job_from_the_environment(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOM_MEMORY_EXTRACT", "openai:gpt-4o-mini")
    monkeypatch.setenv("LOOM_MEMORY_EXTRACT_EVERY", "120")
    scheduler = await build_scheduler(rig.runtime, rig.agents, clock=rig.clock)
    try:
        schedules = await scheduler.store.list_schedules(jobs=True)
        [extract] = [s.schedule for s in schedules if s.schedule.id == "job:extract"]
        assert extract.interval == 120
    finally:
        await scheduler.aclose()
    monkeypatch.delenv("LOOM_MEMORY_EXTRACT")
    jobs = builtin_jobs(rig.store, rig.schedules, rig.monitors)
    assert "extract" not in {j.name for j in jobs}  # off unless asked for

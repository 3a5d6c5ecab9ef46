"""Scheduling from code: ``Scheduler.schedule`` / ``Agent.schedule`` / ``Crew.schedule``."""

from __future__ import annotations

import pytest
from tests.schedule.conftest import Rig, at

from loom import Agent
from loom.crew import Crew, Sequential
from loom.errors import ScheduleError
from loom.events import AgentFinish
from loom.schedule import Schedule
from loom.testing import FunctionModel


async def fire(rig: Rig, when: float) -> None:
    rig.clock.now = when
    await rig.scheduler.poll()
    await rig.scheduler.drain()


async def test_an_agent_scheduled_from_code_runs_on_its_berlin_cron(rig: Rig) -> None:
    # Monday 2025-01-06; 09:00 in Berlin (CET, UTC+1) is 08:00 UTC
    rig.clock.now = at("2025-01-06T07:00:00")
    greeter = Agent(name="greeter", model=FunctionModel(lambda m, t: f"hello {m[-1].content}"))
    made = await greeter.schedule(
        "team", on=rig.scheduler, cron="0 9 * * 1-5", tz="Europe/Berlin", id="standup"
    )
    assert isinstance(made, Schedule)
    assert (made.agent, made.message, made.cron, made.timezone) == (
        "greeter",
        "team",
        "0 9 * * 1-5",
        "Europe/Berlin",
    )
    stored = await rig.schedules.get("standup")
    assert stored.next_fire_at == at("2025-01-06T09:00:00", "Europe/Berlin")
    await fire(rig, at("2025-01-06T08:00:01"))  # greeter is in no registry: the scheduler has it
    [run] = await rig.runs("standup")
    assert run.status == "finished", run.error
    messages = await rig.store.load_messages(run.session_id)  # type: ignore[arg-type]
    assert [m.content for m in messages] == ["team", "hello team"]


async def test_a_crew_scheduled_from_code_runs_every_interval(rig: Rig) -> None:
    echo = Agent(name="echo2", model=FunctionModel(lambda m, t: f"crew says {m[-1].content}"))
    crew = Crew("nightly", members={"echo2": echo}, plan=Sequential("echo2"))
    made = await crew.schedule("report", on=rig.scheduler, every=3600, id="nightly")
    assert (made.agent, made.interval) == ("nightly", 3600)
    await fire(rig, rig.clock.now + 3601)
    [run] = await rig.runs("nightly")
    assert run.status == "finished", run.error
    finished = [  # the crew's own session journal: it ran the member on the message
        e
        for e in await rig.store.load_events(run.session_id)  # type: ignore[arg-type]
        if isinstance(e, AgentFinish)
    ]
    assert [e.output for e in finished] == ["crew says report"]


async def test_scheduling_from_code_names_the_bad_field(rig: Rig) -> None:
    greeter = Agent(name="greeter", model=FunctionModel(lambda m, t: "hi"))
    with pytest.raises(ScheduleError) as bad:
        await rig.scheduler.schedule(greeter, "x", cron="0 9 * * *", tz="Mars/Olympus")
    assert bad.value.field == "timezone"
    with pytest.raises(ScheduleError) as bad:
        await rig.scheduler.schedule(greeter, "x")  # neither cron nor every
    assert bad.value.field == "cron"

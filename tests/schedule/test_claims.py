"""What the claim's condition (``WHERE next_fire_at = <what the poller read>``) guarantees on its
own, beyond the unique (schedule, tick) key: a poller acting on a stale read fires nothing and
never moves the schedule's next tick, when the schedule changed in between (paused, retimed, or
claimed further by another process). The unique key cannot help there: the stale tick has no row
yet, or the stale write is to ``next_fire_at`` itself."""

from __future__ import annotations

from typing import Any

from tests.schedule.conftest import Rig, at

from loom.schedule import Schedule, ScheduleStore


class ChangedMeanwhile(ScheduleStore):
    """A store where something else happens between the poller's read and its claim."""

    meanwhile: Any = None

    async def claim(self, *args: Any, **kwargs: Any) -> bool:
        if self.meanwhile is not None:
            step, self.meanwhile = self.meanwhile, None
            await step()
        return await super().claim(*args, **kwargs)


def _stale_rig(rig: Rig) -> ChangedMeanwhile:
    store = ChangedMeanwhile(rig.store, clock=rig.clock, agents=rig.agents)
    rig.scheduler.store = store
    return store


async def test_a_schedule_paused_between_read_and_claim_does_not_fire(rig: Rig) -> None:
    schedules = _stale_rig(rig)
    await schedules.add(Schedule(agent="echo", message="hi", cron="*/10 * * * *", id="p"))
    rig.clock.now = at("2025-01-06T08:10:05")
    schedules.meanwhile = lambda: schedules.pause("p")  # another process pauses it
    report = await rig.scheduler.poll()
    await rig.scheduler.drain()
    assert (report.claimed, report.started) == (0, 0)
    assert await rig.runs("p") == []
    state = await schedules.get("p")
    assert (state.schedule.enabled, state.next_fire_at) == (False, None)  # still paused


async def test_a_schedule_retimed_between_read_and_claim_fires_no_tick_of_the_old_timing(
    rig: Rig,
) -> None:
    schedules = _stale_rig(rig)
    await schedules.add(Schedule(agent="echo", message="hi", cron="*/10 * * * *", id="r"))
    rig.clock.now = at("2025-01-06T08:10:05")
    schedules.meanwhile = lambda: schedules.update("r", cron="0 12 * * *")  # now: daily at noon
    await rig.scheduler.poll()
    await rig.scheduler.drain()
    assert await rig.runs("r") == []  # 08:10 is no tick of the new timing
    assert (await schedules.get("r")).next_fire_at == at("2025-01-06T12:00:00")


async def test_a_stale_claim_never_moves_the_next_tick_back(rig: Rig) -> None:
    schedules = _stale_rig(rig)
    await schedules.add(Schedule(agent="echo", message="hi", cron="*/10 * * * *", id="b"))
    stale = (await schedules.due(at("2025-01-06T08:10:05")))[0]  # read at 08:10:05 ...
    other = Rig(rig.store, rig.clock, rig.gate)  # ... then another process claims two ticks
    other.clock.now = at("2025-01-06T08:20:05")
    await other.scheduler.poll()
    await other.scheduler.drain()
    assert (await schedules.get("b")).next_fire_at == at("2025-01-06T08:30:00")
    won = await schedules.claim(  # ... and the first one's claim, from its stale read, lands
        "b",
        stale.next_fire_at,  # type: ignore[arg-type]
        at("2025-01-06T08:20:00"),
        [at("2025-01-06T08:10:00")],
        [],
        owner="stale-poller",
        lease_until=at("2025-01-06T09:00:00"),
        session_of=stale.schedule.session_for,
    )
    assert not won
    assert (await schedules.get("b")).next_fire_at == at("2025-01-06T08:30:00")
    runs = await rig.runs("b")  # 08:10 (late: missed, misfire=run_once) and 08:20, once each
    assert [(r.tick, r.owner) for r in runs] == [
        (at("2025-01-06T08:10:00"), None),
        (at("2025-01-06T08:20:00"), other.scheduler.owner),
    ]
    await other.runtime.aclose()

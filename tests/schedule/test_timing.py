"""Tick times: cron lines on the wall clock of a time zone (DST pinned), intervals, bad input."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from tests.schedule.conftest import at

from loom.errors import ScheduleError
from loom.schedule import Schedule, next_tick

BERLIN = "Europe/Berlin"


def local(ts: float) -> str:
    return datetime.fromtimestamp(ts, ZoneInfo(BERLIN)).isoformat()


def walk(s: Schedule, start: float, n: int) -> list[float]:
    out, t = [], start
    for _ in range(n):
        nxt = next_tick(s, t)
        assert nxt is not None
        out.append(nxt)
        t = nxt
    return out


def test_daily_in_spring_forward_gap_fires_once_shifted_by_the_gap() -> None:
    s = Schedule(agent="a", message="m", cron="30 2 * * *", timezone=BERLIN)
    ticks = walk(s, at("2025-03-29T00:00:00", BERLIN), 3)
    assert [local(t) for t in ticks] == [
        "2025-03-29T02:30:00+01:00",
        "2025-03-30T03:30:00+02:00",  # 02:30 does not exist that night
        "2025-03-31T02:30:00+02:00",
    ]


def test_hourly_over_spring_forward_fires_once_for_the_gap_hour() -> None:
    s = Schedule(agent="a", message="m", cron="0 * * * *", timezone=BERLIN)
    ticks = walk(s, at("2025-03-30T00:30:00", BERLIN), 3)
    assert [local(t) for t in ticks] == [
        "2025-03-30T01:00:00+01:00",
        "2025-03-30T03:00:00+02:00",
        "2025-03-30T04:00:00+02:00",
    ]
    assert ticks[1] - ticks[0] == 3600  # one real hour: not fired twice at 01:00 UTC


def test_fall_back_fires_each_local_time_once_at_its_first_occurrence() -> None:
    daily = Schedule(agent="a", message="m", cron="30 2 * * *", timezone=BERLIN)
    ticks = walk(daily, at("2025-10-25T12:00:00", BERLIN), 2)
    assert [local(t) for t in ticks] == ["2025-10-26T02:30:00+02:00", "2025-10-27T02:30:00+01:00"]
    hourly = Schedule(agent="a", message="m", cron="0 * * * *", timezone=BERLIN)
    ticks = walk(hourly, at("2025-10-26T01:30:00", BERLIN), 2)
    assert [local(t) for t in ticks] == ["2025-10-26T02:00:00+02:00", "2025-10-26T03:00:00+01:00"]


def test_interval_ignores_dst_and_respects_start_and_end() -> None:
    start = at("2025-03-30T01:00:00", BERLIN)
    s = Schedule(agent="a", message="m", interval=1800, start_at=start, end_at=start + 3600)
    assert next_tick(s, start - 10) == start
    assert walk(s, start, 2) == [start + 1800, start + 3600]
    assert next_tick(s, start + 3600) is None


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * * *"}, "cron"),
        ({"cron": None}, "cron"),
        ({"interval": 60}, "cron"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"start_at": 200.0, "end_at": 100.0}, "end_at"),
        ({"misfire": "later"}, "misfire"),
        ({"overlap": "both"}, "overlap"),
        ({"catch_up": 0}, "catch_up"),
        ({"agent": "ghost"}, "agent"),
        ({"message": " "}, "message"),
    ],
)
def test_bad_schedules_name_the_field(changes: dict[str, object], field: str) -> None:
    s = Schedule(agent="echo", message="m", cron="* * * * *").replace(**changes)
    with pytest.raises(ScheduleError) as err:
        s.check(agents={"echo"})
    assert err.value.field == field
    assert field in str(err.value)


def test_bad_interval() -> None:
    with pytest.raises(ScheduleError, match="interval"):
        Schedule(agent="a", message="m", interval=-1).check()

"""When a schedule's ticks fall: cron lines in an IANA time zone, or fixed intervals.

Cron lines are read on the *wall clock* of the schedule's time zone (croniter walks naive local
times; ``zoneinfo`` turns each into an instant), which pins down daylight-saving changes:

* spring forward (a local hour that does not exist): a tick inside the gap fires once, shifted
  by the gap (``30 2 * * *`` in Europe/Berlin on the last Sunday of March fires at 03:30 CEST);
  an hourly line fires once for the gap hour, not twice.
* fall back (a local hour that happens twice): each local time fires once, at its first
  occurrence (``30 2 * * *`` fires at 02:30 CEST, not again at 02:30 CET; an hourly line has a
  two-hour gap there).

Intervals count seconds from ``start_at`` (else the schedule's creation): daylight-saving
changes do not touch them. Ticks are instants (epoch seconds), so a wall clock that jumps (an
NTP step) only changes *when* the poller sees them: a backward jump fires nothing twice (a
tick's claim moved ``next_fire_at`` past it already) and a forward jump makes the ticks it
skipped late, handled by the misfire policy.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from loom.errors import ScheduleError

__all__ = ["check_timing", "next_tick", "ticks_between", "zone"]

_MIN_INTERVAL = 0.001  # below this a "schedule" is a busy loop


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``; ``ScheduleError`` (field ``timezone``) if there is none."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError) as exc:
        raise ScheduleError(
            f"{name!r} is not an IANA time zone (e.g. 'UTC', 'Europe/Berlin', 'America/New_York')",
            field="timezone",
        ) from exc


def check_timing(spec: Any) -> None:
    """Raise ``ScheduleError`` naming the field unless ``spec`` (a ``Schedule`` or ``Monitor``)
    has exactly one of a valid ``cron`` line and a positive ``interval``, a known time zone,
    and (schedules) an ``end_at`` after ``start_at``."""
    from croniter import croniter  # type: ignore[import-untyped]

    cron, interval = spec.cron, spec.interval
    if (cron is None) == (interval is None):
        raise ScheduleError("give exactly one of a cron line and an interval", field="cron")
    if cron is not None:
        fields = cron.split()
        if len(fields) != 5 or not croniter.is_valid(cron):
            raise ScheduleError(
                f"{cron!r} is not a five-field cron line (minute hour day month weekday, "
                "e.g. '0 9 * * 1-5')",
                field="cron",
            )
    elif not (isinstance(interval, int | float) and math.isfinite(interval)) or (
        interval < _MIN_INTERVAL
    ):
        raise ScheduleError(
            f"must be a positive number of seconds, got {interval!r}", field="interval"
        )
    zone(spec.timezone)
    start, end = getattr(spec, "start_at", None), getattr(spec, "end_at", None)
    if start is not None and end is not None and end <= start:
        raise ScheduleError(
            f"the end ({_iso(end)}) is not after the start ({_iso(start)})", field="end_at"
        )


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


def _cron_next(cron: str, tz: ZoneInfo, after: float) -> float:
    """The first instant after ``after`` whose local wall time matches ``cron``."""
    from croniter import croniter

    # Start an hour (the largest DST shift) of wall time early so that a local time that maps
    # to an instant after ``after`` is not stepped over; keep the first candidate later than
    # ``after``. fold=0 everywhere: an ambiguous local time is its first occurrence and a
    # local time in a gap is shifted forward by the gap (PEP 495).
    local = datetime.fromtimestamp(after, tz).replace(tzinfo=None) - timedelta(hours=1)
    it = croniter(cron, local)
    for _ in range(10_000):  # a handful in practice; bounded in case of an odd line
        candidate: datetime = it.get_next(datetime)
        at = candidate.replace(tzinfo=tz, fold=0).timestamp()
        if at > after:
            return at
    raise ScheduleError(f"{cron!r} has no tick after {_iso(after)}", field="cron")


def next_tick(spec: Any, after: float) -> float | None:
    """The first tick of ``spec`` strictly after ``after`` (epoch seconds), not before its
    ``start_at``; ``None`` once past its ``end_at``."""
    start = getattr(spec, "start_at", None)
    end = getattr(spec, "end_at", None)
    if start is not None and after < start:
        after = start - 1e-6  # a tick exactly at the start counts
    if spec.cron is not None:
        at = _cron_next(spec.cron, zone(spec.timezone), after)
    else:
        anchor = start if start is not None else getattr(spec, "created_at", 0.0)
        step = float(spec.interval)
        k = math.floor((after - anchor) / step) + 1
        at = anchor + k * step
        if at <= after:  # float rounding
            at += step
    if end is not None and at > end:
        return None
    return at


def ticks_between(spec: Any, first: float, until: float, limit: int) -> tuple[list[float], int]:
    """Ticks from ``first`` (itself a tick) up to ``until`` inclusive: the newest ``limit`` of
    them, and how many there were in all (cron lines are walked up to 100,000 ticks)."""
    if first > until:
        return [], 0
    if spec.interval is not None:  # arithmetic: a year of one-second ticks costs nothing
        end = getattr(spec, "end_at", None)
        last = until if end is None else min(until, end)
        step = float(spec.interval)
        count = math.floor((last - first) / step + 1e-9) + 1 if last >= first else 0
        return [first + step * i for i in range(max(0, count - limit), count)], count
    out: list[float] = []
    count = 0
    at: float | None = first
    while at is not None and at <= until and count < 100_000:
        count += 1
        out.append(at)
        if len(out) > limit:
            out.pop(0)
        at = next_tick(spec, at)
    return out, count

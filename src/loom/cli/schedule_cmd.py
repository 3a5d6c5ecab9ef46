"""``loom schedule`` (add, update, list, show, pause, resume, rm, runs) and ``loom monitors``
(add, list, show, checkin, rm): schedules and cron monitors in the store (``loom.schedule``).

A store with no database yet is an error that names ``loom db migrate`` (the CLI never creates
a database by accident); times print as UTC ``YYYY-MM-DD HH:MM:SS`` and a missing one as ``-``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.markup import escape

from loom.cli._console import emit_json, fail, out
from loom.cli.sessions_cmd import JsonOpt, StoreOpt, run_with_store

app = typer.Typer(help="Schedule agent runs (cron or interval).", no_args_is_help=True)
monitors_app = typer.Typer(help="Cron monitors: health and check-ins.", no_args_is_help=True)

IdArg = Annotated[str, typer.Argument(help="The schedule id.")]


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


# fields of a schedule's or monitor's dict that hold epoch seconds (printed as UTC times)
_TIME_FIELDS = frozenset(
    {
        "start_at",
        "end_at",
        "next_fire_at",
        "updated_at",
        "created_at",
        "next_expected_at",
        "last_checkin_at",
        "in_progress_since",
    }
)


def _show_fields(fields: dict[str, Any]) -> None:
    """``key: value`` lines, times as UTC and a missing value as ``-``."""
    for key, value in fields.items():
        if value is None or value == "":
            text = "-"
        elif key in _TIME_FIELDS and isinstance(value, int | float):
            text = f"{_when(value)} UTC"
        else:
            text = str(value)
        out.print(f"{key}: {escape(text)}")


def _schedules(store: Any) -> Any:
    from loom.schedule import ScheduleStore

    return ScheduleStore(store)


@app.command("add")
def add(
    agent: Annotated[str, typer.Argument(help="The agent to run (its name).")],
    message: Annotated[str, typer.Argument(help="The message each run sends.")],
    cron: Annotated[str | None, typer.Option(help="Cron line, e.g. '0 9 * * 1-5'.")] = None,
    every: Annotated[float | None, typer.Option(help="Or: every this many seconds.")] = None,
    tz: Annotated[str, typer.Option("--tz", help="IANA time zone of the cron line.")] = "UTC",
    schedule_id: Annotated[str | None, typer.Option("--id", help="The schedule's id.")] = None,
    session: Annotated[str, typer.Option(help="per_schedule or per_run.")] = "per_schedule",
    misfire: Annotated[str, typer.Option(help="skip, run_once or catch_up.")] = "run_once",
    catch_up: Annotated[int, typer.Option(help="Runs to catch up (misfire=catch_up).")] = 1,
    overlap: Annotated[str, typer.Option(help="skip, queue or cancel.")] = "skip",
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Add a schedule; ``loom serve`` / ``loom worker`` fire it."""
    from loom.schedule import Schedule

    fields: dict[str, Any] = {
        "agent": agent,
        "message": message,
        "cron": cron,
        "interval": every,
        "timezone": tz,
        "session": session,
        "misfire": misfire,
        "catch_up": catch_up,
        "overlap": overlap,
    }
    if schedule_id:
        fields["id"] = schedule_id
    state = run_with_store(store, lambda s: _schedules(s).add(Schedule(**fields)))
    if as_json:
        emit_json(state.to_dict())
        return
    out.print(f"added {state.schedule.id}: next run {_when(state.next_fire_at)} UTC")


@app.command("update")
def update(
    schedule_id: IdArg,
    agent: Annotated[str | None, typer.Option(help="Run this agent instead.")] = None,
    message: Annotated[str | None, typer.Option(help="Send this message instead.")] = None,
    cron: Annotated[str | None, typer.Option(help="A new cron line.")] = None,
    every: Annotated[float | None, typer.Option(help="Or: every this many seconds.")] = None,
    tz: Annotated[str | None, typer.Option("--tz", help="A new IANA time zone.")] = None,
    misfire: Annotated[str | None, typer.Option(help="skip, run_once or catch_up.")] = None,
    catch_up: Annotated[int | None, typer.Option(help="Runs to catch up.")] = None,
    overlap: Annotated[str | None, typer.Option(help="skip, queue or cancel.")] = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change a schedule's fields (those given); a new cron line or interval fires from now."""
    from loom.errors import InputError

    changes: dict[str, Any] = {
        k: v
        for k, v in {
            "agent": agent,
            "message": message,
            "timezone": tz,
            "misfire": misfire,
            "catch_up": catch_up,
            "overlap": overlap,
        }.items()
        if v is not None
    }
    if cron is not None and every is not None:
        raise fail(InputError("give --cron or --every, not both"), 2)
    if cron is not None:
        changes.update(cron=cron, interval=None)
    if every is not None:
        changes.update(interval=every, cron=None)
    if not changes:
        raise fail(InputError("nothing to change: give at least one option (see --help)"), 2)
    state = run_with_store(store, lambda s: _schedules(s).update(schedule_id, **changes))
    if as_json:
        emit_json(state.to_dict())
        return
    out.print(f"updated {escape(schedule_id)}: next run {_when(state.next_fire_at)} UTC")


@app.command("list")
def list_(
    store: StoreOpt = None,
    jobs: Annotated[bool, typer.Option(help="Include the built-in background jobs.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Every schedule with its next run."""
    from rich.table import Table

    states = run_with_store(store, lambda s: _schedules(s).list_schedules(jobs=jobs, limit=0))
    if as_json:
        emit_json([s.to_dict() for s in states])
        return
    table = Table("id", "agent", "when", "tz", "enabled", "next (UTC)")
    for st in states:
        s = st.schedule
        when = s.cron or f"every {s.interval:g} s"
        table.add_row(
            escape(s.id),
            escape(s.job or s.agent),
            escape(when),
            s.timezone,
            "yes" if s.enabled else "no",
            _when(st.next_fire_at),
        )
    out.print(table)


@app.command("show")
def show(schedule_id: IdArg, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """A schedule and its latest runs."""

    async def read(s: Any) -> Any:
        sched = _schedules(s)
        return await sched.get(schedule_id), await sched.schedule_runs(schedule_id, limit=20)

    state, runs = run_with_store(store, read)
    if as_json:
        emit_json({**state.to_dict(), "runs": [r.to_dict() for r in runs]})
        return
    _show_fields(state.to_dict())
    for r in runs:
        out.print(f"  {_when(r.tick)}  {r.status:<11} {r.run_id or ''} {escape(r.error or '')}")


def _set(schedule_id: str, store: str | None, what: str) -> None:
    state = run_with_store(store, lambda s: getattr(_schedules(s), what)(schedule_id))
    out.print(f"{schedule_id}: {'enabled' if state.schedule.enabled else 'paused'}")


@app.command("pause")
def pause(schedule_id: IdArg, store: StoreOpt = None) -> None:
    """Stop firing a schedule (its runs in progress go on)."""
    _set(schedule_id, store, "pause")


@app.command("resume")
def resume(schedule_id: IdArg, store: StoreOpt = None) -> None:
    """Fire a paused schedule again, from its next tick (paused ticks are not caught up)."""
    _set(schedule_id, store, "resume")


@app.command("rm")
def rm(schedule_id: IdArg, store: StoreOpt = None) -> None:
    """Delete a schedule and its run history."""
    run_with_store(store, lambda s: _schedules(s).remove(schedule_id))
    out.print(f"deleted {schedule_id}")


@app.command("runs")
def runs(
    schedule_id: IdArg, store: StoreOpt = None, limit: int = 50, as_json: JsonOpt = False
) -> None:
    """A schedule's (or ``job:<name>``'s) ticks and what became of them."""

    async def read(s: Any) -> Any:
        sched = _schedules(s)
        await sched.get(schedule_id)  # ScheduleNotFound (exit 2), not an empty list
        return await sched.schedule_runs(schedule_id, limit=limit)

    rows = run_with_store(store, read)
    if as_json:
        emit_json([r.to_dict() for r in rows])
        return
    for r in rows:
        out.print(
            f"{_when(r.tick)}  {r.status:<11} attempts={r.attempts} "
            f"{r.run_id or ''} {escape(r.error or '')}"
        )


@monitors_app.command("list")
def monitors_list(store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Every cron monitor with its health."""
    from rich.table import Table

    from loom.schedule import MonitorStore

    states = run_with_store(store, lambda s: MonitorStore(s).list_monitors())
    if as_json:
        emit_json([m.to_dict() for m in states])
        return
    table = Table("id", "watches", "health", "expected (UTC)", "last check-in (UTC)")
    for m in states:
        watches = m.monitor.schedule_id or m.monitor.cron or f"every {m.monitor.interval:g} s"
        table.add_row(
            escape(m.monitor.id),
            escape(watches),
            m.health,
            _when(m.next_expected_at),
            _when(m.last_checkin_at),
        )
    out.print(table)


@monitors_app.command("show")
def monitors_show(
    monitor_id: Annotated[str, typer.Argument(help="The monitor id.")],
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A monitor and its check-ins."""
    from loom.schedule import MonitorStore

    async def read(s: Any) -> Any:
        monitors = MonitorStore(s)
        return await monitors.get(monitor_id), await monitors.checkins(monitor_id)

    state, checkins = run_with_store(store, read)
    if as_json:
        emit_json({**state.to_dict(), "checkins": [c.to_dict() for c in checkins]})
        return
    _show_fields(state.to_dict())
    for c in checkins:
        out.print(f"  {_when(c.at)}  {c.status:<11} {c.source}")


@monitors_app.command("add")
def monitors_add(
    schedule: Annotated[
        str | None, typer.Option("--schedule", help="Watch this schedule's ticks.")
    ] = None,
    cron: Annotated[str | None, typer.Option(help="Or: expect a check-in on this cron.")] = None,
    every: Annotated[float | None, typer.Option(help="Or: every this many seconds.")] = None,
    tz: Annotated[str, typer.Option("--tz", help="IANA time zone of the cron line.")] = "UTC",
    margin: Annotated[float, typer.Option(help="Seconds late before 'missed'.")] = 60.0,
    max_runtime: Annotated[
        float | None, typer.Option(help="Seconds in progress before 'timed out'.")
    ] = None,
    monitor_id: Annotated[str | None, typer.Option("--id", help="The monitor's id.")] = None,
    name: Annotated[str, typer.Option(help="A label.")] = "",
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Add a cron monitor: on a schedule (--schedule) or on its own timing (--cron/--every)."""
    from loom.errors import InputError
    from loom.schedule import Monitor, MonitorStore

    if sum(x is not None for x in (schedule, cron, every)) != 1:
        raise fail(InputError("give exactly one of --schedule, --cron or --every"), 2)
    fields: dict[str, Any] = {
        "name": name,
        "schedule_id": schedule,
        "cron": cron,
        "interval": every,
        "timezone": tz,
        "margin": margin,
        "max_runtime": max_runtime,
    }
    if monitor_id:
        fields["id"] = monitor_id
    state = run_with_store(store, lambda s: MonitorStore(s).add(Monitor(**fields)))
    if as_json:
        emit_json(state.to_dict())
        return
    out.print(
        f"added monitor {escape(state.monitor.id)}: expects a check-in by "
        f"{_when(state.next_expected_at)} UTC"
    )


@monitors_app.command("checkin")
def monitors_checkin(
    monitor_id: Annotated[str, typer.Argument(help="The monitor id.")],
    status: Annotated[str, typer.Argument(help="ok, error or in_progress.")],
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Record a check-in (what a job sends when it starts and ends)."""
    from loom.schedule import MonitorStore

    checkin = run_with_store(store, lambda s: MonitorStore(s).checkin(monitor_id, status))
    if as_json:
        emit_json(checkin.to_dict())
        return
    out.print(
        f"{escape(monitor_id)}: {checkin.status} at {_when(checkin.at)} UTC, {checkin.health}"
    )


@monitors_app.command("rm")
def monitors_rm(
    monitor_id: Annotated[str, typer.Argument(help="The monitor id.")],
    store: StoreOpt = None,
) -> None:
    """Delete a monitor and its check-ins."""
    from loom.schedule import MonitorStore

    run_with_store(store, lambda s: MonitorStore(s).remove(monitor_id))
    out.print(f"deleted monitor {escape(monitor_id)}")

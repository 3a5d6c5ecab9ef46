"""``loom schedule`` (add, list, show, pause, resume, rm, runs) and ``loom monitors`` (list,
show): schedules and cron monitors in the store (``loom.schedule``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.markup import escape

from loom.cli._console import emit_json, out
from loom.cli.sessions_cmd import JsonOpt, StoreOpt, run_with_store

app = typer.Typer(help="Schedule agent runs (cron or interval).", no_args_is_help=True)
monitors_app = typer.Typer(help="Cron monitors: health and check-ins.", no_args_is_help=True)

IdArg = Annotated[str, typer.Argument(help="The schedule id.")]


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


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
    for key, value in state.to_dict().items():
        out.print(f"{key}: {escape(str(value))}")
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
    rows = run_with_store(store, lambda s: _schedules(s).schedule_runs(schedule_id, limit=limit))
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
    for key, value in state.to_dict().items():
        out.print(f"{key}: {escape(str(value))}")
    for c in checkins:
        out.print(f"  {_when(c.at)}  {c.status:<11} {c.source}")

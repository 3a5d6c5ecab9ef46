"""`loom errors`: the Error Submission Channel's stored errors (list, show, cleanup)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from typing import Annotated, Any

import typer
from rich.markup import escape

from loom.cli._console import emit_json, out, say_error
from loom.cli.sessions_cmd import JsonOpt, StoreOpt, confirm, id_column, run_with_store

app = typer.Typer(help="Inspect errors stored by the error channel.", no_args_is_help=True)

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_when(text: str, what: str) -> datetime:
    """``30d`` / ``2h`` / ``15m`` (that long ago) or an ISO date-time."""
    from loom.errors import InputError
    from loom.messages import utcnow

    m = _AGE.match(text)
    if m:
        return utcnow() - timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise InputError(
            f"{what}: {text!r} is neither an age like 30d, 12h, 15m nor an ISO date-time "
            "like 2026-01-31T12:00"
        ) from None
    return when if when.tzinfo else when.astimezone()


def _parse(text: str | None, what: str) -> datetime | None:
    from loom.errors import LoomError

    if text is None:
        return None
    try:
        return parse_when(text, what)
    except LoomError as exc:
        say_error(exc)
        raise typer.Exit(code=2) from None


@app.command("list")
def list_errors(
    store: StoreOpt = None,
    session: Annotated[
        str | None, typer.Option("--session", "-s", help="Only this session.")
    ] = None,
    tool: Annotated[str | None, typer.Option("--tool", "-t", help="Only this tool.")] = None,
    since: Annotated[str | None, typer.Option(help="Newer than: 30d, 2h, or ISO time.")] = None,
    until: Annotated[str | None, typer.Option(help="Older than: 30d, 2h, or ISO time.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many (0: all).")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """List stored tool errors, newest first."""
    from rich.table import Table

    start, end = _parse(since, "--since"), _parse(until, "--until")
    errors = run_with_store(
        store,
        lambda s: s.list_errors(
            session_id=session, tool_name=tool, since=start, until=end, limit=limit
        ),
    )
    if as_json:
        emit_json(errors)
        return
    table = Table(title=f"{len(errors)} errors")
    id_column(table, "error id", [e.id for e in errors])
    table.add_column("time", no_wrap=True)
    id_column(table, "session", [e.session_id for e in errors])
    for col in ("tool", "summary"):
        table.add_column(col)
    for e in errors:
        table.add_row(
            escape(e.id),
            f"{e.timestamp:%Y-%m-%d %H:%M:%S}",
            escape(e.session_id),
            escape(e.tool_name),
            escape(e.short_summary),
        )
    out.print(table)


@app.command("show")
def show(
    error_id: Annotated[str, typer.Argument(help="The id, e.g. err_20260131_120000_a1b2c3.")],
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show one stored error in full (message, arguments, traceback)."""
    from loom.errors import ErrorNotFound

    async def get(s: Any) -> Any:
        found = await s.get_error(error_id)
        if found is None:
            raise ErrorNotFound(f"no error {error_id!r} in {s.path}; see `loom errors list`")
        return found

    e = run_with_store(store, get)
    if as_json:
        emit_json(e)
        return
    out.print(
        f"[bold]{escape(e.id)}[/]  {e.timestamp:%Y-%m-%d %H:%M:%S}  "
        f"session={escape(e.session_id)}  run={escape(e.run_id)}  tool={escape(e.tool_name)}"
    )
    out.print(f"[red]{escape(e.short_summary)}[/]")
    raw = dict(e.raw_error)
    trace = raw.pop("traceback", None)
    out.print_json(json.dumps(raw, ensure_ascii=False, default=str))
    if trace:
        out.print(trace, markup=False)


@app.command("cleanup")
def cleanup(
    older_than: Annotated[str, typer.Option(help="Delete errors older than this: 30d, 12h, ISO.")],
    store: StoreOpt = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete stored errors older than an age (seed 001: errors otherwise stay for ever).

    Asks first (``--older-than 0d`` deletes every error) unless ``--yes``.
    """
    cutoff = _parse(older_than, "--older-than")
    assert cutoff is not None
    when = f"{cutoff:%Y-%m-%d %H:%M:%S}"
    doomed = run_with_store(store, lambda s: s.list_errors(until=cutoff, limit=0))
    if not doomed:
        out.print(f"no errors older than {when}")
        return
    if not yes:
        confirm(f"Delete {len(doomed)} errors older than {when}?")
    n = run_with_store(store, lambda s: s.delete_errors(cutoff))
    out.print(f"deleted {n} errors older than {when}")

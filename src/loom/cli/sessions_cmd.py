"""`loom sessions`: list, show, events, export (reads the session database)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from loom.store.sqlite import SQLiteStore

T = TypeVar("T")
app = typer.Typer(help="Inspect sessions.", no_args_is_help=True)
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

StoreOpt = Annotated[
    str | None, typer.Option("--store", help="Session database (default .loom/loom.db).")
]
SessionArg = Annotated[str, typer.Argument(help="The session id.")]


def open_existing(path: str | None) -> SQLiteStore:
    """The database to inspect; never creates one (a typo must not make an empty database)."""
    from loom.errors import StoreError
    from loom.store.sqlite import SQLiteStore

    target = Path(path) if path else Path(".loom") / "loom.db"
    if not target.exists():
        raise StoreError(
            f"no Loom database at {target}; run an agent first (loom run ...) or pass --store PATH"
        )
    return SQLiteStore(target)


def run_with_store(path: str | None, fn: Callable[[SQLiteStore], Awaitable[T]]) -> T:
    """Open the store, run ``fn``, close it; a LoomError becomes a red message and exit code 1."""
    from loom.errors import LoomError

    async def go() -> T:
        store = open_existing(path)
        try:
            return await fn(store)
        finally:
            await store.close()

    try:
        return asyncio.run(go())
    except LoomError as exc:
        err.print(f"[red]{type(exc).__name__}:[/] {exc}")
        raise typer.Exit(code=1) from None


async def _require(store: SQLiteStore, session_id: str) -> Any:
    from loom.errors import SessionNotFound

    info = await store.get_session(session_id)
    if info is None:
        raise SessionNotFound(
            f"no session {session_id!r} in {store.path}; see `loom sessions list`"
        )
    return info


def _clip(text: str, width: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


@app.command("list")
def list_sessions(
    store: StoreOpt = None,
    limit: Annotated[int, typer.Option(help="How many sessions, newest first.")] = 50,
) -> None:
    """List sessions, most recently updated first."""
    from rich.table import Table

    sessions = run_with_store(store, lambda s: s.list_sessions(limit))
    table = Table(title=f"{len(sessions)} sessions")
    for col in ("session", "agent", "messages", "tokens in/out", "created", "updated"):
        table.add_column(col, justify="right" if col in ("messages", "tokens in/out") else "left")
    for i in sessions:
        table.add_row(
            i.id,
            i.agent_name,
            str(i.message_count),
            f"{i.usage.input_tokens}/{i.usage.output_tokens}",
            f"{i.created_at:%Y-%m-%d %H:%M:%S}",
            f"{i.updated_at:%Y-%m-%d %H:%M:%S}",
        )
    out.print(table)


@app.command("show")
def show(
    session_id: SessionArg,
    store: StoreOpt = None,
    agent_file: Annotated[
        Path | None, typer.Option("--agent", "-a", help="Agent definition for the memory view.")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Model whose window and tokenizer to use.")
    ] = None,
) -> None:
    """Show a session: metadata, memory tiers with token counts, runs and messages."""
    from rich.table import Table

    from loom.agent import Agent
    from loom.memory.describe import describe_session

    overrides: dict[str, Any] = {"model": model} if model else {}
    viewer = Agent.from_file(agent_file, **overrides) if agent_file else Agent(**overrides)

    async def load(s: SQLiteStore) -> tuple[Any, Any, Any, Any]:
        info = await _require(s, session_id)
        report = await describe_session(s, session_id, viewer)
        return info, await s.list_runs(session_id), await s.load_messages(session_id), report

    info, runs, messages, report = run_with_store(store, load)
    out.print(
        f"[bold]{info.id}[/]  agent={info.agent_name or '-'}  messages={info.message_count}"
        f"  tokens={info.usage.input_tokens}/{info.usage.output_tokens}"
        f"  created={info.created_at:%Y-%m-%d %H:%M:%S}"
    )
    ends = {r.run_id: r.status for r in runs if r.status != "running"}
    starts = [r for r in runs if r.status == "running"]
    if starts:
        out.print(
            "runs: " + ", ".join(f"{r.run_id} ({ends.get(r.run_id, 'open')})" for r in starts)
        )
    tiers = Table(title=f"memory (window {report.context_window:,}, budget {report.budget:,})")
    for col in ("tier", "tokens", "budget", "items", "detail"):
        tiers.add_column(col)
    for row in report.rows():
        tiers.add_row(*row)
    out.print(tiers)
    table = Table(show_lines=False)
    for col in ("#", "role", "content"):
        table.add_column(col)
    style = {"user": "cyan", "assistant": "green", "tool": "yellow", "system": "magenta"}
    for n, m in enumerate(messages, start=1):
        content = m.content
        if m.tool_calls:
            calls = ", ".join(
                f"{c.name}({json.dumps(c.arguments, ensure_ascii=False)})" for c in m.tool_calls
            )
            content = (content + " " if content else "") + f"→ {calls}"
        if m.role == "tool":
            content = f"[{m.name}] {content}"
        table.add_row(str(n), f"[{style.get(m.role, '')}]{m.role}[/]", escape(_clip(content)))
    out.print(table)


@app.command("events")
def events(
    session_id: SessionArg,
    store: StoreOpt = None,
    run: Annotated[str | None, typer.Option("--run", help="Only this run's events.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """Show the event journal of a session (or one run), in the order the events happened."""
    from rich.table import Table

    async def load(s: SQLiteStore) -> Any:
        await _require(s, session_id)
        return await s.load_events(session_id, run)

    journal = run_with_store(store, load)
    if as_json:
        for ev in journal:
            sys.stdout.write(json.dumps(ev.to_dict(), default=str) + "\n")
        return
    table = Table(title=f"{len(journal)} events")
    for col in ("run", "seq", "iter", "type", "data"):
        table.add_column(col)
    for ev in journal:
        table.add_row(
            ev.run_id,
            str(ev.sequence),
            str(ev.iteration),
            str(ev.type),
            escape(_clip(json.dumps(ev.data, ensure_ascii=False, default=str), 80)),
        )
    out.print(table)


@app.command("export")
def export(
    session_id: SessionArg,
    store: StoreOpt = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="File to write (default: stdout).")
    ] = None,
) -> None:
    """Export a session's transcript as JSONL (one message per line)."""
    from loom.store.transcript import write_jsonl

    async def load(s: SQLiteStore) -> Any:
        await _require(s, session_id)
        return await s.load_messages(session_id)

    messages = run_with_store(store, load)
    if output is None:
        write_jsonl(messages, sys.stdout)
        return
    with output.open("w", encoding="utf-8") as f:
        n = write_jsonl(messages, f)
    err.print(f"wrote {n} messages to {output}")

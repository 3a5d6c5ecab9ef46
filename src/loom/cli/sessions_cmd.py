"""`loom sessions`: list, show, events, export, delete (the session database)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.markup import escape

from loom.cli._console import emit_json, err, out, say_error

if TYPE_CHECKING:
    from loom.store.sqlite import SQLiteStore

T = TypeVar("T")
app = typer.Typer(help="Inspect and delete sessions.", no_args_is_help=True)

StoreOpt = Annotated[
    str | None, typer.Option("--store", help="Session database (default .loom/loom.db).")
]
SessionArg = Annotated[str, typer.Argument(help="The session id.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def id_column(table: Any, name: str, ids: list[str]) -> None:
    """Add a column for ids that Rich never cuts or wraps: an id must paste back whole."""
    table.add_column(name, no_wrap=True, min_width=max((len(i) for i in ids), default=len(name)))


def open_existing(path: str | None) -> SQLiteStore:
    """The database to inspect; never creates one (a typo must not make an empty database)."""
    from loom.errors import StoreError
    from loom.store.sqlite import SQLiteStore

    if path is not None and path.startswith(("postgres://", "postgresql://")):
        from loom.store.postgres import PostgresStore

        return PostgresStore(path)  # type: ignore[return-value]  # the same read API
    target = Path(path) if path else Path(".loom") / "loom.db"
    if not target.exists():
        raise StoreError(
            f"no Loom database at {target}; create one with `loom db migrate` (or run an agent "
            "first: loom run ...), or pass --store PATH"
        )
    return SQLiteStore(target)


def run_with_store(path: str | None, fn: Callable[[SQLiteStore], Awaitable[T]]) -> T:
    """Open the store, run ``fn``, close it; a LoomError becomes a red message and exit code 2
    (the CLI's rule: 2 when what you gave is wrong or missing, see ``loom.cli``)."""
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
        say_error(exc)
        raise typer.Exit(code=2) from None


async def _require(store: SQLiteStore, session_id: str) -> Any:
    from loom.errors import SessionNotFound

    info = await store.get_session(session_id)
    if info is None:
        where = getattr(store, "path", store)  # a SQLite file, or a PostgresStore's DSN
        raise SessionNotFound(f"no session {session_id!r} in {where}; see `loom sessions list`")
    return info


def _clip(text: str, width: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


@app.command("list")
def list_sessions(
    store: StoreOpt = None,
    limit: Annotated[int, typer.Option(help="How many sessions, newest first.")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """List sessions, most recently updated first."""
    from rich.table import Table

    sessions = run_with_store(store, lambda s: s.list_sessions(limit))
    if as_json:
        emit_json(sessions)
        return
    table = Table(title=f"{len(sessions)} sessions")
    id_column(table, "session", [i.id for i in sessions])
    for col in ("agent", "messages", "tokens in/out", "created", "updated"):
        table.add_column(col, justify="right" if col in ("messages", "tokens in/out") else "left")
    for i in sessions:
        table.add_row(
            escape(i.id),
            escape(i.agent_name),
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
    as_json: JsonOpt = False,
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
    if as_json:
        emit_json({"session": info, "runs": runs, "memory": report, "messages": messages})
        return
    out.print(
        f"[bold]{escape(info.id)}[/]  agent={escape(info.agent_name or '-')}"
        f"  messages={info.message_count}"
        f"  tokens={info.usage.input_tokens}/{info.usage.output_tokens}"
        f"  cost={_cost(runs)}"
        f"  created={info.created_at:%Y-%m-%d %H:%M:%S}"
    )
    ends = {r.run_id: r.status for r in runs if r.status != "running"}
    starts = [r for r in runs if r.status == "running"]
    if starts:
        out.print(
            "runs: "
            + ", ".join(f"{escape(r.run_id)} ({ends.get(r.run_id, 'open')})" for r in starts)
        )
    tiers = Table(title=f"memory (window {report.context_window:,}, budget {report.budget:,})")
    for col in ("tier", "tokens", "budget", "items", "detail"):
        tiers.add_column(col)
    for row in report.rows():
        tiers.add_row(*(escape(cell) for cell in row))
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
            emit_json(ev.to_dict())
        return
    table = Table(title=f"{len(journal)} events")
    id_column(table, "run", [ev.run_id for ev in journal])
    for col in ("seq", "iter", "type", "data"):
        table.add_column(col)
    for ev in journal:
        table.add_row(
            escape(ev.run_id),
            str(ev.sequence),
            str(ev.iteration),
            str(ev.type),
            escape(_clip(json.dumps(ev.data, ensure_ascii=False, default=str), 80)),
        )
    out.print(table)


def _redactor(patterns: list[str]) -> Any:
    from loom.errors import ConfigurationError
    from loom.guardrails.redact import Redactor

    extra: dict[str, str] = {}
    for p in patterns:
        name, eq, rx = p.partition("=")
        if not eq or not name.strip():
            raise ConfigurationError(f"--redact-pattern {p!r}: write it as NAME=REGEX")
        extra[name.strip()] = rx
    return Redactor(extra)


@app.command("export")
def export(
    session_id: SessionArg,
    store: StoreOpt = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="File to write (default: stdout).")
    ] = None,
    redact: Annotated[
        bool,
        typer.Option(
            "--redact/--no-redact",
            help="Replace PII and secrets (emails, phones, cards, keys, tokens).",
        ),
    ] = True,
    pattern: Annotated[
        list[str] | None,
        typer.Option(
            "--redact-pattern",
            metavar="NAME=REGEX",
            help="An extra redaction pattern (repeatable).",
        ),
    ] = None,
    media_dir: Annotated[
        Path | None,
        typer.Option(
            "--media-dir",
            help="Where to write the session's media files (default: beside --output).",
        ),
    ] = None,
    media: Annotated[
        bool,
        typer.Option("--media/--no-media", help="Write the session's images, files and audio."),
    ] = True,
) -> None:
    """Export a session's transcript as JSONL (one message per line), redacted by default,
    and its media (images, files, audio) as files beside it, each named after its reference
    (``sha256-<hex>.png``). Redaction covers the text, not the media's bytes."""
    from loom.errors import LoomError
    from loom.store.transcript import write_jsonl

    try:
        redactor = _redactor(pattern or []) if redact else None
    except LoomError as exc:  # a pattern that does not compile: say which, exit 2
        say_error(exc)
        raise typer.Exit(code=2) from None
    where = media_dir if media_dir is not None else output.parent if output is not None else None

    async def load(s: SQLiteStore) -> tuple[Any, int, int]:
        await _require(s, session_id)
        messages = await s.load_messages(session_id)
        written = skipped = 0
        if media:
            if where is None:  # the transcript goes to stdout: say what was left out
                skipped = len(await _session_media(s, session_id))
            else:
                written = await write_media(s, session_id, where)
        return messages, written, skipped

    messages, written, skipped = run_with_store(store, load)
    clean = redactor.redact_value if redactor is not None else None
    if output is None:
        write_jsonl(messages, sys.stdout, redact=clean)
    else:
        with output.open("w", encoding="utf-8") as f:
            n = write_jsonl(messages, f, redact=clean)
        err.print(f"wrote {n} messages to {escape(str(output))}")
    if written:
        err.print(f"wrote {written} media files to {escape(str(where))}")
    if skipped:
        err.print(
            f"the session has {skipped} media files, not written: pass --output FILE or "
            "--media-dir DIR to write them"
        )


# Extensions of the media types Loom reads, where ``mimetypes`` would pick an odd one.
# (``mimetypes`` knows no ``audio/wav``, and names Ogg audio ``.oga``; tables differ by OS).
_EXTENSIONS = {
    "image/png": ".png",
    "image/jpeg": ".jpg",
    "image/gif": ".gif",
    "image/webp": ".webp",
    "application/pdf": ".pdf",
    "audio/wav": ".wav",
    "audio/x-wav": ".wav",
    "audio/mpeg": ".mp3",
    "audio/mp3": ".mp3",
    "audio/flac": ".flac",
    "audio/ogg": ".ogg",
}


def media_file_name(ref: str, media_type: str) -> str:
    """The file an export writes a medium to: its reference (``sha256:<hex>``) with ``-`` for
    the colon, and the extension of its media type (``.bin`` when it has none)."""
    import mimetypes

    ext = _EXTENSIONS.get(media_type) or mimetypes.guess_extension(media_type) or ".bin"
    return ref.replace(":", "-") + ext


async def _session_media(s: Any, session_id: str) -> list[tuple[str, str, int]]:
    from loom.store.base import capabilities_of

    blobs = capabilities_of(s).blobs
    return [] if blobs is None else await blobs.session_blobs(session_id)


async def write_media(s: Any, session_id: str, directory: Path) -> int:
    """Write the media ``session_id`` names into ``directory`` (``media_file_name``), a few
    at a time (one store read each few: a session's media are never all in memory at once);
    return how many. A medium the store no longer holds is skipped."""
    from loom.store.base import capabilities_of

    listed = await _session_media(s, session_id)
    blobs = capabilities_of(s).blobs
    if not listed or blobs is None:
        return 0
    await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    written = 0
    for start in range(0, len(listed), 8):
        chunk = listed[start : start + 8]
        found = await blobs.load_blobs([ref for ref, _, _ in chunk])
        for ref, media_type, _ in chunk:
            if ref in found:
                target = directory / media_file_name(ref, media_type)
                await asyncio.to_thread(target.write_bytes, found[ref])
                written += 1
    return written


@app.command("delete")
def delete(
    session_id: SessionArg,
    store: StoreOpt = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete a session: its messages, events, runs, stored errors and results, and the
    media no other session names."""
    from loom.errors import SessionBusy
    from loom.messages import new_id

    async def count(s: SQLiteStore) -> Any:
        return await _require(s, session_id)

    info = run_with_store(store, count)
    if not yes:
        confirm(f"Delete session {info.id} and its {info.message_count} messages?")
    lock = new_id("delete")

    async def remove(s: SQLiteStore) -> bool:
        # The session's lease keeps a run in another process from writing into it meanwhile.
        lease = await s.acquire_lease(session_id, lock, 60.0)
        if lease is None:
            raise SessionBusy(
                f"session {session_id!r} is running in another process; try again when it ends"
            )
        return await s.delete_session(session_id)

    run_with_store(store, remove)
    out.print(f"deleted session {escape(session_id)}")


def confirm(question: str) -> None:
    """Ask yes/no (default no) on stderr; anything but yes, or no input at all, exits 1."""
    try:
        agreed = typer.confirm(question, default=False, err=True)
    except typer.Abort:  # end of input: nobody said yes
        agreed = False
    if not agreed:
        err.print("nothing deleted")
        raise typer.Exit(code=1)


def _cost(runs: list[Any]) -> str:
    """The session's cost from its ended runs' records: unknown if any run's is (loom.pricing)."""
    total = 0.0
    for r in runs:
        if r.status == "running" or r.usage.empty:
            continue
        cost = r.data.get("cost") if isinstance(r.data, dict) else None
        if not isinstance(cost, int | float):
            return "unknown"
        total += cost
    return f"${total:.6g}"

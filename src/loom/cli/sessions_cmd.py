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
from loom.text import whole_number

if TYPE_CHECKING:
    from loom.embedding.base import Embedder
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


def open_existing(path: str | None, embedder: Embedder | None = None) -> SQLiteStore:
    """The database to inspect; never creates one (a typo must not make an empty database).
    ``embedder``: the one its memory items are searched and re-embedded with."""
    from loom.errors import StoreError
    from loom.store.sqlite import SQLiteStore

    if path is not None and path.startswith(("postgres://", "postgresql://")):
        from loom.store.postgres import PostgresStore

        return PostgresStore(path, embedder=embedder)  # type: ignore[return-value]  # same API
    target = Path(path) if path else Path(".loom") / "loom.db"
    if not target.exists():
        raise StoreError(
            f"no Loom database at {target}; create one with `loom db migrate` (or run an agent "
            "first: loom run ...), or pass --store PATH"
        )
    return SQLiteStore(target, embedder=embedder)


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
    from loom.sandbox.snapshots import default_sandbox_dir, drop_session_snapshots

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
        deleted = await s.delete_session(session_id)
        drop_session_snapshots(default_sandbox_dir(s), session_id)
        return deleted

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


# -- branches: fork, rewind, branches (loom.engine.branching) ------------------------------------
AtOpt = Annotated[
    int | None,
    typer.Option("--at", help="After the session's first TURN turns (0: the empty session)."),
]
EventOpt = Annotated[
    str | None,
    typer.Option(
        "--event", help="Just after the stored event RUN.SEQ (see `loom sessions events`)."
    ),
]
EffectsOpt = Annotated[
    str | None,
    typer.Option(
        "--effects",
        help="What to do about dropped calls with effects: note, refuse or allow (default: "
        "the agent's branch_effects, else note).",
    ),
]
AgentFileOpt = Annotated[
    Path | None,
    typer.Option("--agent", "-a", help="Agent definition whose branch_effects applies."),
]


def parse_point(at: int | None, event: str | None, *, required: bool) -> Any:
    """``AtTurn`` from ``--at``, ``AtEvent`` from ``--event RUN.SEQ``; None when neither is
    given and none is ``required``. ``InputError`` saying what to give otherwise."""
    from loom.engine.run_inputs import AtEvent, AtTurn
    from loom.errors import InputError

    if at is not None and event is not None:
        raise InputError("give --at TURN or --event RUN.SEQ, not both")
    if at is not None:
        return AtTurn(at)
    if event is not None:
        run_id, dot, seq = event.rpartition(".")
        if not dot or not run_id or whole_number(seq) is None:
            raise InputError(
                f"--event {event!r}: give RUN.SEQ, a run id and an event's sequence number "
                "(as `loom sessions events SESSION` lists them, e.g. run_1a2b3c.7)"
            )
        return AtEvent(run_id, int(seq))
    if required:
        raise InputError("give the point: --at TURN or --event RUN.SEQ")
    return None


def branch_agent(info: Any, agent_file: Path | None, effects: str | None) -> Any:
    """The agent a branch runs as: the definition given (its ``branch_effects``), else one
    named as the session's; ``--effects`` overrides. Its model is never called (``demo``
    unless the definition names one)."""
    from loom.agent import Agent

    overrides: dict[str, Any] = {"branch_effects": effects} if effects is not None else {}
    if agent_file is not None:
        return Agent.from_file(agent_file, **overrides)
    return Agent(name=info.agent_name or "loom", model="demo", **overrides)


@app.command("fork")
def fork(
    session_id: SessionArg,
    at: AtOpt = None,
    event: EventOpt = None,
    new_id: Annotated[
        str | None, typer.Option("--id", help="The new session's id (default: a fresh one).")
    ] = None,
    store: StoreOpt = None,
    agent_file: AgentFileOpt = None,
    effects: EffectsOpt = None,
) -> None:
    """Start a new session from a point of SESSION (its end when no point is given). The new
    session shares the history up to there; SESSION is not changed."""
    from loom.engine.runtime import Runtime

    point = _checked(lambda: parse_point(at, event, required=False))

    async def go(s: SQLiteStore) -> str:
        info = await _require(s, session_id)
        agent = branch_agent(info, agent_file, effects)
        return await Runtime(store=s).fork(agent, session_id, point, new_session_id=new_id)

    made = run_with_store(store, go)
    out.print(made)
    err.print(f"[dim]forked {escape(session_id)} into {escape(made)}[/]")


@app.command("rewind")
def rewind(
    session_id: SessionArg,
    to: Annotated[
        int | None, typer.Option("--to", help="Keep the session's first TURN turns.")
    ] = None,
    event: EventOpt = None,
    store: StoreOpt = None,
    agent_file: AgentFileOpt = None,
    effects: EffectsOpt = None,
) -> None:
    """Move SESSION back to a point: the later turns leave its transcript and stay in its
    journal (`loom sessions branches` shows them)."""
    from loom.engine.run_inputs import Rewind, RunOptions
    from loom.engine.runtime import Runtime

    point = _checked(lambda: parse_point(to, event, required=True))

    async def go(s: SQLiteStore) -> Any:
        info = await _require(s, session_id)
        agent = branch_agent(info, agent_file, effects)
        # a session a run holds (here or in another process) is refused, not waited for
        busy = RunOptions(on_busy="drop")
        result = await Runtime(store=s).run(
            agent, Rewind(point), session_id=session_id, options=busy
        )
        return result, await s.load_events_of_type(session_id, [_branch_type()])

    result, branched = run_with_store(store, go)
    if result.stop_reason != "rewound":
        say_error(RuntimeError(f"the rewind stopped ({result.stop_reason}): {result.error}"))
        raise typer.Exit(code=1)
    last = branched[-1] if branched else None
    dropped = last.data.get("abandoned", 0) if last is not None else 0
    out.print(f"rewound {escape(session_id)}: {dropped} messages left the transcript")
    for e in last.data.get("effects", []) if last is not None else []:
        err.print(
            f"[yellow]note:[/] {escape(e['tool'])}"
            f"({escape(json.dumps(e['arguments'], ensure_ascii=False))}) had run "
            f"\\[{escape(str(e['effect']))}]; its effect stays in the world"
        )


def _branch_type() -> Any:
    from loom.events import EventType

    return EventType.SESSION_BRANCH


def _checked(fn: Callable[[], T]) -> T:
    """``fn()``, a LoomError printed with exit code 2 (bad options, before any store opens)."""
    from loom.errors import LoomError

    try:
        return fn()
    except LoomError as exc:
        say_error(exc)
        raise typer.Exit(code=2) from None


@app.command("branches")
def branches(session_id: SessionArg, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """The session's branches from its journal: each rewind, regenerate, edit or fork, with
    its point, the messages it abandoned and the effects it noted."""
    from loom.engine.branching import branches_of

    async def load(s: SQLiteStore) -> Any:
        await _require(s, session_id)
        return branches_of(await s.load_events(session_id))

    found = run_with_store(store, load)
    rows = [
        {
            "run_id": b.event.run_id,
            "sequence": b.event.sequence,
            "timestamp": b.event.timestamp,
            "reason": b.event.reason,
            "point": b.event.point,
            "kept": b.event.at,
            "abandoned": [m.model_dump(mode="json") for m in b.abandoned],
            "effects": b.event.effects,
            "noted": bool(b.event.note),
        }
        for b in found
    ]
    if as_json:
        emit_json(rows)
        return
    if not found:
        out.print(f"{escape(session_id)} has no branches")
        return
    from datetime import UTC, datetime

    for n, b in enumerate(found, start=1):
        e = b.event
        when = datetime.fromtimestamp(e.timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S")
        point = ", ".join(f"{k}={v}" for k, v in e.point.items()) or "-"
        out.print(
            f"[bold]branch {n}[/] {escape(e.reason)} at {when} (event {escape(e.run_id)}."
            f"{e.sequence}); point {escape(point)}; kept {e.at} messages, abandoned "
            f"{len(b.abandoned)}"
        )
        for m in b.abandoned:
            content = m.content
            if m.tool_calls:
                calls = ", ".join(
                    f"{c.name}({json.dumps(c.arguments, ensure_ascii=False)})" for c in m.tool_calls
                )
                content = (content + " " if content else "") + f"→ {calls}"
            out.print(f"  [dim]abandoned[/] {m.role}: {escape(_clip(content))}")
        for eff in e.effects:
            args = json.dumps(eff.get("arguments"), ensure_ascii=False)
            result = _clip(str(eff.get("result", "")), 60)
            out.print(
                f"  [yellow]effect[/] {escape(str(eff.get('tool')))}({escape(args)}) -> "
                f"{escape(result)} \\[{escape(str(eff.get('effect')))}]"
                + ("; noted" if e.note else "")
            )

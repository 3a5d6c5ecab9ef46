"""`loom memory`: list, search, delete and extract the items of memory across sessions (#29).

Items live in the session database (``--store``, alias ``--db``; default ``.loom/loom.db``) when
its store has the ``ItemStore`` capability. The CLI reads as the database's owner: it sees every
item, whichever API key wrote it (the ``owner`` column shows whose it is; empty: shared).
Namespaces are written dotted on the command line (``users.alice.prefs``), as LangGraph's
``GET /store/items`` takes them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich.markup import escape

from loom.cli._console import emit_json, out, say_error

if TYPE_CHECKING:
    from loom.store.base import ItemStore, Store
    from loom.store.items import Item

__all__ = ["app", "open_store", "parse_namespace"]

T = TypeVar("T")
app = typer.Typer(help="List, search and delete memory items.", no_args_is_help=True)

StoreOpt = Annotated[
    str | None,
    typer.Option("--store", "--db", help="Session database (default .loom/loom.db)."),
]
PrefixOpt = Annotated[
    str, typer.Option("--prefix", help="Only items under this namespace, dotted: users.alice.")
]
LimitOpt = Annotated[int, typer.Option("--limit", help="How many items at most.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def parse_namespace(dotted: str, *, prefix: bool = False) -> tuple[str, ...]:
    """``users.alice`` as ``("users", "alice")``, checked (``InputError`` when it is not a
    namespace; an empty ``prefix`` is every namespace)."""
    from loom.store.items import check_namespace

    return check_namespace(dotted.split(".") if dotted else [], prefix=prefix)


def open_store(path: str | None, embedder: str | None = None) -> Store:
    """The existing database at ``path`` (never creates one); what every command reads. Its
    items are searched with the embedder the spec ``embedder`` names (None: ``LOOM_EMBEDDER``;
    unset: keyword search only)."""
    from loom.cli.sessions_cmd import open_existing
    from loom.store.items_vectors import embedder_from_env

    return open_existing(path, embedder_from_env(embedder))


EmbedderOpt = Annotated[
    str | None,
    typer.Option(
        "--embedder",
        help="Embedder spec for semantic search (local, openai:MODEL, hash); "
        "default LOOM_EMBEDDER.",
    ),
]


def _run(
    path: str | None, fn: Callable[[ItemStore], Awaitable[T]], embedder: str | None = None
) -> T:
    """Open the store, run ``fn`` on its items, close it; a LoomError is a red message and
    exit code 2 (what you gave is wrong or missing)."""
    from loom.errors import LoomError, StoreError
    from loom.store.base import capabilities_of

    async def go() -> T:
        # Without --embedder, open_store(path) alone (it reads LOOM_EMBEDDER itself).
        store = open_store(path) if embedder is None else open_store(path, embedder)
        try:
            items = capabilities_of(store).items
            if items is None:
                raise StoreError(
                    f"the store {store!r} keeps no memory items (it lacks the ItemStore "
                    "capability); upgrade Loom or use a store that has it"
                )
            return await fn(items)
        finally:
            await store.close()

    try:
        return asyncio.run(go())
    except LoomError as exc:
        say_error(exc)
        raise typer.Exit(code=2) from None


def _clip(text: str, width: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _show(items: list[Item], title: str, *, scores: bool = False) -> None:
    import json

    from rich.table import Table

    table = Table(title=title)
    for col in ("namespace", "key", "value", "owner", "updated"):
        table.add_column(col, no_wrap=col in ("namespace", "key"))
    if scores:
        table.add_column("score", justify="right")
    for i in items:
        row = [
            escape(".".join(i.namespace)),
            escape(i.key),
            escape(_clip(json.dumps(i.value, ensure_ascii=False, default=str))),
            escape(i.owner or ""),
            f"{i.updated_at:%Y-%m-%d %H:%M:%S}",
        ]
        if scores:
            row.append(f"{i.score or 0:.3f}")
        table.add_row(*row)
    out.print(table)


@app.command("list")
def list_items(
    prefix: PrefixOpt = "",
    limit: LimitOpt = 100,
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """List memory items under a namespace prefix, newest first."""

    async def go(items: ItemStore) -> list[Item]:
        return await items.search_items(parse_namespace(prefix, prefix=True), limit=limit)

    found = _run(store, go)
    if as_json:
        emit_json(found)
        return
    _show(found, f"{len(found)} items")


@app.command("search")
def search(
    query: Annotated[str, typer.Argument(help="Words to look for in items' values.")],
    prefix: PrefixOpt = "",
    limit: LimitOpt = 10,
    as_json: JsonOpt = False,
    store: StoreOpt = None,
    mode: Annotated[
        str | None,
        typer.Option(
            "--mode", help="keyword, semantic or hybrid (default: hybrid with an embedder)."
        ),
    ] = None,
    embedder: EmbedderOpt = None,
) -> None:
    """Search memory items, best match first: by keywords, or by meaning with an embedder."""

    async def go(items: ItemStore) -> list[Item]:
        ns = parse_namespace(prefix, prefix=True)
        return await items.search_items(ns, query=query, limit=limit, mode=mode)

    found = _run(store, go, embedder)
    if as_json:
        emit_json(found)
        return
    _show(found, f"{len(found)} items matching {query!r}", scores=True)


@app.command("rm")
def remove(
    namespace: Annotated[str, typer.Argument(help="The item's namespace, dotted: users.alice.")],
    key: Annotated[str, typer.Argument(help="The item's key.")],
    store: StoreOpt = None,
) -> None:
    """Delete one memory item."""
    from loom.errors import InputError
    from loom.store.items import check_key

    async def go(items: ItemStore) -> bool:
        return await items.delete_item(parse_namespace(namespace), check_key(key))

    if not _run(store, go):
        say_error(
            InputError(f"no memory item {key!r} in namespace {namespace!r}; see `loom memory list`")
        )
        raise typer.Exit(code=2)
    out.print(f"deleted {escape(namespace)} / {escape(key)}")


@app.command("extract")
def extract(
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Extraction model (default: LOOM_MEMORY_EXTRACT, then LOOM_MODEL, then local).",
        ),
    ] = None,
    namespace: Annotated[
        str, typer.Option("--namespace", help="Where memories go, dotted; {owner}, {agent}.")
    ] = "memories.{owner}",
    max_turns: Annotated[
        int | None, typer.Option("--max-turns", help="Turns to send at most.", min=1)
    ] = 50,
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", help="Tokens to spend at most.", min=1)
    ] = 100_000,
    max_cost: Annotated[
        float | None, typer.Option("--max-cost", help="US dollars to spend at most.", min=0)
    ] = None,
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Extract memories from the turns finished since the last extraction, once (what the
    scheduler's ``extract`` job does on its ticks)."""
    import os

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from loom.cli._console import err
    from loom.errors import LoomError
    from loom.memory.extraction import ExtractionReport, ExtractionSettings, extract_memories

    async def go() -> ExtractionReport:
        settings = ExtractionSettings(
            model=model or os.environ.get("LOOM_MEMORY_EXTRACT") or None,
            namespace=tuple(namespace.split(".")),
            max_turns=max_turns,
            max_tokens=max_tokens,
            max_cost=max_cost,
        )
        db = open_store(store)
        try:
            with Progress(
                TextColumn("extracting"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("sessions, {task.fields[memories]} memories"),
                console=err,
                transient=True,
                disable=as_json,
            ) as bar:
                task = bar.add_task("extract", total=None, memories=0)

                def progress(done: int, total: int, report: ExtractionReport) -> None:
                    bar.update(task, completed=done, total=total, memories=report.memories)

                return await extract_memories(db, settings, progress=progress)
        finally:
            await db.close()

    try:
        report = asyncio.run(go())
    except LoomError as exc:
        say_error(exc)
        raise typer.Exit(code=2) from None
    if as_json:
        emit_json(report.to_dict())
    else:
        stopped = f", stopped: {report.stopped}" if report.stopped else ""
        out.print(
            f"{report.turns} turns, {report.memories} memories, {report.skipped} skipped{stopped}"
        )
        for problem in report.errors:
            err.print(f"[yellow]warning:[/] {escape(problem)}")
    if report.stopped == "model_error":
        raise typer.Exit(code=1)


@app.command("reindex")
def reindex(store: StoreOpt = None, embedder: EmbedderOpt = None) -> None:
    """Re-embed every memory item with the embedder (after changing the model: a search then
    says the stored vectors were made by another one)."""
    from loom.errors import ConfigurationError

    async def go(items: ItemStore) -> int:
        from loom.store.base import capabilities_of

        vectors = capabilities_of(items).vectors  # type: ignore[arg-type]
        if vectors is None:
            raise ConfigurationError(
                "loom memory reindex needs an embedder: pass --embedder SPEC (local, "
                "openai:MODEL, hash) or set LOOM_EMBEDDER"
            )
        return await vectors.reindex_items()

    count = _run(store, go, embedder)
    out.print(f"re-embedded {count} items")

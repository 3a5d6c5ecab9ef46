"""`loom keys`: what the session database holds for a server's API keys.

``loom keys forget NAME`` deletes everything the key named ``NAME`` has in the database
(``--store``/``--db``, default ``.loom/loom.db``): its sessions with their media, its memory
items, its schedules and monitors, and the records of which sessions were its; then makes the
deleted bytes unreadable in the database's files (``loom.server.forget``). It asks first
unless ``--yes``. With the server's key file (``--keys``, and ``LOOM_API_KEYS``) it refuses an
admin key's name: an admin key's records are the server's shared ones.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from loom.cli._console import emit_json, err, out, say_error

if TYPE_CHECKING:
    from loom.server.forget import Forgotten

__all__ = ["app"]

app = typer.Typer(help="Manage what the database holds for API keys.", no_args_is_help=True)


def refuse_admin(name: str, keys_file: str | None) -> None:
    """``InputError`` when ``name`` is an admin key of ``keys_file`` (or of
    ``LOOM_API_KEYS``, whose keys are never admin)."""
    if keys_file is None:
        return
    from loom.errors import InputError
    from loom.server.security import env_keys, load_keys

    for p in load_keys(keys_file, env_keys()).principals:
        if p.name == name and p.admin:
            raise InputError(
                f"{name!r} is an admin key: what it writes is the server's shared data, not "
                "one owner's; take its admin flag away (and restart the server) to forget it"
            )


@app.command("forget")
def forget(
    name: Annotated[str, typer.Argument(help="The API key's name (its entry in the key file).")],
    store: Annotated[
        str | None,
        typer.Option("--store", "--db", help="Session database (default .loom/loom.db)."),
    ] = None,
    keys: Annotated[
        str | None,
        typer.Option("--keys", help="The server's key file: refuses to forget an admin key."),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Delete everything an API key has: sessions, media, memories, schedules, monitors."""
    from loom.cli.memory_cmd import open_store
    from loom.cli.sessions_cmd import confirm
    from loom.errors import LoomError
    from loom.server.forget import check_owner_name, forget_owner, owned_sessions

    async def count() -> int:
        s = open_store(store)
        try:
            return len((await owned_sessions(s, name))[0])
        finally:
            await s.close()

    async def go() -> Forgotten:
        s = open_store(store)
        try:
            return await forget_owner(s, name)
        finally:
            await s.close()

    try:
        check_owner_name(name)
        refuse_admin(name, keys)
        if not yes:
            sessions = asyncio.run(count())
            confirm(
                f"Forget key {name!r}: delete its {sessions} sessions, their media, its "
                "memories, schedules and monitors? This cannot be undone."
            )
        done = asyncio.run(go())
    except LoomError as exc:
        say_error(exc)
        raise typer.Exit(code=2) from None
    if as_json:
        emit_json(done.to_dict())
    else:
        _summary(done)
    if not done.complete:
        raise typer.Exit(code=1)


def _summary(done: Forgotten) -> None:
    from rich.table import Table

    if done.deleted == 0 and done.complete:
        out.print(f"nothing of key {escape(done.owner)} is stored: nothing deleted")
        return
    table = Table(title=f"forgot key {escape(done.owner)}")
    table.add_column("what")
    table.add_column("deleted", justify="right")
    for what, n in done.to_dict()["deleted"].items():
        table.add_row(what.replace("_", " "), str(n))
    out.print(table)
    if done.media_shared:
        out.print(f"{done.media_shared} media kept: a session of another key names them too")
    if done.busy:
        err.print(
            f"[yellow]kept {len(done.busy)} sessions a run is using "
            f"({escape(', '.join(done.busy))}): run this again when they end[/]"
        )
    if done.shared:
        err.print(
            f"[yellow]kept {len(done.shared)} sessions other keys forked "
            f"({escape(', '.join(done.shared))}): delete those forks, then run this again[/]"
        )
    if not done.scrubbed:
        err.print(
            "[yellow]the store could not scrub its files (a reader held the WAL, or the store "
            "cannot): deleted bytes may remain until its next checkpoint or vacuum[/]"
        )

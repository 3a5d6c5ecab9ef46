"""`loom budgets`: each budget limit (``loom.budgets``) with its spend and what is left in the
current window, per subject (owner, tenant, session, run), from the session database.

The limits are the ones the server and workers run with: ``--budgets`` (a JSON list or a
JSON/YAML file), else ``LOOM_BUDGETS``. Spend is read from the store (``--store``, alias
``--db``; default ``.loom/loom.db``; a ``postgresql://`` URL for a fleet).
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from loom.cli._console import emit_json, out, say_error

__all__ = ["budgets"]


def _money(v: float | None) -> str:
    return "-" if v is None else f"${v:,.4f}"


def _count(v: int | None) -> str:
    return "-" if v is None else f"{v:,}"


def budgets(
    store: Annotated[
        str | None,
        typer.Option("--store", "--db", help="Session database (default .loom/loom.db)."),
    ] = None,
    limits: Annotated[
        str | None,
        typer.Option(
            "--budgets",
            help="The limits: a JSON list or a JSON/YAML file (default $LOOM_BUDGETS).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List budget limits with spend and remaining per scope, window and subject."""
    from loom.budgets import BudgetStatus, budget_report, ledger_for, load_budgets
    from loom.errors import LoomError

    async def go() -> list[BudgetStatus]:
        configured = load_budgets(limits)
        from loom.cli.sessions_cmd import open_existing

        db = open_existing(store)
        try:
            return await budget_report(configured, ledger_for(db))
        finally:
            await db.close()

    try:
        rows = asyncio.run(go())
    except LoomError as exc:
        say_error(exc)
        raise typer.Exit(code=2) from None
    if as_json:
        emit_json([r.to_dict() for r in rows])
        return
    if not rows:
        out.print("no budget limits (set --budgets or LOOM_BUDGETS)")
        return
    table = Table(title="Budgets (current windows, UTC)")
    for col in ("scope", "window", "since", "subject", "limit", "spent", "reserved", "left"):
        table.add_column(
            col, justify="right" if col in ("limit", "spent", "reserved", "left") else "left"
        )
    for r in rows:
        if r.max_cost is not None:
            money = (_money(r.max_cost), _money(r.spent_cost), _money(r.reserved_cost))
            table.add_row(
                r.scope,
                r.window,
                r.window_start or "-",
                escape(r.subject),
                *money,
                _money(r.remaining_cost),
            )
        if r.max_tokens is not None:
            table.add_row(
                r.scope,
                r.window,
                r.window_start or "-",
                escape(r.subject),
                _count(r.max_tokens),
                _count(r.spent_tokens),
                _count(r.reserved_tokens),
                _count(r.remaining_tokens),
            )
    out.print(table)

"""The console's budgets page: each budget limit the server runs with (``loom.budgets``) and,
per subject, what was spent, what calls in flight hold and what is left in the current window.

It reads what ``loom budgets`` reads: the runtime's limits and its store's ledger. A key that
is not an admin sees the global limits and its own owner's buckets only (another owner's,
tenant's, session's or run's spend is not its business); an admin key, or a server without
keys, sees every bucket.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import Response

from loom.budgets import BudgetStatus, budget_report
from loom.server.app import state_of
from loom.server.console.routes import page, router
from loom.server.ownership import current_principal, owner_filter

__all__ = ["BudgetRow"]


@dataclass(frozen=True, slots=True)
class BudgetRow:
    """One line of the page: one bucket's spend in money or in tokens."""

    status: BudgetStatus
    kind: str  # "cost" or "tokens"
    limit: str
    spent: str
    reserved: str
    left: str
    used: float  # the spent + reserved fraction of the limit, 0..1 (the bar)


def _rows(status: BudgetStatus) -> list[BudgetRow]:
    out: list[BudgetRow] = []
    if status.max_cost is not None:
        used = (status.spent_cost + status.reserved_cost) / status.max_cost
        out.append(
            BudgetRow(
                status,
                "cost",
                f"${status.max_cost:,.4f}",
                f"${status.spent_cost:,.4f}",
                f"${status.reserved_cost:,.4f}",
                f"${status.remaining_cost or 0:,.4f}",
                min(used, 1.0),
            )
        )
    if status.max_tokens is not None:
        used = (status.spent_tokens + status.reserved_tokens) / status.max_tokens
        out.append(
            BudgetRow(
                status,
                "tokens",
                f"{status.max_tokens:,}",
                f"{status.spent_tokens:,}",
                f"{status.reserved_tokens:,}",
                f"{status.remaining_tokens or 0:,}",
                min(used, 1.0),
            )
        )
    return out


@router.get("/budgets")
async def budgets_page(request: Request) -> Response:
    """Every limit with its buckets in the current window (UTC)."""
    guard = state_of(request).runtime.budget_guard
    if guard is None:
        return page(request, "budgets.html", nav="budgets", rows=[], configured=False)
    statuses = await budget_report(guard.limits, guard.ledger, guard.clock())
    principal = current_principal.get()
    owner = owner_filter(principal)
    if owner is not None:  # a key that is not an admin: the global limits and its own bucket
        statuses = [
            s
            for s in statuses
            if s.scope == "global" or (s.scope == "owner" and s.subject in (owner, "-"))
        ]
    rows = [row for s in statuses for row in _rows(s)]
    return page(request, "budgets.html", nav="budgets", rows=rows, configured=True)

"""Where the schedule tables' SQL runs: the store's ``ScheduleTables`` capability
(``loom.store.base``; ``SQLiteStore`` and ``PostgresStore`` have it).

Queries are written once, with ``?`` placeholders. The one transactional shape the scheduler
needs is a *gated* write (``schedule_gated``): a conditional UPDATE that must change exactly one
row, then the statements that depend on it, all in one transaction (or nothing, when another
process changed the row first).
"""

from __future__ import annotations

from typing import Any

from loom.errors import ConfigurationError
from loom.store.base import ScheduleTables, capabilities_of

__all__ = ["tables_of"]


def tables_of(store: Any) -> ScheduleTables:
    """``store`` as ``ScheduleTables`` (a server's ``OwnedStore`` shows its inner store's), or
    ``ConfigurationError`` for a store that keeps no schedules."""
    found = capabilities_of(store).schedules
    if found is None:
        raise ConfigurationError(
            f"schedules and monitors are kept in a SQLiteStore or PostgresStore, not in "
            f"{type(store).__name__}; give the runtime one of those"
        )
    return found

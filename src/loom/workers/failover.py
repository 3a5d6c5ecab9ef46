"""Failover without waiting: a retried job takes its dead attempt's session lease over at once.

Why this is safe. A job is attempted again only when procrastinate declared its worker stalled
(no heartbeat for ``stalled_after`` seconds; ``loom.workers.ticks`` retries it). The retry
re-acquires the session lease *in the dead attempt's name*: the store hands the same holder a
new fencing token (the ``Store.acquire_lease`` contract, checked by the conformance suite), so
the old token is stale from that moment and every later append of the stalled attempt is refused
with ``LeaseLost``; then it releases that lease and its own turn takes the session as usual.
Nothing waits for the dead run's lease to expire (``lease_ttl``), so failover costs about
``stalled_after`` plus a sweep tick and a poll.

A worker that was only *slow* (SIGSTOP, a long pause) and comes back is fenced the same way: its
journal writes are refused, it cannot start a tool (the ledger's ``started`` row is a fenced
write), and ``loom.workers.fenced_jobs`` keeps it from reporting an outcome for a job that is
no longer its own (procrastinate's ``finish_job`` would otherwise overwrite the retry's status).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loom.store.base import Store

__all__ = ["take_over"]

log = logging.getLogger("loom.workers")


async def take_over(store: Store, session_id: str, runs: Sequence[str], ttl: float) -> str | None:
    """Fence off the earlier attempts ``runs`` of a retried job on ``session_id``: take the
    session lease in the name of the newest one that can take it (the holder, or any of them
    when the lease is free), then release it. Returns that run, or None when a run of none of
    them holds the lease (the turn then waits for it the ordinary way)."""
    for run_id in reversed(runs):
        lease = await store.acquire_lease(session_id, run_id, ttl)
        if lease is not None:
            await store.release_lease(lease)
            log.info("session %s: took the lease over from stalled run %s", session_id, run_id)
            return run_id
    return None

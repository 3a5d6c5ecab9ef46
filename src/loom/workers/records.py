"""Where a queued job's record lives: the task name and the key-value namespace of job records.

``loom.workers.app`` (the procrastinate app) and ``loom.workers.tasks`` (the turn a job runs)
both read these; they live apart from both so that neither imports the other at module level.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from loom.errors import ConfigurationError

if TYPE_CHECKING:
    from loom.store.base import KVStore, Store

__all__ = ["JOB_NAMESPACE", "RUN_TASK", "kv_of"]

RUN_TASK = "loom.run_turn"
"""The procrastinate task name of a queued turn."""

JOB_NAMESPACE = "loom.jobs"
"""Key-value namespace (``Store.put_value``) of each job's runs and final state, by job id."""


def kv_of(store: Store) -> KVStore:
    """The store's key-value half, where job records live (PostgresStore has it)."""
    if not callable(getattr(store, "put_value", None)):
        raise ConfigurationError(f"{type(store).__name__} keeps no key-value data; workers need it")
    return cast("KVStore", store)

"""Forgetting an owner: one operation that deletes everything an API key's principal has
(issue #29, "Forgetting"), for ``loom keys forget NAME`` and ``DELETE /admin/principals/{name}``.

What an owner has, and what :func:`forget_owner` deletes:

- **sessions**: those its key owns (``loom.server.ownership``: the ``loom.server.thread_owner``
  key-values, which name schedule-run sessions too), those stored under its namespaced ids
  (``<name>~...``) and the ones derived from them (a crew member's ``<session>:<crew>/...``),
  each with ``delete_session``: messages, events, runs, tool-call ledger, stored errors and
  results, branches' rows; forks are deleted before the session they were forked from. A session
  a run holds (its lease is taken) is left alone and named in ``busy``; one that a session of
  another owner was forked from (they share its rows) is left and named in ``shared``.
- **media**: the bytes that only its sessions named go with them; bytes a session of another
  owner also names are kept (counted in ``media_shared``).
- **memories**: every item it wrote (``ItemStore.delete_owner_items``, and with it whatever a
  store keeps per item, e.g. its vectors).
- **schedules and monitors** it created, with their runs and check-ins: a schedule left
  behind would go on running agents as the forgotten key and write new sessions for it.
- the **ownership records** of its sessions (session ids are data too).
- the **sandbox files** of its deleted sessions: workspace snapshots and private workspaces
  under the sandbox directory (``loom.sandbox.snapshots.drop_session_snapshots``; by default
  ``<store file>.sandboxes/``).

Then, on a store that can (``loom.store.erase.Eraser``), the deletes run with secure delete on
and the store is scrubbed, so the bytes are gone from the database's files, not only the rows.
What it does not reach: a run under way in another process (``busy``), A2A tasks and
assistants recorded by the server, logs, exports, backups, and on PostgreSQL the write-ahead
log until its segments are recycled.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loom.errors import InputError, StoreError
from loom.sandbox.snapshots import default_sandbox_dir, drop_session_snapshots
from loom.server.ownership import OWNER_NS, SCOPE_MARK, Owners
from loom.store.base import Lease, Store, capabilities_of
from loom.store.erase import Eraser

__all__ = ["Forgotten", "check_owner_name", "forget_owner", "owned_sessions"]

log = logging.getLogger("loom.server")

_LEASE_SECONDS = 300.0  # held while the session is deleted: no run of another process starts


@dataclass(slots=True)
class Forgotten:
    """What :func:`forget_owner` deleted for ``owner`` (counts), and what it had to leave."""

    owner: str
    sessions: int = 0
    items: int = 0
    media: int = 0
    schedules: int = 0
    monitors: int = 0
    ownership_records: int = 0
    media_shared: int = 0  # bytes the owner's sessions named that another session names too
    busy: list[str] = field(default_factory=list)  # sessions a run held: not deleted
    shared: list[str] = field(default_factory=list)  # sources of other owners' forks: kept
    scrubbed: bool = False  # the store made the deleted bytes unreadable in its files

    @property
    def deleted(self) -> int:
        """Everything deleted, in all (0: nothing of ``owner`` was stored)."""
        return (
            self.sessions
            + self.items
            + self.media
            + self.schedules
            + self.monitors
            + self.ownership_records
        )

    @property
    def complete(self) -> bool:
        """Nothing of the owner was left behind."""
        return not self.busy and not self.shared

    def to_dict(self) -> dict[str, Any]:
        """The JSON answer of ``DELETE /admin/principals/{name}`` and ``--json``."""
        return {
            "owner": self.owner,
            "deleted": {
                "sessions": self.sessions,
                "items": self.items,
                "media": self.media,
                "schedules": self.schedules,
                "monitors": self.monitors,
                "ownership_records": self.ownership_records,
            },
            "kept": {"busy": self.busy, "shared": self.shared, "media_shared": self.media_shared},
            "complete": self.complete,
            "scrubbed": self.scrubbed,
        }


def check_owner_name(name: Any) -> str:
    """``name`` if it can be a key's name (non-empty text, at most 64 characters), else
    ``InputError``."""
    if not isinstance(name, str) or not name.strip() or len(name) > 64:
        raise InputError(f"an API key's name is 1 to 64 characters of text, got {name!r}")
    return name


async def owned_sessions(store: Store, owner: str) -> tuple[list[str], list[str]]:
    """(the sessions ``owner`` has that exist, the session ids recorded as its in the ownership
    key-values). A session is the owner's when the ownership records say so, when its id is
    in the owner's namespace (``<owner>~``), or when it is derived from one of those
    (``<id>:...``)."""
    kv = capabilities_of(store).kv
    recorded: list[str] = []
    if kv is not None:
        for sid in await kv.list_keys(OWNER_NS):
            if await kv.get_value(OWNER_NS, sid) == owner:
                recorded.append(sid)
    mine = set(recorded)
    mark = owner + SCOPE_MARK
    existing = [i.id for i in await store.list_sessions(limit=0)]
    found = [
        sid
        for sid in existing
        if sid in mine
        or sid.startswith(mark)
        or any(sid.startswith(m + ":") for m in mine if ":" not in m)
    ]
    return found, recorded


async def forget_owner(
    store: Store,
    owner: str,
    *,
    owners: Owners | None = None,
    sandbox_dir: Path | None = None,
) -> Forgotten:
    """Delete everything ``owner`` (an API key's name) has in ``store`` (the module docstring
    says what), and scrub the store when it can. ``owners``: a running server's ownership
    cache, updated to match. ``sandbox_dir``: where sandboxes keep the sessions' snapshots
    (a runtime's ``sandbox_dir``); by default beside the store's file. An owner with nothing
    stored is no error: every count is 0."""
    owner = check_owner_name(owner)
    done = Forgotten(owner)
    if sandbox_dir is None:
        sandbox_dir = default_sandbox_dir(store)
    caps = capabilities_of(store)
    eraser = store if isinstance(store, Eraser) else None
    if eraser is not None:
        await eraser.secure_delete(True)
    try:
        await _forget_sessions(store, owner, done, sandbox_dir)
        if caps.items is not None:
            done.items = await caps.items.delete_owner_items(owner)
        if caps.schedules is not None:
            await _forget_schedules(store, owner, done)
        await _forget_ownership(store, owner, done, owners)
        if eraser is not None:
            done.scrubbed = await eraser.scrub()
            if not done.scrubbed:
                log.warning(
                    "forgetting %r: a reader kept the WAL from being truncated; deleted bytes "
                    "may stay in the -wal file until the next checkpoint",
                    owner,
                )
    finally:
        if eraser is not None:
            await eraser.secure_delete(False)
    return done


async def _forget_sessions(
    store: Store, owner: str, done: Forgotten, sandbox_dir: Path | None
) -> None:
    from loom.messages import new_id

    delete = getattr(store, "delete_session", None)
    if delete is None:
        raise StoreError(
            f"the store {store!r} cannot delete sessions (it has no delete_session); nothing "
            "was forgotten: use a store that can"
        )
    sessions, _ = await owned_sessions(store, owner)
    blobs = capabilities_of(store).blobs
    refs: set[str] = set()
    lock = new_id("forget")
    leases: dict[str, Lease] = {}
    for sid in sessions:
        lease = await store.acquire_lease(sid, lock, _LEASE_SECONDS)
        if lease is None:
            done.busy.append(sid)  # a run holds it: deleting under it would lose its writes
            continue
        if blobs is not None:
            refs.update(ref for ref, _, _ in await blobs.session_blobs(sid))
        leases[sid] = lease
    pending = list(leases)
    # Forks first: a session others were forked from cannot go while they live. Each pass
    # deletes what it can; what is left when a pass deletes nothing is another owner's source.
    while pending:
        left: list[str] = []
        for sid in pending:
            try:
                if await delete(sid):
                    done.sessions += 1
                drop_session_snapshots(sandbox_dir, sid)
            except InputError:
                left.append(sid)
        if len(left) == len(pending):
            done.shared.extend(left)
            break
        pending = left
    for sid in done.shared:  # kept: runs may use them again
        await store.release_lease(leases[sid])
    if blobs is not None and refs:
        still = await blobs.load_blobs(sorted(refs))
        done.media, done.media_shared = len(refs) - len(still), len(still)


async def _forget_schedules(store: Store, owner: str, done: Forgotten) -> None:
    from loom.errors import MonitorNotFound, ScheduleNotFound
    from loom.schedule.monitors import MonitorStore
    from loom.schedule.storage import ScheduleStore

    schedules = ScheduleStore(store)
    for state in await schedules.list_schedules(principal=owner, jobs=True, limit=0):
        try:
            await schedules.remove(state.schedule.id)
            done.schedules += 1
        except ScheduleNotFound:  # removed meanwhile
            continue
    monitors = MonitorStore(store)
    for m in await monitors.list_monitors(principal=owner):
        try:
            await monitors.remove(m.monitor.id)
            done.monitors += 1
        except MonitorNotFound:
            continue


async def _forget_ownership(
    store: Store, owner: str, done: Forgotten, owners: Owners | None
) -> None:
    """Drop the ownership records naming ``owner``, but those of sessions left behind (busy,
    shared): they stay the owner's until they are forgotten too."""
    kv = capabilities_of(store).kv
    if kv is None:
        return
    kept = set(done.busy) | set(done.shared)
    _, recorded = await owned_sessions(store, owner)
    for sid in recorded:
        if sid in kept:
            continue
        if await kv.delete_value(OWNER_NS, sid):
            done.ownership_records += 1
        if owners is not None and owners.owner.get(sid) == owner:
            del owners.owner[sid]

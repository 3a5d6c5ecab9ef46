"""The ``Store`` protocol: where sessions, messages, events and the tool-call ledger live.

Everything is append-only. One ``append`` call is one atomic commit: the loop commits a step
(a model response, tool-call starts, a tool result, a turn's end) and only then announces its
event. Backends: ``MemoryStore`` (default for the library), ``SQLiteStore`` (CLI, server).
"""

from __future__ import annotations

import contextlib
import secrets
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, runtime_checkable

from loom.content import Blob
from loom.errors import LeaseLost
from loom.events import AgentEvent, EventType
from loom.messages import Effect, Message, ToolResult, Usage, utcnow
from loom.store.items import Item
from loom.store.items_vectors import VectorItems

__all__ = [
    "Blob",
    "BlobStore",
    "BranchStore",
    "ErrorStore",
    "EventTypeStore",
    "ItemStore",
    "KVStore",
    "LatestEventStore",
    "Lease",
    "LedgerEntry",
    "LedgerStatus",
    "ResultStore",
    "RunRecord",
    "RunStore",
    "SessionInfo",
    "Store",
    "StoreCapabilities",
    "StoredError",
    "StoredResult",
    "TranscriptWindowStore",
    "capabilities_of",
    "new_error_id",
]

LedgerStatus = Literal["started", "completed", "failed", "interrupted"]


@dataclass(slots=True)
class SessionInfo:
    """A session's metadata. ``branches`` counts the rewinds its transcript had
    (``BranchStore.rewind``): a reader that kept the transcript reads it anew when it
    changed, since a branch rewrites messages it already holds."""

    id: str
    agent_name: str = ""
    created_at: datetime = field(default_factory=utcnow)
    updated_at: datetime = field(default_factory=utcnow)
    message_count: int = 0
    usage: Usage = field(default_factory=Usage)
    metadata: dict[str, Any] = field(default_factory=dict)
    branches: int = 0


@dataclass(slots=True)
class LedgerEntry:
    """One state change of one tool call, keyed by ``(run_id, tool_call_id)``.

    A call is written ``started`` before it runs and ``completed`` / ``failed`` /
    ``interrupted`` (with its result) when it ends. A call whose last entry is ``started``
    was in flight when the process died.
    """

    run_id: str
    session_id: str
    tool_call_id: str
    name: str
    status: LedgerStatus
    arguments: dict[str, Any] = field(default_factory=dict)
    effect: Effect = "at_most_once"
    result: ToolResult | None = None
    timestamp: datetime = field(default_factory=utcnow)

    def ended(self, status: LedgerStatus, result: ToolResult | None) -> LedgerEntry:
        """The entry that closes this call with ``status`` and ``result``."""
        return LedgerEntry(
            self.run_id,
            self.session_id,
            self.tool_call_id,
            self.name,
            status,
            self.arguments,
            self.effect,
            result,
        )


@dataclass(slots=True)
class RunRecord:
    """A turn's start (``status="running"``) or end (``status`` = its stop reason)."""

    run_id: str
    session_id: str
    status: str
    usage: Usage = field(default_factory=Usage)
    timestamp: datetime = field(default_factory=utcnow)
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Lease:
    """The right to write one session's journal, held by one run until ``expires_at``.

    Fencing: ``token`` strictly increases every time the session's lease changes hands (and is
    never reused, even after a release), and ``Store.append(..., lease=lease)`` checks it in the
    same transaction as the write. A holder that was paused past its expiry and taken over
    therefore cannot write any more, while a holder whose lease expired but was not taken over
    still can (the token is what counts, not the clock).
    """

    session_id: str
    run_id: str
    token: int
    expires_at: float  # time.time() seconds


@runtime_checkable
class Store(Protocol):
    """What a persistence backend provides. Run ``loom.store.conformance`` against yours."""

    async def get_session(self, session_id: str) -> SessionInfo | None:
        """The session's metadata, or None when it does not exist."""
        ...

    async def create_session(
        self, session_id: str, *, agent_name: str = "", metadata: dict[str, Any] | None = None
    ) -> SessionInfo:
        """Create a session; return the existing one if the id is taken (naming it
        ``agent_name`` when it has no agent name yet: a thread made before its first run)."""
        ...

    async def list_sessions(self, limit: int = 100) -> list[SessionInfo]:
        """Most recently updated first."""
        ...

    async def load_messages(self, session_id: str, start: int = 0) -> list[Message]:
        """The session's transcript from position ``start`` (0-based) on, oldest first.

        An index range read: the cost depends on the messages returned, not on the session's
        length. ``start`` past the end gives ``[]``; a negative ``start`` is an ``InputError``.
        """
        ...

    async def message_count(self, session_id: str) -> int:
        """How many messages the session's transcript holds (0 for an unknown session)."""
        ...

    async def append(
        self,
        session_id: str,
        *,
        messages: Sequence[Message] = (),
        events: Sequence[AgentEvent] = (),
        ledger: Sequence[LedgerEntry] = (),
        run: RunRecord | None = None,
        lease: Lease | None = None,
    ) -> None:
        """Commit all of it atomically, or raise ``StoreError`` and commit none of it.

        With ``lease``, the same transaction checks that ``lease.token`` is still the session's
        current lease token and raises ``LeaseLost`` (committing nothing) when it is not. An
        expired lease that nobody took over still writes. ``lease=None`` writes unchecked (for
        tooling and tests). Every value goes through ``loom.store.codec``: one that cannot be
        stored raises ``SerializationError`` before anything is committed.
        """
        ...

    async def open_tool_calls(self, session_id: str) -> list[LedgerEntry]:
        """Ledger entries whose call started and never ended, oldest first."""
        ...

    async def load_events(self, session_id: str, run_id: str | None = None) -> list[AgentEvent]:
        """Journaled events in the order they were emitted."""
        ...

    async def acquire_lease(self, session_id: str, run_id: str, ttl: float) -> Lease | None:
        """Take the session's lease for ``ttl`` seconds, or None while another holder has it.

        A lease is held until it expires or is released (``SQLiteStore`` also treats a holder
        whose process died as gone). Every successful acquire returns a new token, one more
        than the session's last, so earlier holders are fenced off.
        """
        ...

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        """Extend the lease to now + ``ttl``; ``LeaseLost`` if it changed hands or was released."""
        ...

    async def release_lease(self, lease: Lease) -> None:
        """Give the lease up; no effect if ``lease`` no longer holds it."""
        ...

    async def close(self) -> None:
        """Release connections and files."""
        ...


# -- optional capabilities -------------------------------------------------------------------
# A store implements any of these next to ``Store``; ``capabilities_of`` checks them once per
# store (``isinstance`` against the Protocols) and Loom turns the matching feature on: the error
# channel, large results, crash recovery of whole runs, key-values, bounded reads at resume.


def new_error_id(now: datetime | None = None) -> str:
    """``err_YYYYMMDD_HHMMSS_<6 hex>`` (seed 001): sortable by time, 24 random bits."""
    return f"err_{(now or utcnow()).strftime('%Y%m%d_%H%M%S')}_{secrets.token_hex(3)}"


@dataclass(slots=True)
class StoredError:
    """A tool failure kept in full; the model sees ``short_summary`` and ``id`` (seed 001)."""

    id: str
    session_id: str
    tool_name: str
    raw_error: dict[str, Any]
    short_summary: str
    timestamp: datetime = field(default_factory=utcnow)
    run_id: str = ""
    tool_call_id: str = ""


@dataclass(slots=True)
class StoredResult:
    """A tool result too large to send whole; the model pages through it by ``ref``."""

    ref: str
    session_id: str
    tool_name: str
    content: str
    run_id: str = ""
    tool_call_id: str = ""
    created_at: datetime = field(default_factory=utcnow)


@runtime_checkable
class ErrorStore(Protocol):
    """The Error Submission Channel's storage (seed 001). Queries must be parameterised."""

    async def save_error(self, error: StoredError) -> str:
        """Store ``error`` under ``error.id``; return the id. Raise ``StoreError`` on failure."""
        ...

    async def get_error(self, error_id: str) -> StoredError | None:
        """The error, or None when no error has that id."""
        ...

    async def list_errors(
        self,
        *,
        session_id: str | None = None,
        tool_name: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
    ) -> list[StoredError]:
        """Errors matching every given filter, newest first; ``limit`` 0 means no limit."""
        ...

    async def delete_errors(self, older_than: datetime) -> int:
        """Delete errors stored before ``older_than``; return how many."""
        ...


@runtime_checkable
class ResultStore(Protocol):
    """Storage for large tool results (seed 001 ``get_tool_result``)."""

    async def save_result(self, result: StoredResult) -> str:
        """Store the result under ``result.ref``; return the ref."""
        ...

    async def get_result(self, ref: str) -> StoredResult | None:
        """The stored result, or None."""
        ...


@runtime_checkable
class RunStore(Protocol):
    """Lets crash recovery find runs that started and never ended."""

    async def open_runs(self, session_id: str) -> list[RunRecord]:
        """``running`` records without a later end record for the same run, oldest first."""
        ...


@runtime_checkable
class EventTypeStore(Protocol):
    """Reads a session's events of some types without the rest of its journal (an index on
    them), so that what a turn looks up at INTAKE does not grow with the session."""

    async def load_events_of_type(
        self, session_id: str, types: Sequence[EventType]
    ) -> list[AgentEvent]:
        """The session's events whose type is in ``types``, in journal order."""
        ...


@runtime_checkable
class TranscriptWindowStore(Protocol):
    """Reads the part of a transcript a turn's context needs without the rest of it: a range
    of positions, and the system messages (Loom's memory entries: summaries, Kernel keys,
    flush markers) through an index of their own. With both, resuming a long session reads
    its memory tiers and its recent tail (``loom.memory.window``), not its whole history."""

    async def load_message_range(self, session_id: str, start: int, stop: int) -> list[Message]:
        """The transcript's messages at positions ``start`` <= position < ``stop``, oldest
        first (an index range read; ``InputError`` for a negative ``start``)."""
        ...

    async def load_system_messages(self, session_id: str) -> list[tuple[int, Message]]:
        """The transcript's ``system`` messages with their positions, oldest first."""
        ...


@runtime_checkable
class LatestEventStore(Protocol):
    """Reads the newest events of some types, walking the journal back from its end, so that a
    question about the session's current state (a query waiting for an answer, the calls
    parked for approval) costs what the newest exchange holds, not the whole journal."""

    async def load_latest_events(
        self, session_id: str, types: Sequence[EventType], limit: int
    ) -> list[AgentEvent]:
        """The newest ``limit`` events whose type is in ``types``, in journal order
        (``InputError`` for a ``limit`` below 1)."""
        ...


@runtime_checkable
class BlobStore(Protocol):
    """Keeps media bytes once, by content hash (``loom.content``): a message holds the
    reference (``"sha256:<hex>"``), the store the bytes. The journal puts a step's media before
    the step's messages, so a stored message never names bytes the store lacks; a session's
    media are deleted with it (bytes another session still names are kept)."""

    async def put_blobs(self, session_id: str, blobs: Sequence[Blob]) -> None:
        """Store ``blobs`` for ``session_id`` (bytes already held are not written again; the
        session is recorded as naming them)."""
        ...

    async def load_blobs(self, refs: Sequence[str]) -> dict[str, bytes]:
        """The bytes of each of ``refs`` the store holds (a missing one is absent)."""
        ...

    async def session_blobs(self, session_id: str) -> list[tuple[str, str, int]]:
        """The media ``session_id`` names, as (ref, media type, size in bytes), oldest first:
        what an export writes beside the transcript."""
        ...


@runtime_checkable
class BranchStore(Protocol):
    """Moves a session to another point of its history (``loom.engine.branching``). The
    journal is append-only: a ``SESSION_BRANCH`` event records the move, and the derived
    transcript (what ``load_messages`` reads) is rewritten to match ``transcript(events)``,
    in the same transaction."""

    async def rewind(
        self,
        session_id: str,
        at: int,
        *,
        messages: Sequence[Message],
        events: Sequence[AgentEvent],
        lease: Lease | None = None,
    ) -> None:
        """In one transaction: drop the transcript's messages at positions ``>= at``, append
        ``messages`` from position ``at`` and ``events`` to the journal, under ``lease`` as
        ``append`` does (``LeaseLost`` and nothing written when it is stale)."""
        ...

    async def ledger(self, session_id: str) -> list[LedgerEntry]:
        """Every tool call the session recorded (started, ended), oldest first: what a branch
        reads to know which dropped calls had effects."""
        ...

    async def fork(
        self,
        source_id: str,
        new_id: str,
        at: int,
        upto: int,
        *,
        messages: Sequence[Message],
        events: Sequence[AgentEvent],
        agent_name: str = "",
    ) -> None:
        """Create session ``new_id`` whose transcript starts with ``source_id``'s first ``at``
        messages and whose journal starts with its first ``upto`` events, shared with the
        source, not copied (a fork adds rows for its own branch only), then gains
        ``messages`` and ``events`` (its ``SESSION_BRANCH``). Every read of the new session
        (messages, ranges, system messages, events, counts) sees the shared part first.
        ``InputError`` when ``new_id`` exists or ``source_id`` has fewer messages or events."""
        ...


@runtime_checkable
class ItemStore(Protocol):
    """Memory across sessions: owned items in namespaces, searchable (``loom.store.items``).
    ``owner`` is the caller's principal (``None``: shared/admin code, which sees every item);
    an item of another owner is invisible to a caller and its key cannot be written by it
    (``ItemOwned``). Arguments are checked with ``loom.store.items``' checks."""

    async def put_item(
        self,
        namespace: Sequence[str],
        key: str,
        value: dict[str, Any],
        *,
        owner: str | None = None,
        ttl: float | None = None,
        index: bool | Sequence[str] | None = None,
    ) -> Item:
        """Write (insert or replace) an item; ``ttl`` seconds until it expires (None: never).
        ``index`` (``loom.store.items_vectors``): what is embedded for semantic search (None:
        the whole value; False: nothing; a list: those fields). Returns it as stored."""
        ...

    async def get_item(
        self, namespace: Sequence[str], key: str, *, owner: str | None = None
    ) -> Item | None:
        """The item, or None (absent, expired, or another owner's)."""
        ...

    async def delete_item(
        self, namespace: Sequence[str], key: str, *, owner: str | None = None
    ) -> bool:
        """Delete the item; False when there was none the caller could see."""
        ...

    async def search_items(
        self,
        prefix: Sequence[str],
        *,
        query: str | None = None,
        filter: dict[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        owner: str | None = None,
        mode: str | None = None,
    ) -> list[Item]:
        """Items under the namespace ``prefix`` whose value matches ``filter`` (top-level
        field equality) and, with a ``query``, best first, each with its ``score``: ``mode``
        ``"keyword"`` (its words), ``"semantic"`` (cosine similarity of embeddings) or
        ``"hybrid"`` (both, fused by rank); None: hybrid when the store has an embedder, else
        keyword (``loom.store.items_vectors``). Without a query, newest first."""
        ...

    async def list_namespaces(
        self,
        *,
        prefix: Sequence[str] = (),
        suffix: Sequence[str] = (),
        max_depth: int | None = None,
        limit: int = 100,
        offset: int = 0,
        owner: str | None = None,
    ) -> list[tuple[str, ...]]:
        """The namespaces holding items the caller can see, sorted, cut to ``max_depth``
        parts (deduplicated)."""
        ...

    async def delete_owner_items(self, owner: str) -> int:
        """Delete every item of ``owner`` (forgetting a user); how many there were."""
        ...

    async def purge_expired_items(self, now: datetime) -> int:
        """Delete every item whose expiry is at or before ``now`` (they are hidden from every
        read already; the scheduler's ``items`` job frees their rows); how many there were."""
        ...


@runtime_checkable
class KVStore(Protocol):
    """A small namespaced key-value store (memory tiers, pattern state, ...); values are JSON."""

    async def put_value(self, namespace: str, key: str, value: Any) -> None: ...

    async def get_value(self, namespace: str, key: str) -> Any | None: ...

    async def list_keys(self, namespace: str, prefix: str = "") -> list[str]: ...

    async def delete_value(self, namespace: str, key: str) -> bool: ...


Statement = tuple[str, Sequence[Any]]
"""One SQL statement with ``?`` placeholders and its parameters."""


@runtime_checkable
class ScheduleTables(Protocol):
    """SQL on the scheduling tables (``schedules``, ``schedule_runs``, ``monitors``,
    ``monitor_checkins``; ``loom.store.schedule_sql``), run by the store on its own connections.

    ``loom.schedule`` (``ScheduleStore``, ``MonitorStore``) is the only caller and owns what the
    statements say; the store owns connections, transactions, retries and error translation.
    Statements use ``?`` placeholders; every value is bound, never spliced. ``SQLiteStore`` and
    ``PostgresStore`` implement it (``store/sqlite_schedules.py``, ``store/postgres_schedules.py``).
    """

    async def schedule_rows(
        self, doing: str, sql: str, params: Sequence[Any] = ()
    ) -> list[Sequence[Any]]:
        """The rows of one query; ``doing`` (e.g. ``"listing schedules"``) names the step in a
        ``StoreError``."""
        ...

    async def schedule_execute(self, doing: str, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement in its own transaction; return how many rows it changed. Not
        re-sent after a dropped connection (a conditional UPDATE is not idempotent)."""
        ...

    async def schedule_gated(self, doing: str, gate: Statement, then: Sequence[Statement]) -> bool:
        """In one transaction: ``gate`` (a conditional UPDATE), and only if it changed exactly
        one row, ``then``. True when it did; False (nothing written) when another process
        changed the row first. This is the claim that fires a tick once."""
        ...


@dataclass(frozen=True, slots=True)
class StoreCapabilities:
    """The optional capabilities one store has: each field is the store itself, or None."""

    errors: ErrorStore | None = None
    results: ResultStore | None = None
    runs: RunStore | None = None
    kv: KVStore | None = None
    typed_events: EventTypeStore | None = None
    schedules: ScheduleTables | None = None
    windows: TranscriptWindowStore | None = None
    latest_events: LatestEventStore | None = None
    blobs: BlobStore | None = None
    branches: BranchStore | None = None
    items: ItemStore | None = None
    vectors: VectorItems | None = None  # an ItemStore opened with an embedder


_capabilities: weakref.WeakKeyDictionary[Any, StoreCapabilities] = weakref.WeakKeyDictionary()


def capabilities_of(store: Store) -> StoreCapabilities:
    """Which optional capabilities ``store`` implements, checked once per store object.

    Use the returned fields instead of ``hasattr``: ``caps.errors`` is the store typed as an
    ``ErrorStore`` when it is one, else None.
    """
    try:
        return _capabilities[store]
    except (KeyError, TypeError):  # TypeError: not weak-referenceable (checked, not cached)
        pass
    caps = StoreCapabilities(
        errors=store if isinstance(store, ErrorStore) else None,
        results=store if isinstance(store, ResultStore) else None,
        runs=store if isinstance(store, RunStore) else None,
        kv=store if isinstance(store, KVStore) else None,
        typed_events=store if isinstance(store, EventTypeStore) else None,
        schedules=store if isinstance(store, ScheduleTables) else None,
        windows=store if isinstance(store, TranscriptWindowStore) else None,
        latest_events=store if isinstance(store, LatestEventStore) else None,
        blobs=store if isinstance(store, BlobStore) else None,
        branches=store if isinstance(store, BranchStore) else None,
        items=store if isinstance(store, ItemStore) else None,
        vectors=(
            store
            if isinstance(store, VectorItems) and isinstance(store, ItemStore) and store.embedder
            else None
        ),
    )
    with contextlib.suppress(TypeError):
        _capabilities[store] = caps
    return caps


def lease_lost(lease: Lease, row: Sequence[Any] | None) -> LeaseLost:
    """The ``LeaseLost`` for a stale ``lease``; ``row`` is the session's lock row as (token,
    released, holder run id), or None when none is recorded (shared by the SQL stores)."""
    if row is None:
        now = "no lease is recorded"
    elif row[0] == lease.token:
        now = "released"
    else:
        now = f"now held with token {row[0]} by run {row[2]!r}"
    return LeaseLost(
        f"run {lease.run_id!r} lost the lease of session {lease.session_id!r} (its token "
        f"{lease.token} is stale: {now}); another run took the session over, so nothing was "
        "written. Stop this run; the session's new holder carries on."
    )

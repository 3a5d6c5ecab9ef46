"""``MemoryStore``: the in-process store the library uses when no store is given.

It keeps what ``SQLiteStore`` keeps, encoded by the same ``loom.store.codec`` (JSON text),
and decodes it on every read: a value that cannot be stored fails here exactly as it fails
on SQLite, and what a test reads back is what production reads back. A commit is encoded
with two ``to_json`` calls (its messages as one JSON array, its events' payloads and ledger
values as another) instead of one per row; a value that call refuses (or text with lone
surrogates, or a very deep value) takes the codec's per-row path, which scrubs or refuses it
exactly as SQLite does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import TypeAdapter
from pydantic_core import to_json

from loom.embedding.base import Embedder
from loom.errors import InputError, LeaseLost
from loom.events import AgentEvent, EventType
from loom.messages import Message, utcnow
from loom.store import codec
from loom.store.base import Blob, Lease, LedgerEntry, RunRecord, SessionInfo
from loom.store.items import Item
from loom.store.memory_items import MemoryItems

__all__ = ["MemoryStore"]


# A ledger entry as kept: its own row (the careful path), or its place in a commit's blob.
_Ledger = codec.LedgerRow | tuple[codec.PackedCommit, int]


class _SessionData:
    __slots__ = (
        "events",
        "info",
        "ledger",
        "message_count",
        "messages",
        "open_calls",
        "open_runs",
        "runs",
    )

    def __init__(self, info: SessionInfo) -> None:
        self.info = info
        # Each commit's messages as the text of one JSON array, with how many it holds.
        self.messages: list[tuple[int, str]] = []
        self.message_count = 0
        self.events: list[codec.EventRow | codec.PackedEvents] = []
        self.ledger: list[_Ledger] = []
        self.open_calls: dict[tuple[str, str], _Ledger] = {}
        self.runs: list[codec.RunRow] = []
        self.open_runs: dict[str, codec.RunRow] = {}


@dataclass(slots=True)
class _LeaseRow:
    """A session's lease; kept after release so that tokens keep increasing."""

    run_id: str
    token: int
    expires_at: float
    released: bool = False


def _check_lease(current: _LeaseRow | None, lease: Lease, session_id: str) -> None:
    if lease.session_id != session_id:
        raise LeaseLost(
            f"the lease of session {lease.session_id!r} cannot write to session {session_id!r}"
        )
    if current is None or current.token != lease.token or current.released:
        raise LeaseLost(_lost_message(lease, None if current is None else current.token))


def _lost_message(lease: Lease, token: int | None) -> str:
    now = "released" if token == lease.token else f"now held with token {token}"
    return (
        f"run {lease.run_id!r} lost the lease of session {lease.session_id!r} (its token "
        f"{lease.token} is stale: {now}); another run took the session over, so nothing was "
        "written. Stop this run; the session's new holder carries on."
    )


_MESSAGES: TypeAdapter[list[Message]] = TypeAdapter(list[Message])


def _encode_messages(messages: Sequence[Message]) -> str:
    """A commit's messages as one JSON array (each as ``codec.encode_message`` writes it)."""
    try:
        text = to_json([codec.message_dict(m) for m in messages], inf_nan_mode="constants")
    except (ValueError, RecursionError):  # PydanticSerializationError too: the careful path
        text = b""
    if not text or (
        len(text) >= 2 * codec.MAX_DEPTH and text.count(b"[") + text.count(b"{") >= codec.MAX_DEPTH
    ):
        return "[" + ",".join(codec.encode_message(m) for m in messages) + "]"
    return text.decode()


def _decode_range(data: _SessionData, start: int, stop: int | None) -> list[Message]:
    """Messages ``start`` to ``stop`` (None: the last) of a session, decoding only the commits
    that hold them (a commit's messages are one JSON array)."""
    end = data.message_count if stop is None else min(stop, data.message_count)
    if start >= end:
        return []
    skip, first = start, 0  # messages to drop from the chunk ``first``, where reading starts
    for count, _ in data.messages:
        if skip < count:
            break
        skip -= count
        first += 1
    parts, held = [], -skip
    for count, text in data.messages[first:]:
        parts.append(text[1:-1])
        held += count
        if held >= end - start:
            break
    return _MESSAGES.validate_json("[" + ",".join(parts) + "]")[skip : skip + end - start]


def _decode_ledger(session_id: str, row: _Ledger) -> LedgerEntry:
    if isinstance(row, codec.LedgerRow):
        return codec.decode_ledger(session_id, row)
    return codec.unpack_ledger(session_id, row[0], row[1])


class MemoryStore(MemoryItems):
    """Keeps everything in dictionaries; lost when the process exits. ``embedder`` turns on
    semantic and hybrid search of its items (``loom.store.items_vectors``)."""

    def __init__(self, *, embedder: Embedder | None = None) -> None:
        self._items: dict[tuple[tuple[str, ...], str], Item] = {}
        self._vectors = {}
        self._embedder = embedder
        self._maybe_pending = False
        self._sessions: dict[str, _SessionData] = {}
        self._leases: dict[str, _LeaseRow] = {}
        self._legacy_leases: dict[tuple[str, str], Lease] = {}
        # Media bytes once by reference, and the references each session names, in order.
        self._blobs: dict[str, tuple[str, bytes]] = {}
        self._session_blobs: dict[str, dict[str, None]] = {}

    async def get_session(self, session_id: str) -> SessionInfo | None:
        data = self._sessions.get(session_id)
        return replace(data.info) if data else None

    async def create_session(
        self, session_id: str, *, agent_name: str = "", metadata: dict[str, Any] | None = None
    ) -> SessionInfo:
        data = self._sessions.get(session_id)
        if data is None:
            # Through the codec as SQLite does: same refusals, same values read back.
            meta = codec.decode_value(codec.encode_value(metadata or {}, "session metadata"))
            data = self._sessions[session_id] = _SessionData(
                SessionInfo(id=session_id, agent_name=agent_name, metadata=meta)
            )
        elif agent_name and not data.info.agent_name:  # a thread made before its first run
            data.info.agent_name = agent_name
        return replace(data.info)

    async def list_sessions(self, limit: int = 100) -> list[SessionInfo]:
        infos = sorted((d.info for d in self._sessions.values()), key=lambda i: i.updated_at)
        return [replace(i) for i in infos[::-1][: limit if limit > 0 else None]]

    async def load_messages(self, session_id: str, start: int = 0) -> list[Message]:
        if start < 0:
            raise InputError(f"load_messages: start must be >= 0, got {start}")
        data = self._sessions.get(session_id)
        return _decode_range(data, start, None) if data else []

    async def message_count(self, session_id: str) -> int:
        data = self._sessions.get(session_id)
        return data.message_count if data else 0

    async def load_message_range(self, session_id: str, start: int, stop: int) -> list[Message]:
        if start < 0:
            raise InputError(f"load_message_range: start must be >= 0, got {start}")
        data = self._sessions.get(session_id)
        return _decode_range(data, start, max(start, stop)) if data else []

    async def load_system_messages(self, session_id: str) -> list[tuple[int, Message]]:
        data = self._sessions.get(session_id)
        if data is None:
            return []
        decoded = enumerate(_decode_range(data, 0, None))
        return [(pos, m) for pos, m in decoded if m.role == "system"]

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
        # Encode everything first: a refusal (SerializationError, LeaseLost) commits nothing.
        # A commit's messages are one JSON array, its events and ledger values one more
        # (two to_json calls a commit instead of one a row); anything unusual takes the
        # per-row path, which scrubs or refuses exactly what SQLite does.
        msg_text = _encode_messages(messages) if messages else None
        packed = codec.pack_commit(events, ledger) if events or ledger else None
        ev_rows: list[codec.EventRow | codec.PackedEvents] = []
        led_rows: list[_Ledger] = []
        if packed is not None:
            if packed.events is not None:
                ev_rows.append(packed.events)
            led_rows.extend((packed, i) for i in range(len(packed.ledger)))
        else:
            ev_rows.extend(codec.encode_event(e) for e in events)
            led_rows.extend(codec.encode_ledger(e) for e in ledger)
        run_row = codec.encode_run(run) if run is not None else None
        if lease is not None:
            _check_lease(self._leases.get(session_id), lease, session_id)
        data = self._sessions.get(session_id)
        if data is None:
            data = self._sessions[session_id] = _SessionData(SessionInfo(id=session_id))
        if msg_text is not None:
            data.messages.append((len(messages), msg_text))
            data.message_count += len(messages)
            data.info.message_count += len(messages)
        if ev_rows:
            data.events.extend(ev_rows)
        for i, row in enumerate(led_rows):
            data.ledger.append(row)
            entry = ledger[i]
            key = (entry.run_id, entry.tool_call_id)
            if entry.status == "started":
                data.open_calls[key] = row
            else:
                data.open_calls.pop(key, None)
        if run is not None and run_row is not None:
            data.runs.append(run_row)
            if run.status == "running":
                data.open_runs[run_row.run_id] = run_row
            else:
                data.open_runs.pop(run_row.run_id, None)
                data.info.usage = data.info.usage + run.usage
        if messages or run is not None:
            data.info.updated_at = utcnow()

    async def rewind(
        self,
        session_id: str,
        at: int,
        *,
        messages: Sequence[Message],
        events: Sequence[AgentEvent],
        lease: Lease | None = None,
    ) -> None:
        data = self._sessions.get(session_id)
        count = data.message_count if data is not None else 0
        if data is None or not 0 <= at <= count:
            raise InputError(
                f"rewind: session {session_id!r} has {count} messages; cannot keep {at}"
            )
        if lease is not None:
            _check_lease(self._leases.get(session_id), lease, session_id)
        # everything is encoded before anything changes: a refusal rewinds nothing
        if messages:
            _encode_messages(messages)
        if events:
            codec.pack_commit(events, ())
        kept = _decode_range(data, 0, at)
        data.messages = [(len(kept), _encode_messages(kept))] if kept else []
        data.message_count = data.info.message_count = at
        data.info.branches += 1
        await self.append(session_id, messages=messages, events=events, lease=lease)

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
        """As ``BranchStore.fork``; in memory the shared part is copied (the SQL stores share
        it: a fork adds rows for its own branch only)."""
        src = self._sessions.get(source_id)
        if src is None:
            raise InputError(f"fork: no session {source_id!r}")
        if new_id in self._sessions:
            raise InputError(f"fork: session {new_id!r} exists; give a new id")
        journal = await self.load_events(source_id)
        if not 0 <= at <= src.message_count or not 0 <= upto <= len(journal):
            raise InputError(
                f"fork: session {source_id!r} has {src.message_count} messages and "
                f"{len(journal)} events; cannot share {at} and {upto}"
            )
        if messages:
            _encode_messages(messages)  # a refusal creates nothing
        kept = _decode_range(src, 0, at)
        answered = {m.tool_call_id for m in kept if m.role == "tool"}
        ledger = [
            replace(e, session_id=new_id)
            for e in await self.ledger(source_id)
            if e.tool_call_id in answered
        ]
        info = SessionInfo(id=new_id, agent_name=agent_name or src.info.agent_name)
        data = self._sessions[new_id] = _SessionData(info)
        if kept:
            data.messages = [(len(kept), _encode_messages(kept))]
            data.message_count = data.info.message_count = at
        data.events = [codec.encode_event(e) for e in journal[:upto]]
        # the media the shared messages may name stay named while the fork lives
        self._session_blobs[new_id] = dict(self._session_blobs.get(source_id, {}))
        await self.append(new_id, messages=messages, events=events, ledger=ledger)

    async def open_tool_calls(self, session_id: str) -> list[LedgerEntry]:
        data = self._sessions.get(session_id)
        if data is None:
            return []
        return [_decode_ledger(session_id, r) for r in data.open_calls.values()]

    async def open_runs(self, session_id: str) -> list[RunRecord]:
        """Runs that started and never ended (``RunStore`` capability)."""
        data = self._sessions.get(session_id)
        if data is None:
            return []
        return [codec.decode_run(session_id, r) for r in data.open_runs.values()]

    async def ledger(self, session_id: str) -> list[LedgerEntry]:
        """Every ledger entry of the session, oldest first (as ``SQLiteStore.ledger``)."""
        data = self._sessions.get(session_id)
        return [_decode_ledger(session_id, r) for r in data.ledger] if data else []

    async def list_runs(self, session_id: str) -> list[RunRecord]:
        """Every run record (starts and ends), oldest first (as ``SQLiteStore.list_runs``)."""
        data = self._sessions.get(session_id)
        return [codec.decode_run(session_id, r) for r in data.runs] if data else []

    async def load_events(self, session_id: str, run_id: str | None = None) -> list[AgentEvent]:
        data = self._sessions.get(session_id)
        if data is None:
            return []
        out: list[AgentEvent] = []
        for r in data.events:
            if isinstance(r, codec.PackedEvents):
                out.extend(codec.unpack_events(session_id, r, run_id))
            elif run_id is None or r.run_id == run_id:
                out.append(codec.decode_event(session_id, r))
        return out

    async def load_events_of_type(
        self, session_id: str, types: Sequence[EventType]
    ) -> list[AgentEvent]:
        """The session's events whose type is in ``types``, in journal order."""
        wanted = frozenset(types)
        return [e for e in await self.load_events(session_id) if e.type in wanted]

    async def load_latest_events(
        self, session_id: str, types: Sequence[EventType], limit: int
    ) -> list[AgentEvent]:
        """The newest ``limit`` events whose type is in ``types``, in journal order."""
        if limit < 1:
            raise InputError(f"load_latest_events: limit must be >= 1, got {limit}")
        return (await self.load_events_of_type(session_id, types))[-limit:]

    # -- leases ---------------------------------------------------------------------------------
    async def acquire_lease(self, session_id: str, run_id: str, ttl: float) -> Lease | None:
        now = time.time()
        held = self._leases.get(session_id)
        if (
            held is not None
            and not held.released
            and held.expires_at > now
            and held.run_id != run_id
        ):
            return None
        token = held.token + 1 if held is not None else 1
        self._leases[session_id] = _LeaseRow(run_id, token, now + ttl)
        return Lease(session_id, run_id, token, now + ttl)

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        held = self._leases.get(lease.session_id)
        _check_lease(held, lease, lease.session_id)
        assert held is not None  # _check_lease raised otherwise
        held.expires_at = time.time() + ttl
        return replace(lease, expires_at=held.expires_at)

    async def release_lease(self, lease: Lease) -> None:
        held = self._leases.get(lease.session_id)
        if held is not None and held.token == lease.token:
            held.released = True

    async def delete_session(self, session_id: str) -> bool:
        """Forget a session (its lease row stays, released, so tokens keep increasing);
        False when there was no such session."""
        held = self._leases.get(session_id)
        if held is not None:
            held.released = True
        named = self._session_blobs.pop(session_id, {})
        still = {ref for refs in self._session_blobs.values() for ref in refs}
        for ref in named:
            if ref not in still:
                del self._blobs[ref]
        return self._sessions.pop(session_id, None) is not None

    async def put_blobs(self, session_id: str, blobs: Sequence[Blob]) -> None:
        checked = codec.check_blobs(blobs)  # as the SQL stores: size and hash, before writing
        named = self._session_blobs.setdefault(session_id, {})
        for blob in checked:
            self._blobs.setdefault(blob.ref, (blob.media_type, blob.data))
            named[blob.ref] = None

    async def load_blobs(self, refs: Sequence[str]) -> dict[str, bytes]:
        return {ref: self._blobs[ref][1] for ref in refs if ref in self._blobs}

    async def session_blobs(self, session_id: str) -> list[tuple[str, str, int]]:
        return [
            (ref, self._blobs[ref][0], len(self._blobs[ref][1]))
            for ref in self._session_blobs.get(session_id, {})
            if ref in self._blobs
        ]

    async def blob_usage(self) -> tuple[int, int]:
        """How many media the store holds and their bytes in all (each stored once)."""
        return len(self._blobs), sum(len(data) for _, data in self._blobs.values())

    async def close(self) -> None:
        return None

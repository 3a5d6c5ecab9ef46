"""``MemoryStore``: the in-process store the library uses when no store is given."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from loom.events import AgentEvent
from loom.messages import Message, utcnow
from loom.store.base import LedgerEntry, RunRecord, SessionInfo

__all__ = ["MemoryStore"]


class _SessionData:
    __slots__ = ("events", "info", "ledger", "messages", "open_calls", "open_runs", "runs")

    def __init__(self, info: SessionInfo) -> None:
        self.info = info
        self.messages: list[Message] = []
        self.events: list[AgentEvent] = []
        self.ledger: list[LedgerEntry] = []
        self.open_calls: dict[tuple[str, str], LedgerEntry] = {}
        self.runs: list[RunRecord] = []
        self.open_runs: dict[str, RunRecord] = {}


class MemoryStore:
    """Keeps everything in dictionaries; lost when the process exits."""

    def __init__(self) -> None:
        self._sessions: dict[str, _SessionData] = {}
        self._locks: dict[str, tuple[str, float]] = {}

    async def get_session(self, session_id: str) -> SessionInfo | None:
        data = self._sessions.get(session_id)
        return data.info if data else None

    async def create_session(
        self, session_id: str, *, agent_name: str = "", metadata: dict[str, Any] | None = None
    ) -> SessionInfo:
        data = self._sessions.get(session_id)
        if data is None:
            data = self._sessions[session_id] = _SessionData(
                SessionInfo(id=session_id, agent_name=agent_name, metadata=dict(metadata or {}))
            )
        return data.info

    async def list_sessions(self, limit: int = 100) -> list[SessionInfo]:
        infos = sorted((d.info for d in self._sessions.values()), key=lambda i: i.updated_at)
        return infos[::-1][:limit]

    async def load_messages(self, session_id: str) -> list[Message]:
        data = self._sessions.get(session_id)
        return list(data.messages) if data else []

    async def append(
        self,
        session_id: str,
        *,
        messages: Sequence[Message] = (),
        events: Sequence[AgentEvent] = (),
        ledger: Sequence[LedgerEntry] = (),
        run: RunRecord | None = None,
    ) -> None:
        data = self._sessions.get(session_id)
        if data is None:
            data = self._sessions[session_id] = _SessionData(SessionInfo(id=session_id))
        if messages:
            data.messages.extend(messages)
            data.info.message_count += len(messages)
        if events:
            data.events.extend(events)
        for entry in ledger:
            data.ledger.append(entry)
            key = (entry.run_id, entry.tool_call_id)
            if entry.status == "started":
                data.open_calls[key] = entry
            else:
                data.open_calls.pop(key, None)
        if run is not None:
            data.runs.append(run)
            if run.status == "running":
                data.open_runs[run.run_id] = run
            else:
                data.open_runs.pop(run.run_id, None)
                data.info.usage = data.info.usage + run.usage
        if messages or run is not None:
            data.info.updated_at = utcnow()

    async def open_tool_calls(self, session_id: str) -> list[LedgerEntry]:
        data = self._sessions.get(session_id)
        return list(data.open_calls.values()) if data else []

    async def open_runs(self, session_id: str) -> list[RunRecord]:
        """Runs that started and never ended (``RunStore`` capability)."""
        data = self._sessions.get(session_id)
        return list(data.open_runs.values()) if data else []

    async def load_events(self, session_id: str, run_id: str | None = None) -> list[AgentEvent]:
        data = self._sessions.get(session_id)
        if data is None:
            return []
        return [e for e in data.events if run_id is None or e.run_id == run_id]

    async def acquire_lock(self, session_id: str, run_id: str, ttl: float) -> bool:
        now = time.monotonic()
        held = self._locks.get(session_id)
        if held is not None and held[1] > now and held[0] != run_id:
            return False
        self._locks[session_id] = (run_id, now + ttl)
        return True

    async def release_lock(self, session_id: str, run_id: str) -> None:
        held = self._locks.get(session_id)
        if held is not None and held[0] == run_id:
            del self._locks[session_id]

    async def delete_session(self, session_id: str) -> bool:
        """Forget a session and its lock; False when there was no such session."""
        self._locks.pop(session_id, None)
        return self._sessions.pop(session_id, None) is not None

    async def close(self) -> None:
        return None

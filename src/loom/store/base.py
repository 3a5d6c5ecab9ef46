"""The ``Store`` protocol: where sessions, messages, events and the tool-call ledger live.

Everything is append-only. One ``append`` call is one atomic commit: the loop commits a step
(a model response, tool-call starts, a tool result, a turn's end) and only then announces its
event. Backends: ``MemoryStore`` (default for the library), ``SQLiteStore`` (CLI, server).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, runtime_checkable

from loom.events import AgentEvent
from loom.messages import Message, ToolResult, Usage, utcnow
from loom.tools.base import Effect

__all__ = ["LedgerEntry", "LedgerStatus", "RunRecord", "SessionInfo", "Store"]

LedgerStatus = Literal["started", "completed", "failed", "interrupted"]


@dataclass(slots=True)
class SessionInfo:
    """A session's metadata."""

    id: str
    agent_name: str = ""
    created_at: datetime = field(default_factory=utcnow)
    updated_at: datetime = field(default_factory=utcnow)
    message_count: int = 0
    usage: Usage = field(default_factory=Usage)
    metadata: dict[str, Any] = field(default_factory=dict)


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


@dataclass(slots=True)
class RunRecord:
    """A turn's start (``status="running"``) or end (``status`` = its stop reason)."""

    run_id: str
    session_id: str
    status: str
    usage: Usage = field(default_factory=Usage)
    timestamp: datetime = field(default_factory=utcnow)
    data: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Store(Protocol):
    """What a persistence backend provides. Run ``loom.store.conformance`` against yours."""

    async def get_session(self, session_id: str) -> SessionInfo | None:
        """The session's metadata, or None when it does not exist."""
        ...

    async def create_session(
        self, session_id: str, *, agent_name: str = "", metadata: dict[str, Any] | None = None
    ) -> SessionInfo:
        """Create a session; return the existing one if the id is taken."""
        ...

    async def list_sessions(self, limit: int = 100) -> list[SessionInfo]:
        """Most recently updated first."""
        ...

    async def load_messages(self, session_id: str) -> list[Message]:
        """The session's whole transcript, oldest first."""
        ...

    async def append(
        self,
        session_id: str,
        *,
        messages: Sequence[Message] = (),
        events: Sequence[AgentEvent] = (),
        ledger: Sequence[LedgerEntry] = (),
        run: RunRecord | None = None,
    ) -> None:
        """Commit all of it atomically, or raise ``StoreError`` and commit none of it."""
        ...

    async def open_tool_calls(self, session_id: str) -> list[LedgerEntry]:
        """Ledger entries whose call started and never ended, oldest first."""
        ...

    async def load_events(self, session_id: str, run_id: str | None = None) -> list[AgentEvent]:
        """Journaled events in the order they were emitted."""
        ...

    async def acquire_lock(self, session_id: str, run_id: str, ttl: float) -> bool:
        """Take the session's execution lock unless a live (unexpired) one is held."""
        ...

    async def release_lock(self, session_id: str, run_id: str) -> None:
        """Release the lock if ``run_id`` holds it."""
        ...

    async def close(self) -> None:
        """Release connections and files."""
        ...

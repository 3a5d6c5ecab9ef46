"""Who owns what a client can name, checked in one place every surface uses.

A server with API keys gives every record a client can name an owner: the name of the key that
made it. Sessions (LangGraph threads, OpenAI ``user`` sessions, Weave sessions, A2A contexts,
MCP ``session_id`` arguments) are owned through :class:`Owners`; a run, an approval and a stored
error belong to their session's owner; schedules and cron monitors carry their owner's name
(``Schedule.principal``, ``Monitor.principal``, a column of their tables), and a schedule's runs
and a monitor's check-ins are theirs; MCP session ids are bound to the key whose ``initialize``
created them; A2A tasks keep their owner in their record; assistants made with ``POST
/assistants`` keep theirs in their record (``loom.server.assistants``).

The rule is :func:`sees`: without keys, or with an ``admin`` key, everything is visible; any
other key sees only what its own name owns (a record without an owner, made before keys were
configured, is for admin keys). Every check ends in :func:`sees`, and what a key may not see
does not exist for it: it is answered exactly like a missing record (404), so no key learns
whether another key has an id.

Ids a client chooses are checked where they enter by :func:`check_client_id` (1 to
:data:`MAX_ID_LENGTH` printable characters, ``InputError``: 422) before anything runs, and go
into response headers only through :func:`header_value` (percent-encoded past printable ASCII).
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import quote

from pydantic import AfterValidator

from loom.engine.run_inputs import SESSION_OWNER_NAMESPACE
from loom.errors import InputError, MonitorNotFound, ScheduleNotFound, SessionNotFound

if TYPE_CHECKING:
    from loom.store.base import SessionInfo, Store, StoredError

__all__ = [
    "MAX_ID_LENGTH",
    "OWNER_NS",
    "SCOPE_MARK",
    "ClientId",
    "Kind",
    "McpSessions",
    "OwnedStore",
    "Owners",
    "Principal",
    "check_client_id",
    "client_session_id",
    "current_owners",
    "current_principal",
    "header_value",
    "owner_filter",
    "owner_name",
    "require",
    "scoped_session_id",
    "sees",
    "sees_session",
    "unscoped_session_id",
]

OWNER_NS = SESSION_OWNER_NAMESPACE  # the front door reads a session's owner there too
MAX_ID_LENGTH = 256

Kind = Literal[
    "session",
    "run",
    "approval",
    "error",
    "schedule",
    "monitor",
    "mcp_session",
    "a2a_task",
    "assistant",
]


@dataclass(frozen=True, slots=True)
class Principal:
    """One API key: its name, the SHA-256 digest of the key, the agents it may use (None: all)
    and whether it sees every thread (``admin``)."""

    name: str
    digest: bytes
    agents: frozenset[str] | None = None
    admin: bool = False

    def __repr__(self) -> str:  # never print the digest
        return f"Principal({self.name!r}, agents={sorted(self.agents or ()) or 'all'})"


current_principal: ContextVar[Principal | None] = ContextVar("loom_principal", default=None)
current_owners: ContextVar[Owners | None] = ContextVar("loom_owners", default=None)
"""The server's :class:`Owners` for the request being served (what :func:`scoped_session_id`
reads; set with ``current_principal`` by the HTTP middleware, the gRPC service and MCP)."""


# -- the rule -----------------------------------------------------------------------------------
def sees(principal: Principal | None, owner: str | None) -> bool:
    """May ``principal`` see a record owned by the key named ``owner``? The one ownership rule:
    no keys (``None``) and admin keys see everything; another key only its own records."""
    if principal is None or principal.admin:
        return True
    return owner == principal.name


def owner_name(principal: Principal | None) -> str | None:
    """The owner a record made by ``principal`` gets (``None`` without keys)."""
    return None if principal is None else principal.name


def owner_filter(principal: Principal | None) -> str | None:
    """What a listing keeps for ``principal``: ``None`` (everything) without keys or for an
    admin key, else the key's name (its own records only)."""
    return None if principal is None or principal.admin else principal.name


def _missing(kind: Kind, record_id: str) -> Exception:
    if kind == "schedule":
        return ScheduleNotFound(f"no schedule {record_id!r}", field="id")
    if kind == "monitor":
        return MonitorNotFound(f"no monitor {record_id!r}", field="monitor_id")
    what = {
        "session": "thread or session",
        "run": "run",
        "approval": "approval",
        "error": "error",
        "mcp_session": "MCP session",
        "a2a_task": "task",
        "assistant": "assistant",
    }[kind]
    return SessionNotFound(f"no {what} {record_id!r} for this API key")


def require(principal: Principal | None, kind: Kind, record_id: str, owner: str | None) -> None:
    """Raise the not-found error of ``kind`` (404, the answer for an id that does not exist)
    unless ``principal`` sees a record owned by ``owner``."""
    if not sees(principal, owner):
        raise _missing(kind, record_id)


# -- ids where they enter ------------------------------------------------------------------------
def check_client_id(value: str, what: str = "session id") -> str:
    """``value`` if it is usable as an id a client chose (1 to ``MAX_ID_LENGTH`` printable
    characters, not blank), else ``InputError`` (422) saying what is wrong."""
    if not isinstance(value, str):
        raise InputError(f"a {what} is text, got {type(value).__name__}")
    if not value.strip():
        raise InputError(f"a {what} cannot be empty or blank; leave it out for a new one")
    if len(value) > MAX_ID_LENGTH:
        raise InputError(
            f"a {what} is at most {MAX_ID_LENGTH} characters; this one has {len(value)}"
        )
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        raise InputError(
            f"a {what} holds printable characters only; this one holds {bad!r} "
            f"at position {value.index(bad)}"
        )
    return value


SCOPE_MARK = "~"


def scoped_session_id(value: str) -> str:
    """The stored id of the session a client names ``value``: session ids are namespaced per
    owner, so no key learns whether another key has an id, nor takes one before it.

    Without keys and for an admin key it is ``value``. For another key it is ``value`` when
    that key already owns ``value`` itself (an id the server generated for it, or one made
    before namespacing) or when ``value`` already starts with ``<key name>~`` (the stored
    form, as answers name it); otherwise ``<key name>~<value>``. Both the client's form and
    the stored form reach the same session, and so do ids derived from it (a crew member's
    ``<session>:<crew>/<member>``)."""
    p = current_principal.get()
    if p is None or p.admin:
        return value
    mark = p.name + SCOPE_MARK
    if value.startswith(mark):
        return value
    owners = current_owners.get()
    if owners is not None and owners.owner.get(value) == p.name:
        return value
    return mark + value


def unscoped_session_id(stored: str) -> str:
    """The id the current key calls its session ``stored`` by (the inverse of
    :func:`scoped_session_id` for that key's own sessions; anything else unchanged)."""
    p = current_principal.get()
    if p is None or p.admin:
        return stored
    return stored.removeprefix(p.name + SCOPE_MARK)


def client_session_id(value: str, what: str = "session id") -> str:
    """A session id a client sent, checked (:func:`check_client_id`) and namespaced to the
    current key (:func:`scoped_session_id`)."""
    return scoped_session_id(check_client_id(value, what))


def _checked_id(value: str) -> str:
    try:
        return client_session_id(value)
    except InputError as exc:
        raise ValueError(str(exc)) from None


ClientId = Annotated[str, AfterValidator(_checked_id)]
"""A session or thread id in a request body: checked by :func:`check_client_id` (422) and
namespaced to the request's key (:func:`scoped_session_id`)."""

_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")


def header_value(value: str) -> str:
    """``value`` as a response header can carry it: printable ASCII as is, anything else (and
    ``%``) percent-encoded as UTF-8 (``田中`` → ``%E7%94%B0%E4%B8%AD``)."""
    return quote(value, safe=_HEADER_SAFE)


# -- sessions -------------------------------------------------------------------------------------
class Owners:
    """Which key owns which session: in memory, written through to the store's KV space.

    An owner outlives its session: a deleted thread's id stays its key's, so a run found by
    id after its thread ended (a stateless run) is still only its key's."""

    def __init__(self, store: Store) -> None:
        from loom.store.base import capabilities_of

        self.store = store
        self.kv = capabilities_of(store).kv
        self.owner: dict[str, str] = {}
        self._loaded = False
        self._lock = asyncio.Lock()

    async def load(self) -> None:
        if self._loaded:
            return
        async with self._lock:
            if self._loaded or self.kv is None:
                self._loaded = True
                return
            for sid in await self.kv.list_keys(OWNER_NS):
                value = await self.kv.get_value(OWNER_NS, sid)
                if isinstance(value, str):
                    self.owner[sid] = value
            self._loaded = True

    async def claim(self, session_id: str, principal: Principal) -> None:
        """Record ``principal`` as the owner of ``session_id``."""
        await self.claim_for(session_id, principal.name)

    async def claim_for(self, session_id: str, owner: str) -> None:
        """Record the key named ``owner`` as the owner of ``session_id`` (a schedule's runs
        write their sessions for the schedule's key)."""
        self.owner[session_id] = owner
        if self.kv is not None:
            await self.kv.put_value(OWNER_NS, session_id, owner)

    async def owner_of(self, session_id: str) -> str | None:
        """The key that owns ``session_id`` (None: nobody yet). A miss reads the store, so an
        owner another server of the fleet recorded since this one loaded is found."""
        await self.load()
        owner = self.owner.get(session_id)
        if owner is None and self.kv is not None:
            value = await self.kv.get_value(OWNER_NS, session_id)
            if isinstance(value, str):
                self.owner[session_id] = owner = value
        return owner

    async def allowed(self, session_id: str, *, claim_new: bool = False) -> bool:
        """May the current key touch ``session_id``? A session nobody owns that does not exist
        yet is the current key's to create (claimed now when ``claim_new``); one that exists
        without an owner (made before keys were configured) is for admin keys only."""
        p = current_principal.get()
        if p is None or p.admin:
            return True
        owner = await self.owner_of(session_id)
        if owner is not None:
            return sees(p, owner)
        if await self.store.get_session(session_id) is not None:
            return sees(p, None)
        if claim_new:
            await self.claim(session_id, p)
        return True

    async def check(
        self, session_id: str, *, kind: Kind = "session", claim_new: bool = False
    ) -> None:
        """``SessionNotFound`` (404) unless the current key may touch ``session_id``."""
        if not await self.allowed(session_id, claim_new=claim_new):
            raise _missing(kind, session_id)


class OwnedStore:
    """The server's store, seen through the current key: another key's sessions do not exist.

    Session-scoped reads and writes check ownership; ``create_session`` and the first lease on a
    new session record the current key as the owner. Every other attribute is the inner store's
    (so its optional capabilities still show)."""

    def __init__(self, inner: Store, owners: Owners) -> None:
        self._inner, self._owners = inner, owners

    @property
    def owners(self) -> Owners:
        """Who owns which session (what every surface's ownership checks read)."""
        return self._owners

    @property
    def inner(self) -> Store:
        """The store beneath, unchecked: for a read the caller has authorized by other means
        (the console's case page reads the run of an experiment the key may see)."""
        return self._inner

    def __getattr__(self, name: str) -> Any:
        inner = getattr(self._inner, name)  # AttributeError: the inner store lacks it
        if name == "fork":  # the source is the key's; the new session becomes the key's
            return self._fork
        if name in ("rewind", "ledger"):  # BranchStore's session-scoped calls
            return partial(self._guarded, name)
        return inner

    async def _fork(self, source_id: str, new_id: str, *args: Any, **kw: Any) -> Any:
        await self._owners.check(source_id)
        await self._owners.check(new_id, claim_new=True)
        return await self._inner.fork(source_id, new_id, *args, **kw)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"OwnedStore({self._inner!r})"

    async def get_session(self, session_id: str) -> SessionInfo | None:
        info = await self._inner.get_session(session_id)
        if info is not None and not await self._owners.allowed(session_id):
            return None  # another key's: it does not exist for this one
        return info

    async def create_session(
        self, session_id: str, *, agent_name: str = "", metadata: dict[str, Any] | None = None
    ) -> SessionInfo:
        await self._owners.check(session_id)
        p = current_principal.get()
        if p is not None and session_id not in self._owners.owner:
            await self._owners.claim(session_id, p)
        return await self._inner.create_session(
            session_id, agent_name=agent_name, metadata=metadata
        )

    async def list_sessions(self, limit: int = 100) -> list[SessionInfo]:
        p = current_principal.get()
        if p is None or p.admin:
            return await self._inner.list_sessions(limit)
        await self._owners.load()
        mine = [
            i for i in await self._inner.list_sessions(0) if sees(p, self._owners.owner.get(i.id))
        ]
        return mine[:limit] if limit > 0 else mine

    async def _guarded(self, name: str, session_id: str, *args: Any, **kw: Any) -> Any:
        await self._owners.check(session_id)
        return await getattr(self._inner, name)(session_id, *args, **kw)

    async def load_messages(self, session_id: str, start: int = 0) -> Any:
        return await self._guarded("load_messages", session_id, start)

    async def message_count(self, session_id: str) -> int:
        n: int = await self._guarded("message_count", session_id)
        return n

    async def load_events(self, session_id: str, run_id: str | None = None) -> Any:
        return await self._guarded("load_events", session_id, run_id)

    async def open_tool_calls(self, session_id: str) -> Any:
        return await self._guarded("open_tool_calls", session_id)

    async def acquire_lease(self, session_id: str, run_id: str, ttl: float) -> Any:
        await self._owners.check(session_id, claim_new=True)
        return await self._inner.acquire_lease(session_id, run_id, ttl)

    async def open_runs(self, session_id: str) -> Any:
        return await self._guarded("open_runs", session_id)

    async def list_runs(self, session_id: str) -> Any:
        return await self._guarded("list_runs", session_id)

    async def delete_session(self, session_id: str) -> Any:
        # the owner stays recorded: the id (and runs found by id on it) remain this key's
        return await self._guarded("delete_session", session_id)

    async def get_error(self, error_id: str) -> StoredError | None:
        found: StoredError | None = await self._inner.get_error(error_id)  # type: ignore[attr-defined]
        if found is not None and not await self._owners.allowed(found.session_id):
            return None
        return found


async def sees_session(owners: Owners | None, session_id: str) -> bool:
    """May the current key see ``session_id`` and what hangs on it (a run, an approval, an
    error found by its own id)? A session nobody owns that is gone cannot be a key's."""
    p = current_principal.get()
    if owners is None or p is None or p.admin:
        return True
    owner = await owners.owner_of(session_id)
    if owner is None and await owners.store.get_session(session_id) is None:
        return False
    return sees(p, owner)


# -- MCP sessions ---------------------------------------------------------------------------------
class McpSessions:
    """Which key created which MCP session (``Mcp-Session-Id``): process-local, as the MCP
    sessions themselves. Another key's session id is answered as an unknown one (404)."""

    def __init__(self) -> None:
        self.owner: dict[str, str | None] = {}

    def bind(self, session_id: str, principal: Principal | None) -> None:
        self.owner.setdefault(session_id, owner_name(principal))

    def may_use(self, session_id: str, principal: Principal | None) -> bool:
        """False for another key's session; an id this process never bound goes on to the
        MCP SDK, which answers an unknown session itself."""
        if session_id not in self.owner:
            return True
        return sees(principal, self.owner[session_id])

    def forget(self, session_id: str) -> None:
        self.owner.pop(session_id, None)

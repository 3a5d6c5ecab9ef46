"""API keys, thread ownership, request limits and access logs for ``loom serve``.

Keys are bearer tokens held only as SHA-256 digests (a plain key is hashed when it is loaded).
With keys configured every endpoint but ``/healthz`` and ``/readyz`` needs one, sent as
``Authorization: Bearer <key>`` (OpenAI's SDK) or ``x-api-key: <key>`` (``langgraph-sdk``).
A key may be limited to some agents; each key owns the threads (sessions) it creates and never
sees another key's, unless it is an ``admin`` key. Who owns what, and the one rule every
surface checks, are in ``loom.server.ownership`` (its names are re-exported here); this
middleware applies it to ``/threads/{id}`` paths before the handler runs, and checks every id
a path names (``check_client_id``: 422) before anything runs.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loom.errors import InputError
from loom.server.hosts import HostPolicy
from loom.server.keys import ENV_KEYS, KeyRing, load_keys
from loom.server.ownership import (
    OwnedStore,
    Owners,
    Principal,
    check_client_id,
    current_owners,
    current_principal,
    scoped_session_id,
)
from loom.text import whole_number

if TYPE_CHECKING:
    from loom.server.state import ServerState

__all__ = [
    "ENV_KEYS",
    "AccessLogMiddleware",
    "BodyTooLarge",
    "GuardMiddleware",
    "KeyRing",
    "OwnedStore",
    "Owners",
    "Principal",
    "SecurityConfig",
    "current_principal",
    "is_loopback",
    "load_keys",
    "presented_key",
]

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/favicon.ico"})
access_log = logging.getLogger("loom.server.access")


def is_loopback(host: str) -> bool:
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class SecurityConfig:
    """What ``loom serve``'s security options set."""

    keys: KeyRing
    max_body: int = 1 << 20
    max_concurrent_runs: int = 16
    cors_origins: tuple[str, ...] = ()
    hosts: HostPolicy = field(default_factory=HostPolicy)  # Host / Origin (loom.server.hosts)


# -- middleware -------------------------------------------------------------------------------
def _error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> Any:
    from starlette.responses import JSONResponse

    body = {"error": {"type": kind, "message": message}}
    return JSONResponse(body, status_code=status, headers=headers)


class BodyTooLarge(HTTPException):
    """The request body is over the server's limit (413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            413, f"the request body is over this server's {limit} byte limit (--max-body)"
        )


_THREAD_PATH = re.compile(r"^/threads/([^/]+)(?:/|$)")
# a session a client names in a path: a LangGraph thread, a Weave session
_SESSION_PATH = re.compile(r"^/(threads|v1/sessions|console/sessions)/([^/]+)(?:/|$)")
# ids a client names in a path: threads and sessions it chose, runs, schedules, monitors
_PATH_ID = re.compile(r"^/(?:v1/|console/)?(threads|sessions|runs|crons|monitors)/([^/]+)(?:/|$)")
_RUN_PATHS = re.compile(
    r"^(?:/threads/[^/]+/runs(?:/stream|/wait)?|/threads/[^/]+/approvals/[^/]+"
    r"|/runs(?:/stream|/wait|/batch)?|/agents/[^/]+/runs.*"
    r"|/v1/chat/completions|/v1/responses|/v1/weave|/v1/weave:stream|/v1/weave:answer)$"
)


def starts_runs(method: str, path: str) -> bool:
    """Does this request start (or resume) a run? Those are refused while the server drains."""
    return method == "POST" and _RUN_PATHS.match(path) is not None


class GuardMiddleware:
    """Authentication, the body limit, thread ownership on ``/threads/{id}`` paths, and 503
    for new runs while the server drains."""

    def __init__(self, app: ASGIApp, state: ServerState, config: SecurityConfig) -> None:
        self.app, self.state, self.config = app, state, config
        self.owners: Owners | None = state.extra.get("owners")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        principal = None
        if self.config.keys:
            presented = presented_key(headers)
            if presented is None and (path == "/console" or path.startswith("/console/")):
                # a browser: the console's login cookie stands for the key (its own login form)
                from loom.server.console.auth import console_gate

                principal, refusal = console_gate(scope, headers, self.state, self.config.keys)
                if refusal is not None:
                    await refusal(scope, receive, send)
                    return
            elif presented is None:
                await _error(
                    401,
                    "Unauthorized",
                    "this server needs an API key: send Authorization: Bearer <key> "
                    "(or x-api-key: <key>)",
                    {"WWW-Authenticate": "Bearer"},
                )(scope, receive, send)
                return
            else:
                principal = self.config.keys.match(presented)
            if principal is None and presented is not None:
                await _error(
                    401,
                    "Unauthorized",
                    "the API key is not valid for this server; check the key you send",
                    {"WWW-Authenticate": 'Bearer error="invalid_token"'},
                )(scope, receive, send)
                return
            if principal is not None:
                scope["loom.principal"] = principal
        method: str = scope["method"]
        if self.state.draining and starts_runs(method, path):
            await _error(
                503,
                "ShuttingDown",
                "the server is shutting down and takes no new runs; retry against "
                "another instance or after it restarts",
                {"Retry-After": "5"},
            )(scope, receive, send)
            return
        limit = self.config.max_body
        length = headers.get("content-length")
        if length is not None and ((size := whole_number(length)) is None or size > limit):
            await _error(
                413,
                "PayloadTooLarge",
                f"the request body is over this server's {limit} byte limit (--max-body)",
            )(scope, receive, send)
            return
        named = _PATH_ID.match(path)
        if named is not None and named.group(2) not in ("search", "count"):
            try:  # an id is checked where it enters, before anything runs
                check_client_id(named.group(2), f"{named.group(1)[:-1]} id in the path")
            except InputError as exc:
                await _error(422, "InputError", str(exc))(scope, receive, send)
                return
        token = current_principal.set(principal)
        owners_token = current_owners.set(self.owners)
        try:
            if principal is not None and self.owners is not None:
                scope = await self._own_session_path(self.owners, scope)
                path = scope["path"]
                m = _THREAD_PATH.match(path)
                if (
                    m
                    and m.group(1) not in ("search", "count")
                    and not await self.owners.allowed(m.group(1))
                ):
                    await _error(
                        404,
                        "NotFound",
                        f"no thread {m.group(1)!r}; create it with POST /threads",
                    )(scope, receive, send)
                    return
            await self.app(scope, _limited(receive, limit), send)
        finally:
            current_owners.reset(owners_token)
            current_principal.reset(token)

    @staticmethod
    async def _own_session_path(owners: Owners, scope: Scope) -> Scope:
        """``scope`` with a session id in its path read as the key's own session (per-owner
        ids: ``<key>~<id>``), for HTTP requests and WebSocket handshakes alike."""
        await owners.load()  # scoped_session_id reads it without waiting
        path: str = scope["path"]
        session_path = _SESSION_PATH.match(path)
        if session_path is None or session_path.group(2) in ("search", "count"):
            return scope
        given = session_path.group(2)
        await owners.owner_of(given)  # known here if another server made it
        stored = scoped_session_id(given)
        if stored == given:
            return scope
        path = path[: session_path.start(2)] + stored + path[session_path.end(2) :]
        return {**scope, "path": path, "raw_path": quote(path).encode()}

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket handshake (thread streaming): the key, per-key session ids and thread
        checks of HTTP; a refused one is closed before it opens (the client sees HTTP 403)."""
        principal = None
        if self.config.keys:
            presented = presented_key(_headers(scope))
            principal = self.config.keys.match(presented) if presented is not None else None
            if principal is None:
                await send({"type": "websocket.close", "code": 1008})
                return
            scope["loom.principal"] = principal
        token = current_principal.set(principal)
        owners_token = current_owners.set(self.owners)
        try:
            if principal is not None and self.owners is not None:
                scope = await self._own_session_path(self.owners, scope)
            path: str = scope["path"]
            m = _THREAD_PATH.match(path)
            if m is not None:  # a stream of a thread that is not this key's (or none's) is refused
                thread = m.group(1)
                mine = self.owners is None or await self.owners.allowed(thread)
                if not mine or await self.state.runtime.store.get_session(thread) is None:
                    await send({"type": "websocket.close", "code": 1008})
                    return
            await self.app(scope, receive, send)
        finally:
            current_owners.reset(owners_token)
            current_principal.reset(token)


def _limited(receive: Receive, limit: int) -> Receive:
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge(limit)
        return message

    return wrapped


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def presented_key(headers: dict[str, str]) -> str | None:
    """The API key a request presents (``Authorization: Bearer`` or ``X-API-Key``; lower-case
    header names), None without one."""
    auth = headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    key = headers.get("x-api-key", "").strip()
    return key or None


_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class AccessLogMiddleware:
    """One JSON line per request on the ``loom.server.access`` logger: method, path, status,
    duration_ms, key, request_id (also answered in ``X-Request-ID``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        given = next(
            (v.decode("latin-1") for k, v in scope["headers"] if k.lower() == b"x-request-id"), ""
        )
        rid = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            if access_log.isEnabledFor(logging.INFO):
                p: Principal | None = scope.get("loom.principal")
                line = {
                    "ts": round(time.time(), 3),
                    "method": scope["method"],
                    "path": scope["path"],
                    "status": status,
                    "duration_ms": round((time.perf_counter() - started) * 1000, 2),
                    "key": p.name if p is not None else None,
                    "request_id": rid,
                    "client": (scope.get("client") or [None])[0],
                }
                access_log.info(json.dumps(line, separators=(",", ":")))


def env_keys() -> str | None:
    return os.environ.get(ENV_KEYS)

"""DNS-rebinding and cross-site protection: the ``Host`` and ``Origin`` of every request.

A web page on ``evil.example.com`` can make a browser talk to a server on the visitor's own
machine: it points its name at ``127.0.0.1`` (DNS rebinding), so the browser sends the page's
requests to ``loom serve`` with ``Host: evil.example.com``, or it posts across sites with
``Origin: http://evil.example.com``. Loom's default (loopback, no keys) is exactly what such a
page reaches, and agents may have tools like ``bash``, so every request (HTTP and WebSocket, on
every route) is checked before anything else runs:

* ``Host`` must be a loopback name (``127.0.0.1``, ``localhost``, ``::1``, any port), the
  IP address the connection arrived on (the ASGI ``server``: the bound address, or on
  ``0.0.0.0`` the interface's), or a name given with ``loom serve --allowed-host NAME``
  (``NAME`` matches any port, ``NAME:PORT`` that port only, ``*.example.com`` its subdomains,
  ``*`` every host). Otherwise the answer is 421 Misdirected Request.
* ``Origin``, when a browser sends one, must be a loopback origin, the request's own (validated)
  host, a ``--cors-origin``, or one given with ``--allowed-origin ORIGIN`` (``*`` for any).
  Otherwise the answer is 403. Clients that are not browsers send no ``Origin`` and pass.

gRPC is not covered: browsers cannot speak it, so a rebinding page cannot reach it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from loom.text import whole_number

__all__ = ["HostGuardMiddleware", "HostPolicy", "split_host"]

WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::", "[::]"})
"""Addresses that mean "every interface": they name no host a client could use."""


def split_host(value: str) -> tuple[str, int | None]:
    """``host[:port]`` (``[v6]:port`` for IPv6) as a lower-case host without brackets and a
    port (None when absent or not a number)."""
    value = value.strip().lower()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif value.count(":") == 1:
        host, _, port = value.partition(":")
    else:  # a bare IPv6 address (no port) or a plain name
        host, port = value, ""
    return host.rstrip("."), whole_number(port, max_digits=5)


def _loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class HostPolicy:
    """Which ``Host`` and ``Origin`` values a server answers (see the module docstring).

    ``hosts``: extra allowed names (``name``, ``name:port``, ``*.domain``, ``*``); loopback
    names and the bound address are always allowed. ``origins``: extra allowed browser origins
    (``scheme://host[:port]``, or ``*``); loopback origins and same-host ones always are.
    """

    hosts: tuple[str, ...] = ()
    origins: tuple[str, ...] = ()

    def host_allowed(self, header: str, bound: str | None = None) -> bool:
        """May a request with ``Host: header`` be served on a connection that arrived at the
        address ``bound``? (A rebinding page's request names the page's host, never that.)"""
        host, port = split_host(header)
        if not host:
            return False
        if _loopback(host):
            return True
        if bound is not None and bound not in WILDCARD_BINDS and split_host(bound)[0] == host:
            return True
        for entry in self.hosts:
            if entry == "*":
                return True
            name, want_port = split_host(entry)
            if want_port is not None and want_port != port:
                continue
            if name == host or (name.startswith("*.") and host.endswith(name[1:])):
                return True
        return False

    def origin_allowed(self, origin: str, host_header: str) -> bool:
        """May a browser page from ``origin`` call a server it reached as ``host_header``?"""
        if "*" in self.origins:
            return True
        parts = urlsplit(origin.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False  # "null" (sandboxed pages, file://) and anything odd
        if _loopback(split_host(parts.netloc)[0]):
            return True
        if parts.netloc.lower() == host_header.strip().lower():
            return True  # same origin: the page came from this (already checked) host
        wanted = origin.strip().rstrip("/").lower()
        return any(o.rstrip("/").lower() == wanted for o in self.origins)

    def with_origins(self, extra: Iterable[str]) -> HostPolicy:
        """This policy with ``extra`` origins allowed too (the ``--cors-origin`` ones)."""
        return HostPolicy(self.hosts, (*self.origins, *extra))


def _refuse(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status)


class HostGuardMiddleware:
    """Refuse requests whose ``Host`` (421) or ``Origin`` (403) the policy does not allow,
    before authentication, limits or any route runs."""

    def __init__(self, app: ASGIApp, policy: HostPolicy) -> None:
        self.app, self.policy = app, policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host, origin = "", None
        for key, value in scope["headers"]:
            if key == b"host":
                host = value.decode("latin-1")
            elif key == b"origin":
                origin = value.decode("latin-1")
        bound = (scope.get("server") or (None, None))[0]
        if not self.policy.host_allowed(host, bound):
            shown = host or "(none)"
            refusal = _refuse(
                421,
                "MisdirectedRequest",
                f"this server does not answer for the host {shown!r} (a guard against DNS "
                f"rebinding); if clients reach it by that name, start it with "
                f"`loom serve --allowed-host {split_host(host)[0] or 'NAME'}`",
            )
        elif origin is not None and not self.policy.origin_allowed(origin, host):
            refusal = _refuse(
                403,
                "ForbiddenOrigin",
                f"requests from web pages at {origin!r} are not allowed (a guard against "
                f"cross-site requests); to allow that page, start the server with "
                f"`loom serve --allowed-origin {origin}`",
            )
        else:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await refusal(scope, receive, send)

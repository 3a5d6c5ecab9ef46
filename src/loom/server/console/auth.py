"""The console's login cookie and CSRF tokens.

The console is protected by the server's API keys, like the API: a browser cannot send an
``Authorization`` header on a link, so the login form takes a key once and answers a cookie
(``HttpOnly``, ``SameSite=Strict``) that names the key and is signed with an HMAC of a server
secret (``LOOM_CONSOLE_SECRET``, else random per process: a restart logs everybody out). The
signature covers the key's digest too, so a key removed or changed under the same name voids its
cookies. Forms carry a CSRF token: an HMAC of a random per-browser seed (its own ``HttpOnly``,
``SameSite=Strict`` cookie) and the key's name, checked on every POST.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import time
from typing import TYPE_CHECKING, Any

from loom.text import whole_number

if TYPE_CHECKING:
    from starlette.types import Scope

    from loom.server.keys import KeyRing
    from loom.server.ownership import Principal
    from loom.server.state import ServerState

__all__ = [
    "COOKIE",
    "CSRF_COOKIE",
    "ENV_SECRET",
    "MAX_AGE",
    "console_gate",
    "csrf_ok",
    "csrf_token",
    "login_cookie",
    "principal_from_cookie",
    "secret_of",
]

COOKIE = "loom_console"
CSRF_COOKIE = "loom_console_csrf"
ENV_SECRET = "LOOM_CONSOLE_SECRET"
MAX_AGE = 12 * 3600
"""Seconds a login lasts."""
OPEN = ("/console/login", "/console/static/")


def secret_of(state: ServerState) -> bytes:
    """The server's signing secret: ``LOOM_CONSOLE_SECRET``, else random for this process."""
    secret = state.extra.get("console_secret")
    if secret is None:
        env = os.environ.get(ENV_SECRET)
        secret = state.extra["console_secret"] = (
            hashlib.sha256(env.encode()).digest() if env else secrets.token_bytes(32)
        )
    assert isinstance(secret, bytes)
    return secret


def _mac(secret: bytes, *parts: str) -> str:
    msg = "\x1f".join(parts).encode()
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def login_cookie(principal: Principal, secret: bytes, now: float | None = None) -> str:
    """The cookie value that logs ``principal`` in: its name, when, and the signature."""
    issued = str(int(now if now is not None else time.time()))
    name = base64.urlsafe_b64encode(principal.name.encode()).decode().rstrip("=")
    return (
        f"{name}.{issued}.{_mac(secret, 'login', principal.name, principal.digest.hex(), issued)}"
    )


def principal_from_cookie(
    value: str | None, keys: KeyRing, secret: bytes, now: float | None = None
) -> Principal | None:
    """The key a cookie logs in, or None when it is missing, forged, expired or its key is gone."""
    if not value or value.count(".") != 2:
        return None
    name_b64, issued, sig = value.split(".")
    try:
        name = base64.urlsafe_b64decode(name_b64 + "=" * (-len(name_b64) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        return None
    when = whole_number(issued)
    if when is None or (now or time.time()) - when > MAX_AGE:
        return None
    principal = next((p for p in keys.principals if p.name == name), None)
    if principal is None:
        return None
    expected = _mac(secret, "login", principal.name, principal.digest.hex(), issued)
    return principal if hmac.compare_digest(expected, sig) else None


def csrf_token(seed: str, principal: Principal | None, secret: bytes) -> str:
    """The token the console's forms carry for this browser (``seed``) and key."""
    return _mac(secret, "csrf", seed, principal.name if principal is not None else "")


def csrf_ok(
    given: str | None, seed: str | None, principal: Principal | None, secret: bytes
) -> bool:
    """Is ``given`` the form token for this browser and key? False when either is missing."""
    if not given or not seed:
        return False
    return hmac.compare_digest(given, csrf_token(seed, principal, secret))


def _cookies(headers: dict[str, str]) -> dict[str, str]:
    from http.cookies import SimpleCookie

    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except Exception:  # a malformed Cookie header is no login, not a 500
        return {}
    return {k: m.value for k, m in jar.items()}


def console_gate(
    scope: Scope, headers: dict[str, str], state: ServerState, keys: KeyRing
) -> tuple[Principal | None, Any]:
    """For a console request without an API key header on a server with keys: the key its
    cookie logs in, or the response that sends it to the login form (None for the login form
    and the static files, which are open)."""
    principal = principal_from_cookie(_cookies(headers).get(COOKIE), keys, secret_of(state))
    path: str = scope["path"]
    if principal is not None or path.startswith(OPEN):
        return principal, None
    from urllib.parse import quote

    from starlette.responses import RedirectResponse

    target = path + (f"?{scope['query_string'].decode('latin-1')}" if scope["query_string"] else "")
    return None, RedirectResponse(f"/console/login?next={quote(target, safe='')}", 303)

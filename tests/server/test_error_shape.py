"""Errors answered below the application (uvicorn's own 400, Starlette's CORS refusals, the
console's assets) have the JSON error shape every endpoint uses, against a real server."""

from __future__ import annotations

import json
import socket

import httpx
import pytest
from tests.server.conftest import Server


def raw(server: Server, data: bytes) -> tuple[bytes, dict[str, str], bytes]:
    """Send ``data`` as it is; (status line, headers, body) of the answer."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (x.decode().partition(":") for x in lines)
    }
    return status, headers, body


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
        b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header\r\n\r\n",
        b"POST /threads HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: abc\r\n\r\n",
        b"POST /threads HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: gzip\r\n\r\n",
    ],
    ids=["garbage", "no-host", "bad-header", "bad-length", "bad-encoding"],
)
def test_unparsable_http_gets_the_json_error_shape(server: Server, request_bytes: bytes) -> None:
    status, headers, body = raw(server, request_bytes)
    assert status.startswith(b"HTTP/1.1 400"), status
    assert headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    assert error["type"] == "BadRequest" and "not valid HTTP" in error["message"]


def test_a_missing_console_asset_is_the_consoles_404_page_not_plain_text(server: Server) -> None:
    """Under /console every error is the console's HTML error page (docs/console.md), which
    names what exists; never the bare text "not found"."""
    r = httpx.get(f"{server.url}/console/static/nope.css")
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
    assert "console.js" in r.text and "nope.css" in r.text

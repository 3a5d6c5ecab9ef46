"""web_fetch against a real HTTP server on loopback."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from loom.errors import ToolError
from loom.tools.base import RunContext
from loom.tools.builtin import web

PAGE = b"""<html><head><title>Loom  test</title><style>p{}</style></head>
<body><h1>Hello</h1><script>var secret = 1;</script><p>First &amp; second</p></body></html>"""


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/page":
            self._send(200, "text/html; charset=utf-8", PAGE)
        elif self.path == "/json":
            self._send(200, "application/json", b'{"a": 1}')
        elif self.path == "/big":
            self._send(200, "text/plain", b"x" * (web.MAX_BYTES + 500_000))
        elif self.path == "/bin":
            self._send(200, "image/png", b"\x89PNG....")
        elif self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/json")
            self.end_headers()
        elif self.path == "/loop":
            self.send_response(302)
            self.send_header("Location", "/loop")
            self.end_headers()
        else:
            self._send(404, "text/plain", b"nope")

    def _send(self, status: int, ctype: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def ctx() -> RunContext:
    return RunContext("s", "r", "c")


async def test_html_becomes_text(server: str) -> None:
    out = await web.web_fetch.fn(ctx(), url=f"{server}/page")
    assert "Title: Loom test" in out and "Hello" in out and "First & second" in out
    assert "secret" not in out and "p{}" not in out and "Status: 200" in out


async def test_json_redirect_and_cap(server: str) -> None:
    out = await web.web_fetch.fn(ctx(), url=f"{server}/redirect")
    assert out.endswith('{"a": 1}') and "/json" in out
    out = await web.web_fetch.fn(ctx(), url=f"{server}/big", max_chars=100)
    assert "max_chars=100" in out and "first 2 MB" in out


@pytest.mark.parametrize(
    ("path", "code"),
    [("/missing", "http_error"), ("/bin", "unsupported_content"), ("/loop", "http_error")],
)
async def test_errors_have_codes(server: str, path: str, code: str) -> None:
    with pytest.raises(ToolError) as info:
        await web.web_fetch.fn(ctx(), url=f"{server}{path}")
    assert info.value.code == code


async def test_only_http_urls() -> None:
    with pytest.raises(ToolError) as info:
        await web.web_fetch.fn(ctx(), url="file:///etc/passwd")
    assert info.value.code == "invalid_url"


async def test_connection_refused_is_a_tool_error() -> None:
    with pytest.raises(ToolError) as info:
        await web.web_fetch.fn(ctx(), url="http://127.0.0.1:9/")
    assert info.value.code == "http_error"

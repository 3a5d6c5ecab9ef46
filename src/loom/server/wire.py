"""What answers before the application does: uvicorn's HTTP protocol, with its one response of
its own (400 for a request that does not parse as HTTP) in the server's JSON error shape.

uvicorn answers such a request itself with ``text/plain`` "Invalid HTTP request received.";
every other error is the application's (``loom.server.app``), so without this a client would
meet two error formats.
"""

from __future__ import annotations

import asyncio
import json

__all__ = ["BAD_HTTP", "json_http_protocol"]

BAD_HTTP = json.dumps(
    {
        "error": {
            "type": "BadRequest",
            "message": "the request is not valid HTTP/1.1 (its request line, headers, "
            "Content-Length or chunked body do not parse); send a well-formed request",
        }
    },
    separators=(",", ":"),
).encode()


def json_http_protocol() -> type[asyncio.Protocol]:
    """uvicorn's default HTTP protocol class (httptools when installed, else h11), answering
    unparsable requests with the JSON error body. Pass it as ``uvicorn.Config(http=...)``."""
    from importlib.util import find_spec

    return _httptools() if find_spec("httptools") is not None else _h11()


def _h11() -> type[asyncio.Protocol]:
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class JSONH11Protocol(H11Protocol):
        def send_400_response(self, msg: str) -> None:
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(BAD_HTTP)).encode()),
                (b"connection", b"close"),
            ]
            for event in (
                h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                h11.Data(data=BAD_HTTP),
                h11.EndOfMessage(),
            ):
                try:
                    self.transport.write(self.conn.send(event) or b"")
                except h11.LocalProtocolError:  # a response was under way: just close
                    break
            self.transport.close()

    return JSONH11Protocol


def _httptools() -> type[asyncio.Protocol]:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class JSONHttpToolsProtocol(HttpToolsProtocol):
        def send_400_response(self, msg: str) -> None:
            head = [b"HTTP/1.1 400 Bad Request\r\n"]
            for name, value in self.server_state.default_headers:
                head.append(name + b": " + value + b"\r\n")
            head.append(b"content-type: application/json\r\n")
            head.append(b"content-length: " + str(len(BAD_HTTP)).encode() + b"\r\n")
            head.append(b"connection: close\r\n\r\n")
            self.transport.write(b"".join(head) + BAD_HTTP)
            self.transport.close()

    return JSONHttpToolsProtocol

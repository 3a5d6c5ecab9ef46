"""A stdio MCP server built with the official SDK whose tools return media: an image
(``ImageContent``) and an embedded PDF resource with a blob. python media_server.py"""

import base64
import struct
import zlib

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.utilities.types import Image
from mcp_types import BlobResourceContents, EmbeddedResource, TextContent

server = MCPServer("media")


def png(width: int, height: int) -> bytes:
    """A solid red PNG, written by hand so the server needs nothing but the SDK."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    row = b"\x00" + b"\xff\x00\x00" * width
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(row * height))
        + chunk(b"IEND", b"")
    )


PDF = b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n"


@server.tool()
def screenshot(width: int, height: int) -> list:
    """Take a screenshot of the given size."""
    return ["Screenshot taken:", Image(data=png(width, height), format="png")]


@server.tool()
def export_report() -> list:
    """Export the report as a PDF."""
    blob = base64.b64encode(PDF).decode()
    return [
        TextContent(type="text", text="Report exported."),
        EmbeddedResource(
            type="resource",
            resource=BlobResourceContents(
                uri="file:///reports/q3.pdf", mime_type="application/pdf", blob=blob
            ),
        ),
    ]


@server.tool()
def broken_image() -> list:
    """Return bytes that are not the image they claim to be."""
    return [Image(data=b"not a png at all", format="png")]


if __name__ == "__main__":
    server.run("stdio")

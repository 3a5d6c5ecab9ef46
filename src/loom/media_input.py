"""Media as a protocol names them, made Loom parts (``loom.content``): a file's bytes, an
``http(s)`` URL the model's provider fetches itself, or a ``data:`` URL, decoded here; anything
else is refused with a typed error that says what to send instead.

On the data floor, beside ``loom.content``, so that both the server's surfaces
(``loom.server.surface_media`` re-exports these names) and the tools that read another agent's
files (``loom.tools.a2a``) make parts the same way.
"""

from __future__ import annotations

import base64
import binascii
import mimetypes
from urllib.parse import unquote_to_bytes

from loom.content import MAX_MEDIA_BYTES, Audio, File, Image
from loom.errors import ContentError, MediaTooLarge, UnsupportedContent

__all__ = [
    "FETCHED_SCHEMES",
    "MediaKind",
    "decode_base64",
    "media_part",
    "parse_data_url",
]

FETCHED_SCHEMES = ("http://", "https://")
"""URL schemes passed through to the model's provider (it fetches them; Loom never does)."""


MediaKind = type[Image] | type[Audio] | type[File]
"""Which kind of medium a part is made as."""


def _kind(media_type: str) -> MediaKind:
    if media_type.startswith("image/"):
        return Image
    if media_type.startswith("audio/"):
        return Audio
    return File


def decode_base64(text: str, label: str) -> bytes:
    """``text``'s bytes (base64, standard or URL-safe alphabet), else ``ContentError``;
    ``MediaTooLarge`` before decoding what would be over the size limit."""
    cleaned = "".join(text.split())
    decoded_size = len(cleaned) * 3 // 4
    if decoded_size > MAX_MEDIA_BYTES:
        raise MediaTooLarge(
            f"{label} is about {decoded_size:,} bytes, over the {MAX_MEDIA_BYTES:,}-byte limit: "
            "send a smaller file (downscale the image, split the document) or a URL",
            size=decoded_size,
            limit=MAX_MEDIA_BYTES,
            part=label,
        )
    try:
        if "-" in cleaned or "_" in cleaned:
            return base64.urlsafe_b64decode(cleaned + "=" * (-len(cleaned) % 4))
        return base64.b64decode(cleaned + "=" * (-len(cleaned) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ContentError(
            f"{label}: its data is not valid base64; send the file's bytes base64-encoded",
            part=label,
        ) from None


def parse_data_url(url: str, label: str) -> tuple[bytes, str]:
    """A ``data:`` URL's bytes and media type (RFC 2397); ``ContentError`` for a malformed
    one."""
    head, comma, body = url.partition(",")
    if not url.startswith("data:") or not comma:
        raise ContentError(
            f"{label}: a malformed data URL (expected data:<media type>;base64,<data>)",
            part=label,
        )
    fields = head[5:].split(";")
    media_type = fields[0].strip().lower()
    if "base64" in (f.strip().lower() for f in fields[1:]):
        return decode_base64(body, label), media_type
    return unquote_to_bytes(body), media_type


def media_part(
    media_type: str | None,
    *,
    data: bytes | None = None,
    url: str | None = None,
    name: str | None = None,
    kind: MediaKind | None = None,
) -> Image | Audio | File:
    """The Loom part (``Image``, ``Audio`` or ``File``, by media type unless ``kind`` says)
    for a protocol's file: its bytes, or a URL. An ``http(s)`` URL is passed to the model's
    provider as it is; a ``data:`` URL's bytes are decoded here; any other scheme (``file:``,
    ``ftp:``, a provider's own handle) is ``UnsupportedContent``: Loom fetches nothing on a
    client's behalf. Bytes of no type said are typed from themselves or ``name``'s extension
    (``application/octet-stream`` when neither tells). Bad bytes: ``ContentError``."""
    media_type = (media_type or "").partition(";")[0].strip().lower()
    label = name or (f"a {media_type} part" if media_type else "a file part")
    if url is not None and data is None:
        if url.startswith("data:"):
            data, said = parse_data_url(url, label)
            media_type = media_type or said
        elif not url.lower().startswith(FETCHED_SCHEMES):
            scheme = url.partition(":")[0] if ":" in url else "(no scheme)"
            raise UnsupportedContent(
                f"{label}: a {scheme} URL is not one a model's provider can fetch, and Loom "
                "fetches nothing for a client; send the bytes instead, or an http(s) URL",
                part=label,
            )
    if data is not None and not media_type:
        from loom.content import sniff_media_type

        media_type = (
            sniff_media_type(data)
            or (mimetypes.guess_type(name)[0] if name else None)
            or "application/octet-stream"
        )
    if not media_type and url is not None:
        media_type = mimetypes.guess_type(url.split("?", 1)[0])[0] or ""
    cls = kind or _kind(media_type)
    if data is not None:  # a part's checks raise their own ContentError (loom.content)
        return cls(data=data, media_type=media_type, name=name or None)
    return cls(url=url, media_type=media_type, name=name or None)

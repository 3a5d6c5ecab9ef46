"""What the remote providers share to put media on the wire: their bytes as base64 or a data
URL, and the labels an error names them by. Each provider's own block shapes are in its
module (:mod:`loom.models.openai`, :mod:`loom.models.anthropic`)."""

from __future__ import annotations

import base64
from collections.abc import Sequence

from loom.content import Audio, File, Image, Media, Reasoning
from loom.errors import ContentError
from loom.messages import Message

__all__ = ["base64_of", "bytes_of", "data_url", "media_labels", "media_of", "reasoning_of"]


def media_of(message: Message) -> list[Image | File | Audio]:
    """``message``'s images, files and audio, in order."""
    return [p for p in message.parts if isinstance(p, Image | File | Audio)]


def reasoning_of(message: Message, provider: str) -> list[Reasoning]:
    """``message``'s reasoning parts made by ``provider`` (another provider's are meaningless
    to it and are left out of its requests)."""
    return [p for p in message.parts if isinstance(p, Reasoning) and p.provider == provider]


def bytes_of(part: Media) -> bytes:
    """``part``'s bytes. ``ContentError`` for a part whose bytes were not loaded from the
    store (the loop loads them before each model request)."""
    if part.data is None:
        raise ContentError(
            f"{part.label} has no bytes to send (only {part.url or part.ref}); load the "
            "session's media from the store first (loom.store.media.hydrate)",
            part=part.label,
        )
    return part.data


def base64_of(part: Media) -> str:
    """``part``'s bytes as base64 text (see :func:`bytes_of`)."""
    return base64.b64encode(bytes_of(part)).decode("ascii")


def data_url(part: Media) -> str:
    """``part``'s bytes as a ``data:`` URL (its media type, base64)."""
    return f"data:{part.media_type or 'application/octet-stream'};base64,{base64_of(part)}"


def media_labels(messages: Sequence[Message]) -> list[str]:
    """The labels of every media part in ``messages`` (what a refused request held)."""
    return [p.label for m in messages for p in m.parts if isinstance(p, Media)]

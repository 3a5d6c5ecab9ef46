"""Media between Loom's parts (``loom.content``) and the protocols' own shapes, shared by the
surfaces that take or give them (A2A, AG-UI, MCP, the console).

In: :func:`media_part` makes the Loom part a protocol's file, image or document names (bytes,
an ``http(s)`` URL the model's provider fetches itself, or a ``data:`` URL, decoded here);
anything else is refused with a ``ContentError`` that says what to send instead. It and its
helpers live in ``loom.media_input`` (protocol-neutral, so tools use them too) and keep their
names here. Out: :func:`answer_media` is the media of a run's answer, with their bytes loaded
from the store.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from loom.content import Media
from loom.media_input import (
    FETCHED_SCHEMES,
    MediaKind,
    decode_base64,
    media_part,
    parse_data_url,
)

if TYPE_CHECKING:
    from loom.messages import Message
    from loom.store.base import Store

__all__ = [
    "FETCHED_SCHEMES",
    "MediaKind",
    "answer_media",
    "decode_base64",
    "fenced_json",
    "media_part",
    "parse_data_url",
]


def fenced_json(value: Any) -> str:
    """``value`` as a fenced JSON block (how structured input reaches a model as text), keys
    sorted (a protobuf ``Struct`` keeps no order); whole floats (protobuf's ``Value`` keeps
    every number as a double) written as integers."""

    def whole(v: Any) -> Any:
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, dict):
            return {k: whole(x) for k, x in v.items()}
        if isinstance(v, list):
            return [whole(x) for x in v]
        return v

    text = json.dumps(whole(value), indent=2, ensure_ascii=False, sort_keys=True)
    return f"```json\n{text}\n```"


async def answer_media(messages: Sequence[Message], store: Store) -> list[Media]:
    """The images, files and audio of the answer among ``messages`` (a run's: its last
    assistant message), with their bytes (loaded from ``store`` when they are only
    referenced); the answer's reasoning is not among them."""
    from loom.store.media import hydrate

    answer = next((m for m in reversed(messages) if m.role == "assistant"), None)
    if answer is None:
        return []
    media: list[Media] = [p for p in answer.parts if isinstance(p, Media)]
    if any(p.data is None and p.url is None for p in media):
        await hydrate([answer], store)
    return media

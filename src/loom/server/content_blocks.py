"""Content blocks in and out of the server's protocols: the OpenAI API's content arrays and
LangChain's content blocks become a run's ``NewMessage(text, parts)`` (``loom.content``), and
a stored message's parts become blocks again on the way out.

In: chat completions' ``text``, ``image_url`` (a ``data:`` URL, or an http(s) URL passed to
the provider as a URL: Loom fetches nothing), ``input_audio`` and ``file`` (``file_data``);
Responses' ``input_text``, ``input_image`` and ``input_file``; LangChain's ``text``,
``image_url`` and standard ``image`` / ``file`` / ``audio`` blocks (``source_type`` ``base64``
or ``url``, or v1's ``base64`` / ``url`` keys). A block that cannot be used is a
``loom.errors.ContentError`` (or one of its kinds) whose message starts with where the block is
(``messages[0].content[1]``) and says what to do; its ``part`` is that place.

Out: a message with parts shows as a list of blocks: reasoning first (``{"type": "reasoning",
"reasoning": ...}``), then its text, then its media as references to the thread's media route
(``{"type": "image", "url": "/threads/<id>/media/<ref>", "mime_type": ...}``), never the bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from loom.content import Audio, File, Image, Media, Part, Reasoning, jsonable
from loom.engine.run_inputs import NewMessage
from loom.errors import ContentError, UnsupportedContent
from loom.events import parts_of
from loom.messages import Message
from loom.server.surface_media import decode_base64, parse_data_url
from loom.store.base import Store, capabilities_of
from loom.store.media import blobs_of

__all__ = [
    "AUDIO_FORMATS",
    "IMAGE_TYPES",
    "keep_parts",
    "langchain_content",
    "langchain_parts",
    "media_path",
    "openai_parts",
    "parts_from_json",
    "reasoning_text",
    "run_input",
]

IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""The image types every provider Loom speaks to reads (OpenAI, Anthropic, Gemini)."""

AUDIO_FORMATS = {"wav": "audio/wav", "mp3": "audio/mpeg"}
"""OpenAI's ``input_audio.format`` values, as media types."""

AUDIO_TYPES = frozenset(
    {"audio/wav", "audio/x-wav", "audio/mpeg", "audio/mp3", "audio/flac", "audio/ogg"}
)
"""The audio types a LangChain ``audio`` block may name."""

_ALIASES = {"image/jpg": "image/jpeg"}


def located(exc: ContentError, where: str) -> ContentError:
    """``exc`` with its message prefixed by the block's place and ``part`` set to it."""
    exc.args = (f"{where}: {exc}",)
    exc.part = where
    return exc


def _b64(data: str, where: str) -> bytes:
    """Base64 text as bytes; ``MediaTooLarge`` before decoding what would be too large."""
    return decode_base64(data, where)


def data_url(url: str, where: str) -> tuple[str, bytes]:
    """A ``data:`` URL's (media type, bytes); ``ContentError`` for a malformed one."""
    data, media_type = parse_data_url(url, where)
    return media_type, data


def _image(
    media_type: str, data: bytes, where: str, detail: Any = None, name: str | None = None
) -> Image:
    media_type = _ALIASES.get(media_type, media_type)
    if media_type and media_type not in IMAGE_TYPES:
        raise UnsupportedContent(
            f"{where}: {media_type} is an image type no provider reads; send PNG, JPEG, GIF "
            "or WebP",
            part=where,
        )
    return Image(data=data, media_type=media_type, detail=_detail(detail), name=name)


def _detail(detail: Any) -> Any:
    return detail if detail in ("auto", "low", "high") else None


def _url_or_data(
    url: Any, kind: str, where: str, detail: Any = None, name: str | None = None
) -> Part:
    """An ``image_url``/``input_image``/``file`` URL: a data URL's bytes, or an http(s) URL
    passed through for the provider to fetch."""
    if not isinstance(url, str) or not url:
        raise ContentError(f"{where}: give the {kind}'s URL (a data: or https: URL)", part=where)
    if url.startswith("data:"):
        media_type, data = data_url(url, where)
        if kind == "image":
            return _image(media_type, data, where, detail, name)
        return File(data=data, media_type=media_type, name=name)
    if url.startswith(("https://", "http://")):
        if kind == "image":
            return Image(url=url, detail=_detail(detail), name=name)
        return File(url=url, name=name)
    raise ContentError(
        f"{where}: {url[:40]!r} is neither a data: URL nor an http(s) URL; send the bytes as a "
        "data URL or a URL the provider can fetch",
        part=where,
    )


def _no_file_ids(block: dict[str, Any], where: str) -> None:
    if block.get("file_id"):
        raise UnsupportedContent(
            f"{where}: Loom has no files API to look up file_id {block['file_id']!r}; send the "
            "bytes (file_data / a data URL) instead",
            part=where,
        )


def _openai_block(block: dict[str, Any], where: str) -> str | Part | None:
    """One OpenAI content part (chat completions or Responses); None for one to skip."""
    kind = block.get("type")
    if kind in ("text", "input_text", "output_text"):
        return str(block.get("text", ""))
    if kind == "image_url":  # chat: {"image_url": {"url": ..., "detail": ...}}
        spec = block.get("image_url")
        if isinstance(spec, str):
            return _url_or_data(spec, "image", where)
        spec = spec if isinstance(spec, dict) else {}
        return _url_or_data(spec.get("url"), "image", where, spec.get("detail"))
    if kind == "input_image":  # Responses: {"image_url": "...", "detail": ...}
        _no_file_ids(block, where)
        return _url_or_data(block.get("image_url"), "image", where, block.get("detail"))
    if kind == "input_audio":
        spec = block.get("input_audio")
        spec = spec if isinstance(spec, dict) else {}
        fmt = spec.get("format")
        if fmt not in AUDIO_FORMATS:
            raise UnsupportedContent(
                f"{where}: audio format {fmt!r} is not one the providers read; send wav or mp3",
                part=where,
            )
        data = spec.get("data")
        if not isinstance(data, str):
            raise ContentError(f"{where}: input_audio needs data (base64)", part=where)
        return Audio(data=_b64(data, where), media_type=AUDIO_FORMATS[str(fmt)])
    if kind in ("file", "input_file"):
        spec = block.get("file") if kind == "file" else block
        spec = spec if isinstance(spec, dict) else {}
        _no_file_ids(spec, where)
        name = spec.get("filename")
        name = name if isinstance(name, str) and name else None
        data = spec.get("file_data")
        if isinstance(data, str) and data:
            if data.startswith("data:"):
                return _url_or_data(data, "file", where, name=name)
            # bare base64: the type from its bytes
            return File(data=_b64(data, where), name=name)
        if kind == "input_file" and isinstance(spec.get("file_url"), str):
            return _url_or_data(spec["file_url"], "file", where, name=name)
        raise ContentError(f"{where}: a file part needs file_data (a data URL)", part=where)
    if kind == "refusal":
        return None
    raise UnsupportedContent(
        f"{where}: content type {kind!r} is not one Loom takes (text, image_url, input_audio, "
        "file; input_text, input_image, input_file)",
        part=where,
    )


def _collect(content: Any, where: str, block_of: Any) -> tuple[str, list[Part]]:
    if isinstance(content, str):
        return content, []
    if content is None:
        return "", []
    if not isinstance(content, list):
        raise ContentError(
            f"{where} must be text or a list of content parts, got {type(content).__name__}",
            part=where,
        )
    texts: list[str] = []
    parts: list[Part] = []
    for i, block in enumerate(content):
        here = f"{where}[{i}]"
        if isinstance(block, str):
            texts.append(block)
            continue
        if not isinstance(block, dict):
            raise ContentError(f"{here} must be a content part (an object)", part=here)
        try:
            got = block_of(block, here)
        except ContentError as exc:
            if exc.part == here:  # raised here, already saying where
                raise
            raise located(exc, here) from None
        if isinstance(got, str):
            texts.append(got)
        elif got is not None:
            parts.append(got)
    return "".join(texts), parts


def openai_parts(content: Any, where: str) -> tuple[str, list[Part]]:
    """An OpenAI message's ``content`` (text, or a list of content parts) as (text, parts)."""
    return _collect(content, where, _openai_block)


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _lc_block(block: dict[str, Any], where: str) -> str | Part | None:
    """One LangChain content block (OpenAI style or standard, v0 and v1)."""
    kind = block.get("type")
    if kind not in ("image", "file", "audio"):
        return _openai_block(block, where)
    _no_file_ids(block, where)
    extras = _mapping(block.get("extras"))
    metadata = _mapping(block.get("metadata"))
    name = block.get("filename") or block.get("name") or extras.get("filename")
    name = name or metadata.get("filename") or metadata.get("name")
    name = str(name) if name else None
    media_type = str(block.get("mime_type") or "").lower()
    source = block.get("source_type")
    data = block.get("base64") or (block.get("data") if source == "base64" else None)
    url = block.get("url")
    if isinstance(data, str) and data:
        return _lc_bytes(str(kind), media_type, _b64(data, where), name, where)
    if isinstance(url, str) and url:
        if url.startswith("data:"):
            given, raw = data_url(url, where)
            return _lc_bytes(str(kind), media_type or given, raw, name, where)
        if not url.startswith(("https://", "http://")):
            raise ContentError(
                f"{where}: {url[:40]!r} is not an http(s) URL; send the bytes (base64)",
                part=where,
            )
        if kind == "image":
            return Image(url=url, media_type=media_type, name=name)
        if kind == "audio":
            return Audio(url=url, media_type=media_type, name=name)
        return File(url=url, media_type=media_type, name=name)
    if source == "text" and isinstance(block.get("text"), str):  # a text file given inline
        return str(block["text"])
    raise ContentError(
        f"{where}: an {kind} block needs its bytes (base64 with mime_type) or a url", part=where
    )


def _lc_bytes(kind: str, media_type: str, raw: bytes, name: str | None, where: str) -> Part:
    if kind == "image":
        return _image(media_type, raw, where, name=name)
    if kind == "audio":
        media_type = _ALIASES.get(media_type, media_type)
        if media_type and media_type not in AUDIO_TYPES:
            raise UnsupportedContent(
                f"{where}: {media_type} is an audio type no provider reads; send WAV, MP3, "
                "FLAC or OGG",
                part=where,
            )
        return Audio(data=raw, media_type=media_type, name=name)
    return File(data=raw, media_type=media_type, name=name)


def langchain_parts(content: Any, where: str) -> tuple[str, list[Part]]:
    """A LangChain message's ``content`` (text, or a list of content blocks) as (text,
    parts)."""
    return _collect(content, where, _lc_block)


def run_input(text: str, parts: Sequence[Part]) -> str | NewMessage:
    """What a surface passes to the runtime: the text alone, or ``NewMessage(text, parts)``."""
    return NewMessage(text, tuple(parts)) if parts else text


def media_path(thread_id: str, ref: str) -> str:
    """The server path that serves a thread's media bytes (``GET /threads/{id}/media/{ref}``)."""
    return f"/threads/{quote(thread_id, safe='')}/media/{quote(ref, safe=':')}"


def langchain_content(m: Message, thread_id: str) -> str | list[dict[str, Any]]:
    """A message's content as LangChain shows it: its text when it has no parts, else a list
    of blocks (reasoning, text, media as references to the thread's media route)."""
    if not m.parts:
        return m.content
    blocks: list[dict[str, Any]] = []
    for p in m.parts:
        if isinstance(p, Reasoning):
            blocks.append({"type": "reasoning", "reasoning": p.text})
    if m.content:
        blocks.append({"type": "text", "text": m.content})
    for p in m.parts:
        if isinstance(p, Media):
            blocks.append(_media_block(p, thread_id))
    return blocks


def _media_block(p: Media, thread_id: str) -> dict[str, Any]:
    block: dict[str, Any] = {"type": p.kind}
    if p.ref is not None:
        block["url"] = media_path(thread_id, p.ref)
        block["id"] = p.ref
    elif p.url is not None:
        block["url"] = p.url
    if p.media_type:
        block["mime_type"] = p.media_type
    extras = {k: v for k, v in (("filename", p.name), ("size", p.size)) if v is not None}
    if extras:
        block["extras"] = extras
    return block


def reasoning_text(messages: Sequence[Message]) -> str:
    """The readable reasoning of ``messages``' answers, joined (empty when there is none)."""
    return "\n\n".join(
        p.text
        for m in messages
        if m.role == "assistant"
        for p in m.parts
        if isinstance(p, Reasoning) and p.text
    )


async def keep_parts(store: Store, session_id: str, parts: Sequence[Part]) -> list[dict[str, Any]]:
    """Store ``parts``' bytes for ``session_id`` (``BlobStore.put_blobs``) and return the
    parts' JSON form, which names them by reference: what a run that starts later (a queued
    job, a background run carried on after a restart) is given instead of the bytes.
    ``UnsupportedContent`` when the store cannot keep media."""
    if not parts:
        return []
    blobs = blobs_of([Message(role="user", parts=list(parts))])
    if blobs:
        keeper = capabilities_of(store).blobs
        if keeper is None:
            raise UnsupportedContent(
                f"{type(store).__name__} cannot keep media (images, files, audio): use a store "
                "that does, or send text"
            )
        await keeper.put_blobs(session_id, blobs)
    return jsonable(parts)


def parts_from_json(items: Any) -> tuple[Part, ...]:
    """Parts from their JSON form (``keep_parts``' answer): references to stored bytes."""
    if not isinstance(items, list) or not items:
        return ()
    return tuple(parts_of(items))

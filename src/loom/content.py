"""What a message holds besides its text: images, files, audio and a model's reasoning.

A :class:`~loom.messages.Message` keeps its text in ``content`` (a plain ``str``, as before)
and everything else in ``parts``, in order: ``Image``, ``File``, ``Audio`` (the *media*) and
``Reasoning``. A user message shows its text first, then its media; an assistant message
carries its reasoning before its text, as the providers that return reasoning order it.

Media hold their bytes (``data``), a URL the provider fetches itself (``url``; Loom never
fetches a URL on a user's behalf), or a reference to bytes already in the store (``ref``,
``"sha256:<hex>"`` of the bytes). Bytes are stored once, by content hash: the journal puts a
message's media into the store (``loom.store.base.BlobStore``) before the message itself,
and what the store keeps of the message is the reference (``data`` is never part of a
message's JSON form). A model request loads the bytes back only when it needs them
(``loom.store.media.hydrate``).

``Reasoning`` is what a reasoning model thought before it answered: its text, and what the
provider needs back unchanged while a tool loop goes on (Anthropic's ``signature``, a
redacted block's or OpenAI's ``encrypted`` payload, an item ``id``), kept verbatim.

Build parts with the helpers: ``Image.from_path("chart.png")``, ``Image(url=...)``,
``File.from_path("report.pdf")``, ``Audio.from_bytes(wav, "audio/wav")``; a run's input may be
a list mixing text and parts (``agent.run(["What is on this?", Image.from_path(p)])``).
"""

from __future__ import annotations

import hashlib
import mimetypes
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from loom.errors import (
    ContentError,
    MediaTooLarge,
    MediaTypeMismatch,
    UnsupportedContent,
)

__all__ = [
    "MAX_MEDIA_BYTES",
    "Audio",
    "Blob",
    "File",
    "Image",
    "Media",
    "Part",
    "Reasoning",
    "UserContent",
    "check_parts",
    "describe",
    "media_ref",
    "sniff_media_type",
    "split_content",
    "typed_error",
]

MAX_MEDIA_BYTES = 32 * 1024 * 1024
"""The largest part Loom takes (32 MiB: Anthropic's request limit and OpenAI's file-input
limit; its image limits are lower and the provider says so). Past it: ``MediaTooLarge``."""

# Magic numbers of the media types Loom checks bytes against: (offset, signature). A part
# whose bytes do not start as its media type says is refused (``MediaTypeMismatch``).
SIGNATURES: dict[str, tuple[tuple[int, bytes], ...]] = {
    "image/png": ((0, b"\x89PNG\r\n\x1a\n"),),
    "image/jpeg": ((0, b"\xff\xd8\xff"),),
    "image/gif": ((0, b"GIF87a"), (0, b"GIF89a")),
    "image/webp": ((8, b"WEBP"),),
    "application/pdf": ((0, b"%PDF-"),),
    "audio/wav": ((8, b"WAVE"),),
    "audio/x-wav": ((8, b"WAVE"),),
    "audio/mpeg": ((0, b"ID3"), (0, b"\xff\xfb"), (0, b"\xff\xf3"), (0, b"\xff\xf2")),
    "audio/mp3": ((0, b"ID3"), (0, b"\xff\xfb"), (0, b"\xff\xf3"), (0, b"\xff\xf2")),
    "audio/flac": ((0, b"fLaC"),),
    "audio/ogg": ((0, b"OggS"),),
}


def sniff_media_type(data: bytes) -> str | None:
    """The media type ``data``'s first bytes show (one of :data:`SIGNATURES`), or None."""
    for media_type, signatures in SIGNATURES.items():
        if any(data[at : at + len(sig)] == sig for at, sig in signatures):
            return media_type
    return None


def media_ref(data: bytes) -> str:
    """The reference bytes are stored under: ``"sha256:"`` and their hex digest."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Media(BaseModel):
    """Bytes, a URL or a stored reference, with its media type (see the module docstring).

    Exactly one of ``data`` and ``url`` may be given; ``ref`` (and ``size``) are computed from
    ``data``. A part read back from the store has ``ref`` and no ``data``."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    kind: str = ""
    media_type: str = ""
    data: bytes | None = Field(default=None, exclude=True, repr=False)
    url: str | None = None
    ref: str | None = None
    size: int | None = None
    name: str | None = None

    def __init__(self, **values: Any) -> None:
        # pydantic wraps what a validator raises in a ValidationError: callers get the typed
        # error the check raised (or a ContentError with pydantic's words for a wrong type).
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise typed_error(exc, values.get("kind") or type(self).__name__) from None

    @model_validator(mode="after")
    def _checked(self) -> Self:
        label = self.label
        if self.data is None and self.url is None and self.ref is None:
            raise ContentError(
                f"{label} has no content: give its bytes (data=...), a URL the provider can "
                "fetch (url=...), or use from_path(...)",
                part=label,
            )
        if self.data is not None and self.url is not None:
            raise ContentError(f"{label} has both bytes and a URL: give one", part=label)
        if self.data is not None:
            size = len(self.data)
            if size > MAX_MEDIA_BYTES:
                raise MediaTooLarge(
                    f"{label} is {size:,} bytes, over the {MAX_MEDIA_BYTES:,}-byte limit: send "
                    "a smaller file (downscale the image, split the document) or a URL",
                    size=size,
                    limit=MAX_MEDIA_BYTES,
                    part=label,
                )
            sniffed = sniff_media_type(self.data)
            if not self.media_type:
                if sniffed is None:
                    raise ContentError(
                        f"{label}: cannot tell the media type of its bytes; give media_type=",
                        part=label,
                    )
                self.media_type = sniffed
            elif self.media_type in SIGNATURES and sniffed != _canonical(self.media_type):
                found = f"they look like {sniffed}" if sniffed else "they match no known type"
                raise MediaTypeMismatch(
                    f"{label} claims {self.media_type}, but its bytes are not that ({found}); "
                    "send the file as what it is, or fix media_type",
                    part=label,
                )
            self.size = size
            self.ref = media_ref(self.data)
        elif not self.media_type and self.url is not None:
            guessed = mimetypes.guess_type(self.url.split("?", 1)[0])[0]
            self.media_type = guessed or ""
        self._kind_check(label)
        return self

    def _kind_check(self, label: str) -> None:
        """Subclasses refuse media types that are not their kind."""

    @property
    def label(self) -> str:
        """How errors and placeholders name this part: its name, else its kind and type."""
        return self.name or f"{self.kind} ({self.media_type or 'unknown type'})"

    @classmethod
    def from_bytes(cls, data: bytes, media_type: str = "", name: str | None = None) -> Self:
        """A part of these bytes (``media_type`` sniffed from them when not given)."""
        return cls(data=data, media_type=media_type, name=name)

    @classmethod
    def from_path(cls, path: str | Path, media_type: str = "") -> Self:
        """A part of the file at ``path``, named after it (its media type from its bytes, else
        its extension)."""
        p = Path(path)
        try:
            size = p.stat().st_size
        except OSError as exc:
            raise ContentError(f"cannot read {p}: {exc.strerror or exc}", part=str(p)) from exc
        if size > MAX_MEDIA_BYTES:
            raise MediaTooLarge(
                f"{p} is {size:,} bytes, over the {MAX_MEDIA_BYTES:,}-byte limit",
                size=size,
                limit=MAX_MEDIA_BYTES,
                part=str(p),
            )
        data = p.read_bytes()
        if not media_type and sniff_media_type(data) is None:
            media_type = mimetypes.guess_type(p.name)[0] or ""
        return cls(data=data, media_type=media_type, name=p.name)


def typed_error(exc: ValidationError, what: str) -> ContentError:
    """The ``ContentError`` a part's validation raised inside ``exc``, else one that says, in
    pydantic's words, which field was wrong."""
    for err in exc.errors():
        raised = (err.get("ctx") or {}).get("error")
        if isinstance(raised, ContentError):
            return raised
    first = exc.errors()[0]
    where = ".".join(str(x) for x in first["loc"]) or what
    return ContentError(f"{what}: {where}: {first['msg']}", part=what)


def _canonical(media_type: str) -> str:
    return {"audio/mp3": "audio/mpeg", "audio/x-wav": "audio/wav"}.get(media_type, media_type)


class Image(Media):
    """An image (PNG, JPEG, GIF, WebP). ``detail`` is OpenAI's resolution hint; ``width`` and
    ``height`` (pixels) are read from the bytes when Pillow is installed, and size the
    image's token estimate."""

    kind: Literal["image"] = "image"
    width: int | None = None
    height: int | None = None
    detail: Literal["auto", "low", "high"] | None = None

    def _kind_check(self, label: str) -> None:
        if self.media_type and not self.media_type.startswith("image/"):
            raise ContentError(
                f"{label} is {self.media_type}, not an image: send it as File(...)", part=label
            )
        if self.data is not None and self.width is None:
            size = image_size(self.data)
            if size is not None:
                self.width, self.height = size


class File(Media):
    """A document or any other file (a PDF, a CSV, ...), with its name."""

    kind: Literal["file"] = "file"


class Audio(Media):
    """A sound clip (WAV, MP3, FLAC, OGG)."""

    kind: Literal["audio"] = "audio"

    def _kind_check(self, label: str) -> None:
        if self.media_type and not self.media_type.startswith("audio/"):
            raise ContentError(
                f"{label} is {self.media_type}, not audio: send it as File(...)", part=label
            )


class Reasoning(BaseModel):
    """A model's reasoning before its answer, kept verbatim for the provider that made it.

    ``text`` is the readable reasoning (empty for a redacted block). ``provider`` names who
    made it (``"anthropic"``, ``"openai"``, ``"openai-compatible"``): only that provider gets
    it back. ``signature`` (Anthropic's thinking signature), ``encrypted`` (a redacted block's
    data, OpenAI's ``encrypted_content``) and ``id`` (an OpenAI reasoning item's id) are
    opaque: sent back byte for byte, never edited."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    kind: Literal["reasoning"] = "reasoning"
    text: str = ""
    provider: str | None = None
    signature: str | None = None
    encrypted: str | None = None
    id: str | None = None


Part = Annotated[Image | File | Audio | Reasoning, Field(discriminator="kind")]
"""One part of a message besides its text."""

UserContent = str | Image | File | Audio
"""What a user message may be made of: text and media, in order."""


def split_content(items: str | Media | Iterable[UserContent]) -> tuple[str, list[Part]]:
    """A user input as (text, parts): its strings joined by newlines, its media in order.
    ``ContentError`` for anything else (a ``Reasoning`` part is a model's, not a user's)."""
    if isinstance(items, str):
        return items, []
    if isinstance(items, Image | File | Audio):
        items = [items]
    texts: list[str] = []
    parts: list[Part] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, Image | File | Audio):
            parts.append(item)
        else:
            raise ContentError(
                f"input item {i} is {type(item).__name__}: a message is made of text (str), "
                "Image, File and Audio parts",
                part=str(i),
            )
    return "\n".join(texts), parts


class Blob:
    """Bytes to store under their reference (what ``BlobStore.put_blobs`` takes)."""

    __slots__ = ("data", "media_type", "ref")

    def __init__(self, ref: str, media_type: str, data: bytes) -> None:
        self.ref, self.media_type, self.data = ref, media_type, data

    def __repr__(self) -> str:
        return f"Blob({self.ref[:19]}…, {self.media_type}, {len(self.data)} bytes)"


MEDIA_MODELS = "openai:gpt-4o, anthropic:claude-sonnet-4-5 or another vision model"


def check_parts(model: object, parts: Sequence[Part]) -> None:
    """``UnsupportedContent`` when ``model`` says it cannot read a kind of media in ``parts``
    (its ``accepts_media``: the kinds it reads; a model that does not say is given them all,
    and its provider answers)."""
    accepts = getattr(model, "accepts_media", None)
    if accepts is None:
        return
    for p in parts:
        if isinstance(p, Media) and p.kind not in accepts:
            name = getattr(model, "name", type(model).__name__)
            raise UnsupportedContent(
                f"model {name!r} cannot read {p.kind} input ({p.label}); send it to a model "
                f"that does ({MEDIA_MODELS}), or send text",
                part=p.label,
            )


def describe(part: Part) -> str:
    """A short placeholder for a part the context leaves out: its kind, name and type."""
    if isinstance(part, Reasoning):
        return "[reasoning]"
    size = f", {part.size:,} bytes" if part.size else ""
    dims = (
        f", {part.width}x{part.height}"
        if isinstance(part, Image) and part.width and part.height
        else ""
    )
    name = f" {part.name}" if part.name else ""
    return f"[{part.kind}{name}: {part.media_type or 'unknown type'}{dims}{size}]"


def image_size(data: bytes) -> tuple[int, int] | None:
    """An image's (width, height) in pixels, read from its header by Pillow (the ``media``
    extra); None without Pillow or when Pillow cannot read it."""
    try:
        from PIL import Image as PILImage
    except ImportError:
        return None
    import io

    try:
        with PILImage.open(io.BytesIO(data)) as img:  # reads the header only
            return int(img.width), int(img.height)
    except Exception:  # Pillow raises many types for bytes it cannot read
        return None


def jsonable(parts: Sequence[Any]) -> list[dict[str, Any]]:
    """``parts`` in their stored JSON form (no bytes)."""
    return [p.model_dump(exclude_none=True) for p in parts]

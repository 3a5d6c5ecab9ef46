"""Files attached to a message from the command line: ``loom run --attach FILE`` and
``/attach PATH`` in ``loom chat`` (locally, or sent to a server as content blocks)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from loom.cli._console import err, say_error

if TYPE_CHECKING:
    from collections.abc import Sequence

    from loom.content import Audio, File, Image
    from loom.engine.run_inputs import NewMessage

__all__ = ["attach_command", "attachment", "content_blocks", "described", "with_attachments"]


def attachment(path: str | Path) -> Image | File | Audio:
    """The file at ``path`` as a part of a message: an ``Image``, ``Audio`` or ``File`` by
    what its bytes (else its extension) show. ``ContentError`` for a file that is missing or
    of a type nothing tells, ``MediaTooLarge`` past the size limit (``loom.content``)."""
    import mimetypes

    from loom.content import MAX_MEDIA_BYTES, Audio, File, Image, sniff_media_type
    from loom.errors import ContentError, MediaTooLarge

    p = Path(path).expanduser()
    if not p.is_file():
        what = "is a folder" if p.is_dir() else "does not exist"
        raise ContentError(f"cannot attach {p}: it {what}; give the path of a file", part=str(p))
    size = p.stat().st_size
    if size > MAX_MEDIA_BYTES:
        raise MediaTooLarge(
            f"cannot attach {p}: it is {size:,} bytes, over the {MAX_MEDIA_BYTES:,}-byte limit; "
            "attach a smaller file (downscale the image, split the document)",
            size=size,
            limit=MAX_MEDIA_BYTES,
            part=str(p),
        )
    with p.open("rb") as f:
        head = f.read(64)
    media_type = sniff_media_type(head) or mimetypes.guess_type(p.name)[0]
    if media_type is None:
        raise ContentError(
            f"cannot attach {p}: its type is unknown (its bytes are no image, PDF or audio Loom "
            "recognises, and its name has no known extension); attach PNG, JPEG, GIF, WebP, "
            "PDF, WAV, MP3, FLAC, OGG or a file named with its type's extension (.txt, .csv)",
            part=str(p),
        )
    kind: type[Image | File | Audio] = (
        Image
        if media_type.startswith("image/")
        else Audio
        if media_type.startswith("audio/")
        else File
    )
    return kind.from_path(p, media_type)


def described(part: Image | File | Audio) -> str:
    """How the CLI names an attached part: its name, type and size."""
    return f"{part.name} ({part.media_type}, {part.size or 0:,} bytes)"


def with_attachments(message: str, files: Sequence[Path] | None) -> str | NewMessage:
    """``message`` with ``files`` attached (``NewMessage(text, parts)``), said on stderr."""
    if not files:
        return message
    from loom.engine.run_inputs import NewMessage

    parts = tuple(attachment(f) for f in files)
    for part in parts:
        err.print(f"[dim]attached {escape(described(part))}[/]")
    return NewMessage(message, parts)


def content_blocks(given: str | NewMessage) -> list[dict[str, Any]] | None:
    """A message with attachments as the LangChain content blocks a server's run API takes
    (None for text alone): its text, then each file's bytes in base64."""
    if isinstance(given, str):
        return None
    import base64

    from loom.content import Media

    blocks: list[dict[str, Any]] = [{"type": "text", "text": given.text}]
    for p in given.parts:
        if isinstance(p, Media) and p.data is not None:
            block: dict[str, Any] = {
                "type": p.kind,
                "base64": base64.b64encode(p.data).decode(),
                "mime_type": p.media_type,
            }
            if p.name:
                block["extras"] = {"filename": p.name}
            blocks.append(block)
    return blocks


def attach_command(line: str, attached: list[Image | File | Audio]) -> None:
    """``/attach PATH`` in ``loom chat``: attach the file to the next message, and say so
    (or say why not: a missing file, one too large, one of an unknown type)."""
    from loom.errors import LoomError

    command, _, path = line.partition(" ")
    path = path.strip().strip("\"'")
    if command != "/attach" or not path:
        err.print("[yellow]usage: /attach PATH[/] (the file goes with your next message)")
        return
    try:
        part = attachment(path)
    except LoomError as exc:
        say_error(exc)
        return
    attached.append(part)
    names = ", ".join(escape(described(p)) for p in attached)
    err.print(f"[dim]attached {names}; it goes with your next message[/]")

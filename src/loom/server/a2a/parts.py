"""An A2A message's parts as a Loom message, and a Loom answer's media as A2A parts.

In (A2A 1.0 ``Part``: ``text``, ``raw``, ``url`` or ``data``, with ``mediaType`` and
``filename``):

- a text part is text (``text/plain``, any other ``text/*``, JSON, XML, YAML: a model reads
  them); a text part that says it is another type (``image/png``) is refused: send the bytes
  as a ``raw`` part;
- a ``raw`` part (bytes) is an ``Image``, ``Audio`` or ``File`` by its media type (typed from
  its bytes or its filename when it names none), stored once like every Loom medium;
- a ``url`` part is the same with a URL: ``http(s)`` goes to the model's provider, which
  fetches it (Loom never does), a ``data:`` URL is decoded; other schemes are refused;
- a ``data`` part (structured JSON) becomes text: its JSON in a fenced ```` ```json ```` block
  at its place among the text parts (no provider takes JSON as a medium, and every model reads
  it as text; whole numbers are written as integers, though A2A carries them as doubles).

Out: the answer's text is a text part, then each of its images, files and audio a ``raw``
part with its ``mediaType`` and ``filename`` (A2A has no other channel for bytes; a medium the
answer holds as a URL is a ``url`` part). The answer's reasoning is not sent: A2A has no part
for it, and it is the model's, not the agent's answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from a2a.types.a2a_pb2 import Part
from google.protobuf.json_format import MessageToDict

from loom.content import Media
from loom.content import Part as LoomPart
from loom.errors import ContentError, UnsupportedContent
from loom.server.surface_media import fenced_json, media_part

if TYPE_CHECKING:
    from a2a.types.a2a_pb2 import Message

__all__ = ["TEXT_TYPES", "content_of", "media_parts"]

TEXT_TYPES = ("text/", "application/json", "application/xml", "application/yaml")
"""Media types a text part may say it is (anything a model reads as text)."""


def _texty(media_type: str) -> bool:
    media_type = media_type.partition(";")[0].strip().lower()
    return not media_type or media_type.startswith(TEXT_TYPES) or media_type.endswith("+json")


def content_of(message: Message) -> tuple[str, list[LoomPart]]:
    """The Loom message (text, media parts) an A2A message carries; ``ContentError``
    (``UnsupportedContent`` for what Loom cannot take) naming the part and what to send."""
    texts: list[str] = []
    parts: list[LoomPart] = []
    for i, part in enumerate(message.parts):
        name = part.filename or None
        where = f"message part {i}" + (f" ({name})" if name else "")
        if part.HasField("text"):
            if not _texty(part.media_type):
                raise ContentError(
                    f"{where} is text that says it is {part.media_type}; send text as "
                    f"text/plain, or the {part.media_type} bytes as a raw part",
                    part=str(i),
                )
            texts.append(part.text)
        elif part.HasField("data"):
            texts.append(fenced_json(MessageToDict(part.data)))
        elif part.HasField("raw") or part.HasField("url"):
            try:
                if part.HasField("raw"):
                    medium = media_part(part.media_type, data=part.raw, name=name)
                else:
                    medium = media_part(part.media_type, url=part.url, name=name)
            except UnsupportedContent as exc:  # what Loom cannot take: a content-type error
                raise UnsupportedContent(f"{where}: {exc}", part=str(i)) from None
            except ContentError as exc:  # bytes that are not what they say, too large, ...
                raise ContentError(f"{where}: {exc}", part=str(i)) from None
            parts.append(medium)
        else:
            raise ContentError(
                f"{where} is empty: a part carries text, raw (bytes), url or data", part=str(i)
            )
    return "\n".join(texts), parts


def media_parts(media: list[Media]) -> list[Part]:
    """``media`` (an answer's, bytes loaded) as A2A parts: ``raw`` with its media type and
    filename, or ``url`` for a medium held as a URL."""
    out: list[Part] = []
    for m in media:
        name = m.name or ""
        if m.data is not None:
            out.append(Part(raw=m.data, media_type=m.media_type, filename=name))
        elif m.url is not None:
            out.append(Part(url=m.url, media_type=m.media_type, filename=name))
    return out

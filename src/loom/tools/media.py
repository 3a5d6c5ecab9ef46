"""Tools that return media: a screenshot, a generated chart, a PDF.

A tool may return an ``Image``, ``File`` or ``Audio`` (``loom.content``), or a list or tuple
mixing text and such parts (``["Here is the chart:", Image.from_bytes(png)]``). Media inside
a returned dict or a nested list are taken out the same way. ``split_media`` makes the
result's two halves:

- the *media* become the tool message's ``parts`` (and the ``TOOL_RESULT`` event's), so the
  journal stores their bytes once, by content hash, before the message, and a model that
  takes images in tool results is shown them;
- the *data* the model reads as text names each part where it was, with its placeholder
  (``loom.content.describe``: ``[image chart.png: image/png, 640x480, 18,202 bytes]``): a
  text-and-parts list becomes its lines joined by newlines, a lone part its placeholder, a
  part inside a dict or list the placeholder string in its place.

``ToolResult.parts`` keeps the media (as references once stored), so the ledger row of the
call keeps them too and a result read back after a crash still names its bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loom.content import Audio, File, Image, describe
from loom.text import MAX_DEPTH

__all__ = ["MediaPart", "split_media"]

_PLAIN = (str, int, float, bool, type(None), bytes)
MediaPart = Image | File | Audio


def split_media(value: Any) -> tuple[Any, list[MediaPart]]:
    """A tool's return value as (data for the model to read, media parts in order); a value
    without media comes back as it is (see the module docstring)."""
    if isinstance(value, _PLAIN):
        return value, []
    if isinstance(value, MediaPart):
        return describe(value), [value]
    if (
        isinstance(value, list | tuple)
        and any(isinstance(v, MediaPart) for v in value)
        and all(isinstance(v, str | MediaPart) for v in value)
    ):
        parts = [v for v in value if isinstance(v, MediaPart)]
        return "\n".join(v if isinstance(v, str) else describe(v) for v in value), parts
    media: list[MediaPart] = []
    data = _walk(value, media, 0)
    return (data, media) if media else (value, [])


def _walk(value: Any, media: list[MediaPart], depth: int) -> Any:
    """``value`` with its media replaced by their placeholders (collected into ``media``);
    containers are copied only on the way to a part, and only as deep as a result may nest
    (``json_native`` refuses deeper values afterwards)."""
    if depth > MAX_DEPTH or isinstance(value, _PLAIN):
        return value
    if isinstance(value, MediaPart):
        media.append(value)
        return describe(value)
    if isinstance(value, Mapping):
        before = len(media)
        items = {k: _walk(v, media, depth + 1) for k, v in value.items()}
        return items if len(media) > before else value
    if isinstance(value, list | tuple):
        before = len(media)
        seq = [_walk(v, media, depth + 1) for v in value]
        return seq if len(media) > before else value
    return value

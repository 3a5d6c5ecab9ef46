"""What media cost in a model's context: token estimates per part, by the model's rules.

On the data floor, beside ``loom.content``, so every context builder counts media the same way:
the memory layer's budgeted builder (``loom.memory``, which re-exports these names as
``loom.memory.media``) and the default ``FullHistoryBuilder`` (``loom.context``).

A provider counts an image by its pixels, not its bytes, and each provider by its own rule.
``media_rule_for(model)`` picks the rule from the model's name (or class) through
:data:`MEDIA_RULES`, a table; ``part_tokens(part, rule)`` estimates one part:

| rule          | image                                                       | file, audio  |
| ------------- | ----------------------------------------------------------- | ------------ |
| ``openai``    | ``detail="low"``: 85. Else scaled to fit 2048x2048, then its | from size    |
|               | shortest side down to 768; 170 per 512-px tile, plus 85     |              |
| ``anthropic`` | scaled to fit 1568 px on its long side; width*height/750    | from size    |
| ``local``     | the placeholder text it is shown instead (``describe``)     | the same     |
| ``default``   | the larger of the OpenAI and Anthropic figures              | from size    |

An image whose size is unknown (a URL, or bytes Pillow could not read) is costed at the
largest the rule allows (OpenAI: 1445, Anthropic: 3279). Files and audio are estimates from
their size, and rough ones: a PDF at :data:`PDF_PAGE_TOKENS` per :data:`PDF_PAGE_BYTES`
(a page's text plus the page image providers add), text at 4 bytes a token, audio at
:data:`AUDIO_TOKENS_PER_SECOND` for a duration guessed from its bytes
(:data:`AUDIO_BYTES_PER_SECOND`). A file or clip of unknown size (a URL) counts as
:data:`UNKNOWN_SIZE_BYTES`. The estimates use only what a stored part keeps (size, width,
height, media type), so a context is costed the same before and after its bytes are stored.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

from loom.content import Audio, Image, Media, Reasoning, describe

__all__ = [
    "AUDIO_BYTES_PER_SECOND",
    "AUDIO_TOKENS_PER_SECOND",
    "MEDIA_RULES",
    "PDF_PAGE_BYTES",
    "PDF_PAGE_TOKENS",
    "UNKNOWN_SIZE_BYTES",
    "MediaRule",
    "anthropic_image_tokens",
    "media_rule_for",
    "openai_image_tokens",
    "part_key",
    "part_tokens",
]

MediaRule = Literal["openai", "anthropic", "local", "default"]
"""How a model counts media (see the module docstring)."""

MEDIA_RULES: tuple[tuple[str, str, MediaRule], ...] = (
    # (what is matched, lower-cased prefix, rule): the first match wins
    ("name", "anthropic:", "anthropic"),
    ("name", "bedrock:", "anthropic"),
    ("name", "claude", "anthropic"),
    ("name", "openai:", "openai"),
    ("name", "openai-responses:", "openai"),
    ("name", "azure:", "openai"),
    ("name", "gpt-", "openai"),
    ("name", "local", "local"),
    ("class", "anthropicmodel", "anthropic"),
    ("class", "localmodel", "local"),
)
"""Which rule a model follows: matched on its name (``"anthropic:claude-sonnet-4-5"``), then
its class name; anything else (OpenAI-compatible servers, Ollama, test models) ``default``."""

OPENAI_LOW = 85
OPENAI_TILE = 170
OPENAI_FIT = 2048
OPENAI_SHORT_SIDE = 768
OPENAI_TILE_SIDE = 512
ANTHROPIC_LONG_SIDE = 1568
ANTHROPIC_PIXELS_PER_TOKEN = 750

PDF_PAGE_BYTES = 50_000
"""A PDF is guessed to have one page per this many bytes (at least one)."""
PDF_PAGE_TOKENS = 2_500
"""Tokens per PDF page: its text (1,500-3,000 on a dense page) and the image providers add."""
TEXT_BYTES_PER_TOKEN = 4
AUDIO_BYTES_PER_SECOND: dict[str, int] = {
    "audio/wav": 32_000,  # 16 kHz, 16-bit mono: speech as it is usually recorded
    "audio/x-wav": 32_000,
    "audio/flac": 16_000,
}
"""Bytes a second of audio takes, by media type; others (MP3, OGG, ...) 16 000 (128 kbit/s)."""
AUDIO_DEFAULT_BYTES_PER_SECOND = 16_000
AUDIO_TOKENS_PER_SECOND: dict[MediaRule, int] = {"openai": 10, "default": 32}
"""Tokens a second of audio costs: OpenAI's 1 per 100 ms; elsewhere 32 (Gemini's figure)."""
UNKNOWN_SIZE_BYTES = 1024 * 1024
"""What a file or clip whose size is unknown (a URL) is costed as."""


def media_rule_for(model: Any) -> MediaRule:
    """The rule ``model`` (a model object or a model string) counts media by
    (:data:`MEDIA_RULES`)."""
    if isinstance(model, str):
        name, cls = model.lower(), ""
    else:
        name = str(getattr(model, "name", "") or "").lower()
        cls = type(model).__name__.lower() if model is not None else ""
    for what, prefix, rule in MEDIA_RULES:
        if (name if what == "name" else cls).startswith(prefix):
            return rule
    return "default"


def openai_image_tokens(width: int | None, height: int | None, detail: str | None = None) -> int:
    """OpenAI's count for an image (GPT-4o, GPT-4.1 and their kin): 85 at ``detail="low"``,
    else 85 plus 170 per 512-px tile after scaling; the largest (1445) when the size is
    unknown."""
    if detail == "low":
        return OPENAI_LOW
    if not width or not height:
        # the most tiles any image makes: 768 x 2048 after scaling, 2 x 4 tiles
        return OPENAI_LOW + OPENAI_TILE * 8
    w, h = float(width), float(height)
    fit = min(1.0, OPENAI_FIT / max(w, h))
    w, h = w * fit, h * fit
    short = min(w, h)
    if short > OPENAI_SHORT_SIDE:
        w, h = w * OPENAI_SHORT_SIDE / short, h * OPENAI_SHORT_SIDE / short
    tiles = math.ceil(w / OPENAI_TILE_SIDE) * math.ceil(h / OPENAI_TILE_SIDE)
    return OPENAI_LOW + OPENAI_TILE * tiles


def anthropic_image_tokens(width: int | None, height: int | None) -> int:
    """Anthropic's count for an image: width*height/750 after scaling it to fit 1568 px on
    its long side; the largest (3279) when the size is unknown."""
    if not width or not height:
        width = height = ANTHROPIC_LONG_SIDE
    w, h = float(width), float(height)
    fit = min(1.0, ANTHROPIC_LONG_SIDE / max(w, h))
    return max(1, math.ceil(round(w * fit) * round(h * fit) / ANTHROPIC_PIXELS_PER_TOKEN))


def _size(part: Media) -> int:
    if part.size is not None:
        return part.size
    if part.data is not None:
        return len(part.data)
    return UNKNOWN_SIZE_BYTES


def _file_tokens(part: Media) -> int:
    size = _size(part)
    if part.media_type == "application/pdf":
        return PDF_PAGE_TOKENS * max(1, math.ceil(size / PDF_PAGE_BYTES))
    # text, and any other file a provider reads as text: every 4 bytes a token
    return max(1, math.ceil(size / TEXT_BYTES_PER_TOKEN))


def _audio_tokens(part: Media, rule: MediaRule) -> int:
    rate = AUDIO_BYTES_PER_SECOND.get(part.media_type, AUDIO_DEFAULT_BYTES_PER_SECOND)
    per_second = AUDIO_TOKENS_PER_SECOND.get(rule, AUDIO_TOKENS_PER_SECOND["default"])
    return max(1, math.ceil(_size(part) / rate * per_second))


def part_tokens(part: Any, rule: MediaRule, count_text: Callable[[str], int]) -> int:
    """Estimated tokens of one part under ``rule``; ``count_text(str) -> int`` counts text
    (a reasoning part's, and the placeholder the local model is shown instead of media)."""
    if isinstance(part, Reasoning):
        # sent back within a tool loop, so counted; an encrypted payload at ~4 bytes a token
        encrypted = len(part.encrypted) // TEXT_BYTES_PER_TOKEN if part.encrypted else 0
        return count_text(part.text) + encrypted
    if rule == "local":
        return count_text(describe(part))
    if isinstance(part, Image):
        if rule == "openai":
            return openai_image_tokens(part.width, part.height, part.detail)
        if rule == "anthropic":
            return anthropic_image_tokens(part.width, part.height)
        return max(
            openai_image_tokens(part.width, part.height, part.detail),
            anthropic_image_tokens(part.width, part.height),
        )
    if isinstance(part, Audio):
        return _audio_tokens(part, rule)
    if isinstance(part, Media):  # File, or a Media of a kind this module does not know
        return _file_tokens(part)
    return 0


def part_key(part: Any) -> tuple[Any, ...]:
    """What a part's estimate depends on (a cache key)."""
    if isinstance(part, Reasoning):
        return ("reasoning", part.text, len(part.encrypted or ""))
    if isinstance(part, Image):
        return (
            "image",
            part.ref or part.url,
            part.media_type,
            part.size,
            part.width,
            part.height,
            part.detail,
            part.name,
        )
    return (part.kind, part.ref or part.url, part.media_type, part.size, part.name)

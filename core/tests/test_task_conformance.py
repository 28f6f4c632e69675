"""The side-task conformance runners pass a runner that keeps the protocol and fail one
that does not (a result that depends on its batch, a score outside [0, 1])."""

from __future__ import annotations

import numpy as np
import pytest
from mlxcel.testing.conformance import check_embedder, check_reranker
from test_api_embeddings import NumpyEmbedder, NumpyReranker


class BatchLeak(NumpyEmbedder):
    """Pads with a value that leaks into the mean: wrong under batching."""

    def embed(self, inputs, pooling):
        width = max(len(e) for e in inputs)
        out = super().embed(inputs, pooling)
        return [v if pooling == "none" else (v * len(e) / width).astype(np.float32)
                for v, e in zip(out, inputs, strict=True)]


class OutOfRange(NumpyReranker):
    def score(self, pairs):
        return [2.0 for _ in pairs]


def test_a_conforming_embedder_and_reranker_pass():
    check_embedder(NumpyEmbedder())
    check_reranker(NumpyReranker())


def test_a_batch_dependent_embedder_fails():
    with pytest.raises(AssertionError, match="changes with the batch"):
        check_embedder(BatchLeak())


def test_an_out_of_range_score_fails():
    with pytest.raises(AssertionError, match="outside"):
        check_reranker(OutOfRange())


class Batched(NumpyEmbedder):
    """The optional ``tokenize_batch``, kept (``right``) or broken (reversed order)."""

    def __init__(self, right: bool) -> None:
        super().__init__()
        self.right = right

    def tokenize_batch(self, texts):
        out = [self.tokenize(t) for t in texts]
        return out if self.right else out[::-1]


def test_an_optional_tokenize_batch_must_agree_with_tokenize():
    check_embedder(Batched(right=True))
    with pytest.raises(AssertionError, match="tokenize_batch"):
        check_embedder(Batched(right=False))

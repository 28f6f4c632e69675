"""Conformance runners for side-task runners (``mlxcel.families.tasks``): what an
``embed`` or ``rerank`` runner must do to be served like the builtin family's.

``check_embedder(runner)``: ``tokenize`` gives ``Encoded`` ids within ``vocab_size``;
``embed`` gives one finite float32 vector of ``dimensions`` per input (a row per token for
``"none"``), in order, and the same vector for an input whatever else shares its batch
(core batches requests together). ``check_reranker(runner)``: one score in [0, 1] per
pair, in order, batch-invariant. Each raises ``AssertionError`` naming what failed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mlxcel.families.tasks import Encoded, resolved

TEXTS = ("a river runs past the quiet stone", "lantern",
         "orbit meadow signal copper harbor thread velvet summit ember glacier")


def _same(a: Any, b: Any, what: str, atol: float) -> None:
    assert np.allclose(a, b, atol=atol), f"{what} changes with the batch it runs in"


def check_embedder(runner: Any, texts: tuple[str, ...] = TEXTS, atol: float = 1e-4) -> None:
    encoded = [runner.tokenize(t) for t in texts]
    for enc in encoded:
        assert isinstance(enc, Encoded), "tokenize must return mlxcel.families.tasks.Encoded"
        assert 0 < len(enc) <= runner.max_length, "an input's tokens exceed max_length"
        assert all(0 <= t < runner.vocab_size for t in enc.ids), "token id out of range"
    batch = getattr(runner, "tokenize_batch", None)  # optional: core uses it where present
    if batch is not None:
        assert list(batch(list(texts))) == encoded, \
            "tokenize_batch must give what tokenize gives for each text, in order"
    for pooling in (runner.pooling, "none"):
        together = resolved(runner.embed(encoded, pooling))
        assert len(together) == len(encoded), "embed must return one array per input"
        for i, (vec, enc) in enumerate(zip(together, encoded, strict=True)):
            shape = (len(enc), None) if pooling == "none" else (runner.dimensions,)
            assert vec.dtype == np.float32, "embed must return float32 arrays"
            assert vec.shape[0] == shape[0], f"input {i}: shape {vec.shape}, want {shape}"
            assert np.isfinite(vec).all(), f"input {i}: non-finite values"
            alone = resolved(runner.embed([enc], pooling))[0]
            _same(vec, alone, f"input {i}'s {pooling} embedding", atol)


def check_reranker(runner: Any, query: str = "which river", docs: tuple[str, ...] = TEXTS,
                   atol: float = 1e-4) -> None:
    pairs = [runner.encode_pair(query, d) for d in docs]
    assert all(isinstance(p, Encoded) and len(p) <= runner.max_length for p in pairs), \
        "encode_pair must return Encoded within max_length"
    scores = resolved(runner.score(pairs))
    assert len(scores) == len(pairs), "score must return one score per pair"
    for i, score in enumerate(scores):
        assert 0.0 <= score <= 1.0, f"pair {i}: score {score} outside [0, 1]"
        _same(score, resolved(runner.score([pairs[i]]))[0], f"pair {i}'s score", atol)

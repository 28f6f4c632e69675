"""The family's runners pass mlxcel's side-task conformance runners (protocol, finite
float32 vectors, batch invariance, scores in [0, 1]) on tiny checkpoints of each kind."""

from __future__ import annotations

import pytest
from mlxcel.families.api import LoadOptions
from mlxcel.families.tasks import TaskOptions
from mlxcel.testing.conformance import check_embedder, check_reranker
from mlxcel_family_embeddings.load import load
from mlxcel_family_embeddings.runners import embedder, reranker

TEXTS = ("a river runs past the quiet stone", "lantern",
         "orbit meadow signal copper harbor thread velvet summit ember glacier")


@pytest.mark.parametrize("kind", ["bert", "qwen3"])
def test_embedders_and_rerankers_conform(side_checkpoint, kind):
    check_embedder(embedder(load(side_checkpoint("embedder", kind=kind),
                                 LoadOptions()), TaskOptions()), TEXTS)
    check_reranker(reranker(load(side_checkpoint("reranker", kind=kind),
                                 LoadOptions()), TaskOptions()), docs=TEXTS)

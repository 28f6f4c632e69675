"""Padded batch shapes (``shapes``): widths and row counts come from small bucket sets, a
mix of concurrent requests maps onto few shapes, and padding (rows and columns) never
changes a result: the GPU rule is run here on the CPU against each input run alone."""

from __future__ import annotations

import random

import mlx.core as mx
import numpy as np
import pytest
from mlxcel.families.api import LoadOptions
from mlxcel.families.tasks import Encoded, TaskOptions, resolved
from mlxcel_family_embeddings.load import load
from mlxcel_family_embeddings.runners import _batch, embedder, reranker
from mlxcel_family_embeddings.shapes import Shapes

GPU, CPU = Shapes.for_device(True), Shapes.for_device(False)
TEXTS = ["a river runs past the quiet stone", "lantern",
         "orbit meadow signal copper harbor thread velvet summit ember glacier"]


def _quarter_octaves(limit: int) -> list[int]:
    """The GPU width set, written out: multiples of 16 up to 64, then each octave
    (2^k, 2^(k+1)] in four equal steps."""
    widths, low = [16, 32, 48, 64], 64
    while low < limit:
        widths += [low + low // 4 * i for i in range(1, 5)]
        low *= 2
    return widths


def test_gpu_widths_are_quarter_octaves_and_pad_under_a_quarter():
    allowed = set(_quarter_octaves(8192))
    for n in range(1, 4097):
        w = GPU.width(n, cap=8192)
        assert w >= n and w in allowed, n
        assert (w - n < 16) if n <= 64 else (w - n) / n < 0.25, n
    assert [GPU.width(n, 8192) for n in (1, 17, 64, 65, 100, 128, 129, 200, 300)] == \
        [16, 32, 64, 80, 112, 128, 160, 224, 320]


def test_widths_stop_at_the_model_positions_and_cpu_pads_finely():
    assert GPU.width(500, cap=512) == 512 and GPU.width(100, cap=100) == 100
    assert all(CPU.width(n, 512) % 8 == 0 and 0 <= CPU.width(n, 512) - n < 8
               for n in range(1, 505))


def test_rows_round_to_powers_of_two_on_a_gpu_only():
    assert [GPU.row_count(n) for n in (1, 2, 3, 5, 9, 16, 17)] == [1, 2, 4, 8, 16, 16, 32]
    assert all(CPU.row_count(n) == n for n in range(1, 40))


def test_a_mix_of_concurrent_requests_maps_onto_few_shapes(side_checkpoint):
    """Sixty-four batches of 1 to 16 inputs of 90 to 110 tokens: without buckets nearly
    every batch is a shape of its own; with the GPU rule, 5 row counts x 2 widths."""
    model = load(side_checkpoint("embedder", kind="bert"), LoadOptions()).model
    rng = random.Random(0)
    batches = [[Encoded([5] * rng.randint(90, 110)) for _ in range(rng.randint(1, 16))]
               for _ in range(64)]
    exact = {(len(b), max(len(e) for e in b)) for b in batches}
    shapes = {tuple(_batch(model, b, GPU)[0].shape) for b in batches}
    assert len(shapes) <= 10 < len(exact)
    assert {rows for rows, _ in shapes} <= {1, 2, 4, 8, 16}
    assert {width for _, width in shapes} <= {96, 112}


def _alone(model, enc: Encoded, pooling: str) -> np.ndarray:
    """The input run by itself through the model: one row, its own width, no mask."""
    ids = mx.array([enc.ids])
    kw = {"token_type_ids": mx.array([enc.type_ids])} if enc.type_ids is not None else {}
    h = np.array(model.module(ids, **kw).last_hidden_state.astype(mx.float32))[0]
    return {"mean": h.mean(axis=0), "cls": h[0], "last": h[-1]}[pooling]


@pytest.mark.parametrize("kind,pooling", [("bert", "mean"), ("bert", "cls"),
                                          ("qwen3", "last")])
def test_padding_rows_and_columns_never_change_a_vector(side_checkpoint, kind, pooling):
    loaded = load(side_checkpoint("embedder", kind=kind, pooling=pooling), LoadOptions())
    runner = embedder(loaded, TaskOptions())
    encoded = [runner.tokenize(t) for t in TEXTS]
    alone = [_alone(loaded.model, e, pooling) for e in encoded]
    runner.shapes = GPU  # 3 rows -> 4, the width up to a bucket
    seen = []
    module = loaded.model.module

    def recording(ids, **kw):
        seen.append(ids.shape)
        return module(ids, **kw)

    loaded.model.module = recording
    try:
        got = resolved(runner.embed(encoded, pooling))
        rows = resolved(runner.embed(encoded, "none"))
    finally:
        loaded.model.module = module
    longest = max(len(e) for e in encoded)
    assert seen[0] == (4, GPU.width(longest, loaded.model.max_length)) and len(got) == 3
    for vec, ref in zip(got, alone, strict=True):
        assert np.allclose(vec, ref, atol=2e-4)
    assert [r.shape[0] for r in rows] == [len(e) for e in encoded]


def test_padding_never_changes_a_rerank_score(side_checkpoint):
    for kind in ("bert", "qwen3"):
        loaded = load(side_checkpoint("reranker", kind=kind), LoadOptions())
        runner = reranker(loaded, TaskOptions())
        pairs = [runner.encode_pair("which river", t) for t in TEXTS]
        runner.shapes = Shapes(coarse=False, rows=False)  # one row, 8 columns at most
        alone = [resolved(runner.score([p]))[0] for p in pairs]
        runner.shapes = GPU
        got = resolved(runner.score(pairs))
        assert len(got) == 3 and np.allclose(got, alone, atol=1e-5), kind
    assert mx.default_device().type == mx.DeviceType.cpu  # the rule is forced, not found

"""The BERT embedder and cross-encoder against a NumPy forward of Hugging Face's BERT, read
straight from the checkpoint's safetensors: an independent reference for the weight names
the tiny checkpoints are written under, the padding mask, the pooling and the sigmoid, which
comparing the runner with its own model would not check."""

from __future__ import annotations

import math

import numpy as np
import pytest
from mlxcel.families.api import LoadOptions
from mlxcel.families.tasks import TaskOptions, resolved
from mlxcel_family_embeddings.load import load, max_positions
from mlxcel_family_embeddings.runners import embedder, reranker
from safetensors.numpy import load_file

TEXTS = ["a river runs past the quiet stone", "lantern",
         "orbit meadow signal copper harbor thread velvet summit ember glacier"]
_erf = np.vectorize(math.erf)


def _norm(x: np.ndarray, w: dict, name: str, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w[f"{name}.weight"] + w[f"{name}.bias"]


def _linear(x: np.ndarray, w: dict, name: str) -> np.ndarray:
    return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]


def bert_forward(w: dict, config: dict, ids: list[int], types: list[int]) -> np.ndarray:
    """HF ``BertModel``'s last hidden state [T, D] for one unpadded input, in float64."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    eps, heads = config["layer_norm_eps"], config["num_attention_heads"]
    h = (w["embeddings.word_embeddings.weight"][ids]
         + w["embeddings.position_embeddings.weight"][np.arange(len(ids))]
         + w["embeddings.token_type_embeddings.weight"][types])
    h = _norm(h, w, "embeddings.LayerNorm", eps)
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}"
        q, k, v = (_linear(h, w, f"{p}.attention.self.{n}").reshape(len(ids), heads, -1)
                   .transpose(1, 0, 2) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        ctx = (probs / probs.sum(-1, keepdims=True) @ v).transpose(1, 0, 2).reshape(len(ids), -1)
        h = _norm(_linear(ctx, w, f"{p}.attention.output.dense") + h, w,
                  f"{p}.attention.output.LayerNorm", eps)
        inner = _linear(h, w, f"{p}.intermediate.dense")
        inner = 0.5 * inner * (1 + _erf(inner / math.sqrt(2)))
        h = _norm(_linear(inner, w, f"{p}.output.dense") + h, w, f"{p}.output.LayerNorm", eps)
    return h


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_bert_vectors_match_a_numpy_bert(side_checkpoint, pooling):
    path = side_checkpoint("embedder", kind="bert", pooling=pooling)
    loaded = load(path, LoadOptions(dtype="float32"))
    runner = embedder(loaded, TaskOptions())
    weights = load_file(str(path / "model.safetensors"))
    encoded = [runner.tokenize(t) for t in TEXTS]
    assert [e.ids[0] for e in encoded] == [loaded.tokenizer.token_to_id("[CLS]")] * 3
    for vec, enc in zip(resolved(runner.embed(encoded, pooling)), encoded, strict=True):
        h = bert_forward(weights, loaded.config, enc.ids, enc.type_ids)
        ref = h.mean(axis=0) if pooling == "mean" else h[0]
        assert vec.dtype == np.float32 and np.allclose(vec, ref, atol=1e-4)


def test_cross_encoder_scores_match_a_numpy_classifier(side_checkpoint):
    path = side_checkpoint("reranker", kind="bert")
    loaded = load(path, LoadOptions(dtype="float32"))
    runner = reranker(loaded, TaskOptions())
    raw = load_file(str(path / "model.safetensors"))
    weights = {k.removeprefix("bert."): v.astype(np.float64) for k, v in raw.items()}
    pairs = [runner.encode_pair("which river runs past the stone", t) for t in TEXTS]
    for pair, score in zip(pairs, resolved(runner.score(pairs)), strict=True):
        h = bert_forward(weights, loaded.config, pair.ids, pair.type_ids)
        pooled = np.tanh(_linear(h[0], weights, "pooler.dense"))
        logit = float(_linear(pooled, weights, "classifier")[0])
        assert 0.0 <= score <= 1.0 and score == pytest.approx(1 / (1 + math.exp(-logit)),
                                                              abs=1e-5)


def test_max_length_is_the_usable_positions_capped_by_the_flag():
    assert max_positions({"model_type": "bert", "max_position_embeddings": 512}) == 512
    xlmr = {"model_type": "xlm-roberta", "max_position_embeddings": 514, "pad_token_id": 1}
    assert max_positions(xlmr) == 512  # positions start at pad_token_id + 1
    assert max_positions({"model_type": "qwen3", "max_position_embeddings": 40960}) == 40960


def test_runner_max_length_caps(side_checkpoint):
    loaded = load(side_checkpoint("embedder", kind="qwen3"), LoadOptions())
    loaded.model.max_length = 40960  # a Qwen3-Embedding's window
    assert embedder(loaded, TaskOptions()).max_length == 8192
    assert embedder(loaded, TaskOptions(max_length=100000)).max_length == 40960
    assert embedder(loaded, TaskOptions(max_length=300)).max_length == 300

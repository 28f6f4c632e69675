"""The family's runners on tiny random-weight checkpoints built with the real model
classes: pooling, padding and Dense against a NumPy reference from the same weights (each
input run alone, unpadded, through the model), scores against sigmoid of the model's own
logits, and the side-task conformance runners."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from mlxcel.families.api import LoadOptions
from mlxcel.families.tasks import TaskOptions, resolved
from mlxcel.testing.imports import imported_by
from mlxcel_family_embeddings import detect
from mlxcel_family_embeddings.load import load
from mlxcel_family_embeddings.runners import embedder, reranker

TEXTS = ["a river runs past the quiet stone", "lantern",
         "orbit meadow signal copper harbor thread velvet summit ember glacier"]


@pytest.mark.parametrize("kind", ["bert", "qwen3"])
def test_tokenize_batch_is_tokenize_on_each_text(side_checkpoint, kind):
    runner = embedder(load(side_checkpoint("embedder", kind=kind), LoadOptions()),
                      TaskOptions())
    assert runner.tokenize_batch(TEXTS) == [runner.tokenize(t) for t in TEXTS]
    if kind == "qwen3":  # the EOS the vector is read at, added by both
        assert all(e.ids[-1] == runner.model.eos_id for e in runner.tokenize_batch(TEXTS))


def _hidden(model, enc) -> np.ndarray:
    """The model's last hidden state for one input alone: no padding, no mask."""
    ids = mx.array([enc.ids])
    types = mx.array([enc.type_ids]) if enc.type_ids is not None else None
    out = model.module(ids, token_type_ids=types) if types is not None else model.module(ids)
    return np.array(out.last_hidden_state.astype(mx.float32))[0].astype(np.float64)


def _pool(h: np.ndarray, pooling: str) -> np.ndarray:
    return {"mean": h.mean(axis=0), "cls": h[0], "last": h[-1]}[pooling]


@pytest.mark.parametrize("kind,pooling,dense", [
    ("bert", "mean", False), ("bert", "cls", True), ("qwen3", "last", False)])
def test_pooled_vectors_match_a_numpy_reference(side_checkpoint, kind, pooling, dense):
    path = side_checkpoint("embedder", kind=kind, pooling=pooling, dense=dense)
    loaded = load(path, LoadOptions())
    runner = embedder(loaded, TaskOptions())
    assert runner.pooling == pooling
    encoded = [runner.tokenize(t) for t in TEXTS]
    got = resolved(runner.embed(encoded, pooling))  # one padded batch
    for vec, enc in zip(got, encoded, strict=True):
        ref = _pool(_hidden(loaded.model, enc), pooling)
        if dense:
            from safetensors.numpy import load_file

            w = load_file(str(path / "2_Dense" / "model.safetensors"))
            ref = np.tanh(ref @ w["linear.weight"].T.astype(np.float64) + w["linear.bias"])
        assert vec.shape == ref.shape and np.allclose(vec, ref, atol=2e-4)


def test_decoder_embedders_read_the_appended_eos_token(side_checkpoint):
    loaded = load(side_checkpoint("embedder", kind="qwen3"), LoadOptions())
    enc = embedder(loaded, TaskOptions()).tokenize("lantern")
    assert enc.ids[-1] == loaded.model.eos_id and enc.type_ids is None


def test_token_rows_for_pooling_none_and_the_pooling_flag(side_checkpoint):
    loaded = load(side_checkpoint("embedder", kind="bert"), LoadOptions())
    runner = embedder(loaded, TaskOptions(pooling="cls", max_length=20))
    assert runner.pooling == "cls" and runner.max_length == 20
    enc = runner.tokenize(TEXTS[0])
    rows = resolved(runner.embed([enc, runner.tokenize(TEXTS[1])], "none"))[0]
    assert np.allclose(rows, _hidden(loaded.model, enc), atol=2e-4)
    with pytest.raises(ValueError, match="reranker"):
        embedder(loaded, TaskOptions(pooling="rank"))


def test_cross_encoder_scores_are_the_sigmoid_of_its_logit(side_checkpoint):
    loaded = load(side_checkpoint("reranker", kind="bert"), LoadOptions())
    runner = reranker(loaded, TaskOptions())
    pairs = [runner.encode_pair("which river", t) for t in TEXTS]
    assert pairs[0].type_ids is not None and 1 in pairs[0].type_ids  # the document's type
    for pair, score in zip(pairs, resolved(runner.score(pairs)), strict=True):
        logit = loaded.model.module(mx.array([pair.ids]),
                                    token_type_ids=mx.array([pair.type_ids])).logits
        assert score == pytest.approx(1 / (1 + np.exp(-float(logit[0, 0]))), abs=1e-5)


def test_qwen3_reranker_scores_yes_against_no_at_the_last_token(side_checkpoint):
    loaded = load(side_checkpoint("reranker", kind="qwen3"), LoadOptions())
    runner = reranker(loaded, TaskOptions())
    tok = loaded.tokenizer
    pairs = [runner.encode_pair("which river", t) for t in TEXTS]
    assert tok.decode(pairs[0].ids, skip_special_tokens=False).endswith("</think>\n\n")
    for pair, score in zip(pairs, resolved(runner.score(pairs)), strict=True):
        last = np.array(loaded.model.module(mx.array([pair.ids]))[0, -1].astype(mx.float32))
        margin = last[tok.token_to_id("yes")] - last[tok.token_to_id("no")]
        assert score == pytest.approx(1 / (1 + np.exp(-margin)), abs=1e-5)


def _config_dir(tmp_path, name, config, modules=None):
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    if modules is not None:
        (path / "modules.json").write_text(json.dumps(modules))
    return path


def test_check_and_tasks_of_read_only_the_config(tmp_path):
    pooling = [{"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    cases = {
        "bert": ({"model_type": "bert", "architectures": ["BertModel"]}, None, ("embed",)),
        "cross": ({"model_type": "xlm-roberta", "num_labels": 1,
                   "architectures": ["XLMRobertaForSequenceClassification"]}, None, ("rerank",)),
        "qwen3-emb": ({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}, pooling,
                      ("embed",)),
        "Qwen3-Reranker-0.6B": ({"model_type": "qwen3",
                                 "architectures": ["Qwen3ForCausalLM"]}, None, ("rerank",)),
    }
    for name, (config, modules, tasks) in cases.items():
        path = _config_dir(tmp_path, name, config, modules)
        assert detect.check(path, config) is True, name
        assert detect.tasks_of(path, config) == tasks, name
    chat = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
    reason = detect.check(_config_dir(tmp_path, "Qwen3-8B", chat), chat)
    assert isinstance(reason, str) and "chat model" in reason
    multi = {"model_type": "bert", "num_labels": 3,
             "architectures": ["BertForSequenceClassification"]}
    assert "more than one label" in detect.check(_config_dir(tmp_path, "nli", multi), multi)


def test_the_entry_point_imports_nothing_heavy():
    assert imported_by("import mlxcel_family_embeddings.plugin",
                       ("mlx", "mlx_vlm", "numpy", "tokenizers")) == []

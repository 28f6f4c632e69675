"""The ``embed`` and ``rerank`` runners (``mlxcel.families.tasks``): tokenize on the HTTP
side, run padded batches on the engine thread. Each batch is queued on the device and
returned as a ``Later``, so the lane builds the next batch while the device runs this one.

Rows are padded on the right with the model's pad id and an attention mask, and each
row's pooling reads only its own tokens (last-token pooling takes its last real token),
so a row's result does not depend on the rows batched with it. A batch's rows and width
are rounded up to the buckets of ``shapes`` (few distinct shapes on a GPU, where each new
one compiles); the padding rows' results are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np
from mlxcel.families.api import Loaded
from mlxcel.families.tasks import Encoded, Later, TaskOptions

from mlxcel_family_embeddings.shapes import Shapes, on_gpu

MAX_LENGTH_CAP = 8192
RERANK_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
RERANK_PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based "
                 "on the Query and the Instruct provided. Note that the answer can only be "
                 "\"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
RERANK_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def _max_length(model: Any, options: TaskOptions) -> int:
    """``--embedding-max-length`` within the model's positions; unset: the model's,
    capped at ``MAX_LENGTH_CAP``."""
    ceiling = min(model.max_length, MAX_LENGTH_CAP)
    return min(options.max_length, model.max_length) if options.max_length > 0 else ceiling


def _batch(model: Any, inputs: Sequence[Encoded], shapes: Shapes
           ) -> tuple[mx.array, mx.array, mx.array, np.ndarray]:
    """(ids, attention mask, type ids, lengths) of the rows padded on the right, in the
    bucketed shape: rows past ``len(inputs)`` repeat the first input."""
    rows = [*inputs, *[inputs[0]] * (shapes.row_count(len(inputs)) - len(inputs))]
    lengths = np.array([len(e.ids) for e in rows])
    width = shapes.width(int(lengths.max()), model.max_length)
    ids = np.full((len(rows), width), model.pad_id, dtype=np.int32)
    types = np.zeros((len(rows), width), dtype=np.int32)
    for row, enc in enumerate(rows):
        ids[row, :len(enc.ids)] = enc.ids
        if enc.type_ids is not None:
            types[row, :len(enc.type_ids)] = enc.type_ids
    mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int32)
    return mx.array(ids), mx.array(mask), mx.array(types), lengths


def pool(hidden: mx.array, mask: mx.array, lengths: np.ndarray, pooling: str) -> mx.array:
    """Pooled rows [B, D] of ``hidden`` [B, T, D] by ``pooling`` (mean, cls, last)."""
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "last":
        return hidden[mx.arange(hidden.shape[0]), mx.array(lengths - 1)]
    weights = mask[..., None].astype(hidden.dtype)
    return (hidden * weights).sum(axis=1) / mx.maximum(weights.sum(axis=1), 1)


class Embedder:
    """An embedder's runner: encoders (mean/CLS pooling) and decoders (last token)."""

    def __init__(self, loaded: Loaded, options: TaskOptions) -> None:
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.pooling = options.pooling or self.model.pooling
        if self.pooling == "rank":
            raise ValueError("--pooling rank is a reranker's; this checkpoint is an embedder")
        self.max_length = _max_length(self.model, options)
        owned = getattr(self.model.module, "dense", None)
        self.dense = list(owned) if isinstance(owned, list) else self.model.dense
        self.vocab_size = int(loaded.config.get("vocab_size") or
                              self.tokenizer.get_vocab_size())
        hidden = int(loaded.config.get("hidden_size") or 0)
        last = self.dense[-1].weight.shape[0] if self.dense else hidden
        self.dimensions = int(last)
        self.shapes = Shapes.for_device(on_gpu())  # built on the engine thread

    def tokenize(self, text: str) -> Encoded:
        return self._encoded(self.tokenizer.encode(text))

    def tokenize_batch(self, texts: Sequence[str]) -> list[Encoded]:
        return [self._encoded(enc) for enc in self.tokenizer.encode_batch(list(texts))]

    def tokenize_piece(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def _encoded(self, enc: Any) -> Encoded:
        ids = list(enc.ids)
        if self.model.append_eos and self.model.eos_id is not None \
                and (not ids or ids[-1] != self.model.eos_id):
            ids.append(self.model.eos_id)  # the embedding is read at this token
        types = list(enc.type_ids) if self.model.token_types else None
        return Encoded(ids, types[:len(ids)] if types is not None else None)

    def embed(self, inputs: Sequence[Encoded], pooling: str) -> Later:
        ids, mask, types, lengths = _batch(self.model, inputs, self.shapes)
        out = self.model.module(ids, attention_mask=mask, token_type_ids=types)
        hidden = out.last_hidden_state.astype(mx.float32)
        n = len(inputs)
        if pooling == "none":
            rows = hidden[:n]
            mx.async_eval(rows)
            return Later(lambda: [r[:k] for r, k in zip(np.array(rows), lengths[:n],
                                                         strict=True)])
        pooled = pool(hidden, mask, lengths, pooling)[:n]
        for layer in self.dense:
            pooled = layer(pooled.astype(layer.weight.dtype)).astype(mx.float32)
        mx.async_eval(pooled)
        return Later(lambda: list(np.array(pooled, dtype=np.float32)))


class Reranker:
    """A reranker's runner: a cross-encoder's sigmoid(logit), or a generative reranker's
    sigmoid(logit(yes) - logit(no)) at the last position."""

    def __init__(self, loaded: Loaded, options: TaskOptions) -> None:
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.max_length = _max_length(self.model, options)
        if self.model.kind == "generative":
            self.yes = self.tokenizer.token_to_id("yes")
            self.no = self.tokenizer.token_to_id("no")
            if self.yes is None or self.no is None:
                raise ValueError("a generative reranker needs 'yes' and 'no' tokens")
        elif self.model.kind != "cross":
            raise ValueError("this checkpoint is an embedder, not a reranker")
        self.shapes = Shapes.for_device(on_gpu())  # built on the engine thread

    def encode_pair(self, query: str, document: str) -> Encoded:
        if self.model.kind == "cross":
            enc = self.tokenizer.encode(query, document)
            return Encoded(list(enc.ids),
                           list(enc.type_ids) if self.model.token_types else None)
        text = (f"{RERANK_PREFIX}<Instruct>: {RERANK_INSTRUCTION}\n<Query>: {query}\n"
                f"<Document>: {document}{RERANK_SUFFIX}")
        return Encoded(list(self.tokenizer.encode(text, add_special_tokens=False).ids))

    def score(self, pairs: Sequence[Encoded]) -> Later:
        ids, mask, types, lengths = _batch(self.model, pairs, self.shapes)
        if self.model.kind == "cross":
            logits = self.model.module(ids, attention_mask=mask, token_type_ids=types).logits
            margin = logits.astype(mx.float32)[:, 0]
        else:  # causal: right padding never reaches a row's real tokens
            logits = self.model.module(ids)
            last = logits[mx.arange(ids.shape[0]), mx.array(lengths - 1)].astype(mx.float32)
            margin = last[:, self.yes] - last[:, self.no]
        scores = mx.sigmoid(margin[:len(pairs)])
        mx.async_eval(scores)
        return Later(lambda: np.array(scores).tolist())


def embedder(loaded: Loaded, options: TaskOptions) -> Embedder:
    return Embedder(loaded, options)


def reranker(loaded: Loaded, options: TaskOptions) -> Reranker:
    return Reranker(loaded, options)

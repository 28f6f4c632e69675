"""The lean decode forward (``mlxcel.engine.accel.lean_decode``) of mlx-lm's ``gemma4_text``.

It mirrors ``gemma4_text.Model`` / ``Gemma4TextModel`` / ``DecoderLayer`` / ``Attention``
for one column on [B, D] activations: the embedding scale, the per-layer inputs (2B/4B
models), one mask per layer type, KV-shared layers reading their source layer's keys,
values and offset, the MoE block (26B), the per-layer input gate, the layer scalar, the
final soft cap. The sequence axis's reshapes, transposes, flattens and per-layer slices
go; the modules, caches and attention function are the model's own.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import mlx.core as mx
import mlx.nn as nn


def decoder(model: Any) -> Any | None:
    """The lean forward of a ``gemma4_text.Model``, or None for another class."""
    if type(model).__module__ != "mlx_lm.models.gemma4_text" \
            or type(model).__name__ != "Model":
        return None
    module = sys.modules[type(model).__module__]
    inner = model.model
    layers = inner.layers
    if not layers or any(type(layer).__name__ != "DecoderLayer" for layer in layers):
        return None
    per_layer = bool(inner.hidden_size_per_layer_input)
    n, width = len(layers), inner.hidden_size_per_layer_input
    head = inner.embed_tokens.as_linear if model.tie_word_embeddings else model.lm_head
    softcap = model.final_logit_softcapping
    window = inner.window_size
    plan = []
    for layer, source in zip(layers, inner.previous_kvs, strict=True):
        attn = layer.self_attn
        plan.append((layer, attn, source, layer.layer_type,
                     attn.use_k_eq_v if attn.has_kv else False))

    def forward(tokens: mx.array, cache: list[Any]) -> mx.array:
        b = tokens.shape[0]
        h = inner.embed_tokens(tokens) * inner.embed_scale
        if per_layer:
            got = (inner.embed_tokens_per_layer(tokens)
                   * inner.embed_tokens_per_layer_scale).reshape(b, n, width)
            proj = (inner.per_layer_model_projection(h)
                    * inner.per_layer_projection_scale).reshape(b, n, width)
            inputs = (inner.per_layer_projection_norm(proj) + got) \
                * inner.per_layer_input_scale
        caches = list(cache) + [None] * (n - len(cache))
        column = SimpleNamespace(shape=(b, 1))  # what create_attention_mask reads of h
        masks: dict[str, Any] = {}
        attend = module.scaled_dot_product_attention  # looked up: install() may wrap it
        kvs: list[Any] = [None] * n
        for i, ((layer, attn, source, kind, k_is_v), c) in enumerate(
                zip(plan, caches, strict=True)):
            if kind not in masks:
                masks[kind] = module.create_attention_mask(
                    column, c, window_size=window if kind == "sliding_attention" else None)
            residual = h
            x = layer.input_layernorm(h)
            q = attn.q_norm(attn.q_proj(x).reshape(b, attn.n_heads, 1, attn.head_dim))
            if kvs[source] is not None and source != i:
                keys, values, offset = kvs[source]
            else:
                keys = attn.k_proj(x).reshape(b, attn.n_kv_heads, 1, attn.head_dim)
                values = keys if k_is_v else \
                    attn.v_proj(x).reshape(b, attn.n_kv_heads, 1, attn.head_dim)
                offset = mx.array(c.offset) if c is not None else 0
                keys = attn.rope(attn.k_norm(keys), offset=offset)
                values = attn.v_norm(values)
            q = attn.rope(q, offset=offset)
            if c is not None:
                keys, values = c.update_and_fetch(keys, values)
            kvs[i] = (keys, values, offset)
            out = attend(q, keys, values, cache=c, scale=attn.scale, mask=masks[kind])
            h = residual + layer.post_attention_layernorm(attn.o_proj(out.reshape(b, -1)))
            residual = h
            if layer.enable_moe:
                h1 = layer.post_feedforward_layernorm_1(
                    layer.mlp(layer.pre_feedforward_layernorm(h)))
                top_i, top_w = layer.router(h)
                h2 = layer.post_feedforward_layernorm_2(
                    layer.experts(layer.pre_feedforward_layernorm_2(h), top_i, top_w))
                h = h1 + h2
            else:
                h = layer.mlp(layer.pre_feedforward_layernorm(h))
            h = residual + layer.post_feedforward_layernorm(h)
            if layer.per_layer_input_gate is not None and per_layer:
                gate = nn.gelu_approx(layer.per_layer_input_gate(h)) * inputs[:, i, :]
                h = h + layer.post_per_layer_input_norm(layer.per_layer_projection(gate))
            if layer.layer_scalar is not None:
                h = h * layer.layer_scalar
        out = head(inner.norm(h))
        return out if softcap is None else module.logit_softcap(softcap, out)

    return forward

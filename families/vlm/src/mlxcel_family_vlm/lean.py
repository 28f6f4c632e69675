"""The lean decode step of Qwen-VL language models (``lean_decoder``; the engine's
``mlxcel.engine.accel.lean_decode``).

mlx-vlm's Qwen2-VL and Qwen2.5-VL language models are Llama-shaped but for their rotary
embedding (M-RoPE), so core's mirror of Llama-shaped layers runs them on [B, D]
activations, without the views the sequence axis costs, given the rotation. Every token a
decode step feeds is text, whose three M-RoPE positions (time, height, width) are equal:
its index in the row plus the row's shift (an image row's rope delta). The rotation is the
model's own, computed as its language model computes it: the cos/sin tables once a step
from those positions ([3, B, 1], each row's offset plus its shift), then mlx-vlm's own
apply in every layer (or its fused apply where it has one), so the lean step computes the
same products in the same dtypes and rounds as the model's forward does; only the views
go.

The rule: the language model's layers are exactly the classes of a module listed in
``LAYOUTS``, their rotary embeddings alike, and the engine's check (one decode step of
both forwards agrees) passes; anything else decodes through the model's own forward.
"""

from __future__ import annotations

import sys
from typing import Any

import mlx.core as mx

# mlx-vlm language modules whose decoder layer / attention / rotary embedding this reads
LAYOUTS = {"mlx_vlm.models.qwen2_vl.language": "Qwen2VLDecoderLayer",
           "mlx_vlm.models.qwen2_5_vl.language": "Qwen2VLDecoderLayer"}


def lean_decoder(language: Any) -> Any | None:
    """The lean decode forward for mlx-vlm's ``language`` model (see the module
    docstring), or None where its layout is not one listed."""
    from mlxcel.engine.accel.lean_decode import mirrored

    name = type(language).__module__
    module = sys.modules.get(name)
    inner = getattr(language, "model", None)
    layers = getattr(inner, "layers", None)
    if name not in LAYOUTS or not layers:
        return None
    rotary = None
    for layer in layers:
        attn = getattr(layer, "self_attn", None)
        if type(layer).__module__ != name or type(layer).__name__ != LAYOUTS[name] \
                or type(attn).__name__ != "Attention":
            return None
        emb = attn.rotary_emb  # the first layer's rotates every layer, as in mlx-vlm
        rotary = rotary or emb
        if type(emb) is not type(rotary) or (emb.dim, emb.base) != (rotary.dim, rotary.base):
            return None
    if not hasattr(module, "apply_multimodal_rotary_pos_emb"):
        return None
    apply = module.apply_multimodal_rotary_pos_emb

    def rotation(offset: Any, h: mx.array):
        rows = h.shape[0]
        if not isinstance(offset, mx.array) or offset.ndim == 0:
            offset = mx.full((rows,), offset, dtype=mx.int32)
        positions = mx.broadcast_to(offset.reshape(1, rows, 1), (3, rows, 1))
        if rotary.fused_apply:  # as mlx-vlm's layers do: the rotation fused per layer
            return lambda q, k: rotary.apply_rotary(q, k, positions, unsqueeze_dim=1)
        cos, sin = rotary(h, positions)
        return lambda q, k: apply(q, k, cos, sin, unqueeze_dim=1)

    head = inner.embed_tokens.as_linear if language.args.tie_word_embeddings \
        else language.lm_head
    return mirrored(inner, head, module, rotation=rotation)


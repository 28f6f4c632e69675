"""The lean decode step of Qwen-VL language models (``lean_decoder``; the engine's
``mlxcel.engine.accel.lean_decode``).

Every token a decode step feeds is text, and a text token's three M-RoPE positions (time,
height, width) are equal: its index in the row plus the row's shift (an image row's rope
delta). With equal positions every section of M-RoPE turns each frequency pair by the
same angle, which is plain RoPE at that position: the non-traditional pairing and the
model's base, the pairs of every section at the frequency the whole head gives them. So
the step is core's mirror of Llama-shaped layers with ``mx.fast.rope`` at each row's
offset plus its shift: one kernel per rotation, where mlx-vlm builds cos/sin tables from
three position rows and rotates the halves by hand in every layer, and the module views
of a [B, 1, D] input drop out as in core's own mirrors.

The rule: the language model's layers are exactly the classes of a module listed in
``LAYOUTS`` (mlx-vlm's Qwen2-VL and Qwen2.5-VL), each rotary embedding is M-RoPE's
``chunked`` style without scaling, and the engine's check (one decode step of both
forwards agrees) passes; anything else decodes through the model's own forward.
"""

from __future__ import annotations

import sys
from typing import Any

import mlx.core as mx

# mlx-vlm language modules whose decoder layer / attention / rotary embedding this reads
LAYOUTS = {"mlx_vlm.models.qwen2_vl.language": "Qwen2VLDecoderLayer",
           "mlx_vlm.models.qwen2_5_vl.language": "Qwen2VLDecoderLayer"}
PLAIN_SCALING = (None, "default", "mrope")  # rope_scaling types that scale no angle


def lean_decoder(language: Any) -> Any | None:
    """The lean decode forward for mlx-vlm's ``language`` model (see the module
    docstring), or None where its layout is not one listed."""
    from mlxcel.engine.accel.lean_decode import mirrored

    name = type(language).__module__
    inner = getattr(language, "model", None)
    layers = getattr(inner, "layers", None)
    if name not in LAYOUTS or not layers or not _plain(language):
        return None
    rotary = None
    for layer in layers:
        attn = getattr(layer, "self_attn", None)
        if type(layer).__module__ != name or type(layer).__name__ != LAYOUTS[name] \
                or type(attn).__name__ != "Attention":
            return None
        emb = attn.rotary_emb
        if getattr(emb, "style", None) != "chunked" or emb.attention_scaling != 1.0:
            return None
        rotary = rotary or emb
        if (emb.dim, emb.base) != (rotary.dim, rotary.base):
            return None
    dims, base = int(rotary.dim), float(rotary.base)

    def rope(x: mx.array, offset: Any) -> mx.array:
        return mx.fast.rope(x, dims, traditional=False, base=base, scale=1.0, offset=offset)

    head = inner.embed_tokens.as_linear if language.args.tie_word_embeddings \
        else language.lm_head
    return mirrored(inner, head, sys.modules[name], rope=rope)


def _plain(language: Any) -> bool:
    """Whether the language model's rope scaling changes no angle."""
    scaling = getattr(language.args, "rope_scaling", None) or {}
    kind = scaling.get("type", scaling.get("rope_type")) if isinstance(scaling, dict) else None
    return kind in PLAIN_SCALING

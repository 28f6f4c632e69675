"""A decode step's forward on [B, D] activations, for the Llama-shaped layers listed here.

mlx-lm's forward takes [B, L] tokens. In a decode step L is 1, yet every layer still
reshapes and transposes its queries, keys, values and attention output to and from the
sequence axis, every projection of a [B, 1, D] input flattens it and unflattens its
product around the matmul, and the logits are sliced out of [B, 1, V]: about a third of
a Llama-shaped step's graph nodes, computing nothing. Where the host builds and encodes
every node of every step while the device waits (CUDA), those nodes are part of each
step's time. ``decoder(model)`` runs the same computation with the sequence axis dropped:
the same modules (projections, fused or not, norms, RoPE, the MLP), the cache's own
``update_and_fetch`` and ``make_mask``, and the attention function of the model's
mlx-lm module (``mlxcel.engine.accel.attention`` may wrap it), so only the views change.

The rule: a model takes this path only where its top-level class and every layer's class
are exactly those of a module whose ``__call__`` code is mirrored here (``LAYOUTS``: Llama,
Qwen2 and Qwen3 with every layer on full attention), and where one decode step of both
forwards from the same prefilled caches agrees (``forward_for``, at setup); otherwise
``generic(model)`` is used. On by default on CUDA only (``EnginePolicy.lean_decode``,
``--lean-decode``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import structlog

log = structlog.get_logger("mlxcel.engine")

Forward = Callable[[mx.array, list[Any]], mx.array]  # tokens [B], caches -> logits [B, V]
Check = Callable[[], tuple[list[Any], mx.array]]  # fresh prefilled caches, the next tokens

# mlx-lm modules whose Model / TransformerBlock / Attention / MLP this path mirrors; the
# flag says whether the attention normalises queries and keys per head (q_norm / k_norm)
LAYOUTS = {"mlx_lm.models.llama": False, "mlx_lm.models.qwen2": False,
           "mlx_lm.models.qwen3": True}


def generic(model: Any) -> Forward:
    """The model's own forward over one column: what every model decodes with."""

    def forward(tokens: mx.array, cache: list[Any]) -> mx.array:
        return model(tokens[:, None], cache)[:, -1, :]

    return forward


def _network(model: Any) -> Any:
    """The mlx-lm module behind ``model`` (an ``nn.Module``, or an engine wrapper holding
    one as ``.model``, as ``TextModel`` does)."""
    return model if isinstance(model, nn.Module) else getattr(model, "model", None)


def _layout(model: Any) -> bool | None:
    """``LAYOUTS``' flag for the mlx-lm ``model``, or None where the path does not apply."""
    name = type(model).__module__
    if name not in LAYOUTS or type(model).__name__ != "Model":
        return None
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not layers or getattr(inner, "swa_idx", None) is not None \
            or getattr(inner, "pipeline_size", 1) != 1:
        return None  # a sliding-window layer reads another mask; a pipeline rank sends
    for layer in layers:
        if layer is None or type(layer).__module__ != name \
                or type(layer).__name__ != "TransformerBlock" \
                or type(layer.self_attn).__name__ != "Attention" \
                or type(layer.mlp).__name__ != "MLP":
            return None
    return LAYOUTS[name]


def decoder(model: Any) -> Forward | None:
    """The lean forward for ``model`` (see the module docstring), or None where its layout
    is not one mirrored here. Built once the model's structure is final (after fused
    projections and bound submodules): each layer's callables are looked up here, once."""
    model = _network(model)
    norms = _layout(model) if model is not None else None
    if norms is None:
        return None
    module = sys.modules[type(model).__module__]
    inner = model.model
    embed, final_norm = inner.embed_tokens, inner.norm
    head = embed.as_linear if model.args.tie_word_embeddings else model.lm_head
    plan = []
    for layer in inner.layers:
        attn = layer.self_attn
        plan.append((layer.input_layernorm, attn.q_proj, attn.k_proj, attn.v_proj,
                     attn.q_norm if norms else None, attn.k_norm if norms else None,
                     attn.rope, attn.o_proj, attn.n_heads, attn.n_kv_heads, attn.scale,
                     layer.post_attention_layernorm, layer.mlp))

    def forward(tokens: mx.array, cache: list[Any]) -> mx.array:
        b = tokens.shape[0]
        h = embed(tokens)
        mask = module.create_attention_mask(SimpleNamespace(shape=(b, 1)), cache[0])
        attend = module.scaled_dot_product_attention  # looked up: install() may wrap it
        for (in_norm, q_proj, k_proj, v_proj, q_norm, k_norm, rope, o_proj, heads,
             kv_heads, scale, post_norm, mlp), c in zip(plan, cache, strict=True):
            x = in_norm(h)
            q = q_proj(x).reshape(b, heads, 1, -1)  # [B, 1, H, D] transposed, for L = 1
            k = k_proj(x).reshape(b, kv_heads, 1, -1)
            v = v_proj(x).reshape(b, kv_heads, 1, -1)
            if q_norm is not None:
                q, k = q_norm(q), k_norm(k)
            offset = c.offset
            q, k = rope(q, offset=offset), rope(k, offset=offset)
            k, v = c.update_and_fetch(k, v)
            out = attend(q, k, v, cache=c, scale=scale, mask=mask)
            h = h + o_proj(out.reshape(b, -1))
            h = h + mlp(post_norm(h))
        return head(final_norm(h))

    return forward


def agrees(model: Any, lean: Forward, check: Check) -> bool:
    """Whether one decode step of ``lean`` gives the logits of the model's own forward, each
    from its own ``check()`` (fresh caches holding the same prompts, and the next tokens).
    The tolerance covers a different kernel order in low precision; a step that fails
    disagrees."""
    try:
        caches, tokens = check()
        want = generic(model)(tokens, caches).astype(mx.float32)
        caches, tokens = check()
        got = lean(tokens, caches).astype(mx.float32)
        scale = mx.max(mx.abs(want)).item() or 1.0
        tol = 1e-4 if _precise(model) else 3e-2
        return bool(mx.max(mx.abs(want - got)).item() <= tol * scale)
    except Exception as exc:  # a layout this mirror gets wrong: the model's own forward
        log.warning("lean_decode_check_failed", error=f"{type(exc).__name__}: {exc}")
        return False


def _precise(model: Any) -> bool:
    """Whether ``model`` computes in float32 (its final norm's weight does)."""
    norm = getattr(getattr(_network(model), "model", None), "norm", None)
    weight = getattr(norm, "weight", None)
    return weight is not None and weight.dtype == mx.float32


def forward_for(model: Any, lean: bool, checks: list[Check]) -> tuple[Forward, bool]:
    """The forward the engine decodes ``model`` with and whether it is the lean one:
    ``lean`` asked, the layout mirrored and ``agrees`` on every check (prefilled caches of
    the kind the engine decodes on, a padded row among them)."""
    if lean and (fast := decoder(model)) is not None:
        if all(agrees(model, fast, check) for check in checks):
            return fast, True
    return generic(model), False

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
``generic(model)`` is used. A decoder may bring its own (``lean_decoder()``, built with
``mirrored``: ``mlxcel.families.api.LoadedModel``), checked the same way. On by default on
CUDA only (``EnginePolicy.lean_decode``, ``--lean-decode``).

Every forward here takes ``shift`` (``[B]`` or None): a position each row adds to its
cache offset, an M-RoPE model's image rows' rope delta (``mlxcel.families.media``).
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

Forward = Callable[..., mx.array]  # (tokens [B], caches, shift=None) -> logits [B, V]
Rotate = Callable[[mx.array, mx.array], tuple[mx.array, mx.array]]  # (q, k) -> rotated
Rotation = Callable[[Any, mx.array], Rotate]  # (offset, h) -> this step's Rotate
Check = Callable[[], tuple[list[Any], mx.array]]  # fresh prefilled caches, the next tokens

# mlx-lm modules whose Model / TransformerBlock / Attention / MLP this path mirrors; the
# flag says whether the attention normalises queries and keys per head (q_norm / k_norm)
LAYOUTS = {"mlx_lm.models.llama": False, "mlx_lm.models.qwen2": False,
           "mlx_lm.models.qwen3": True}


def generic(model: Any) -> Forward:
    """The model's own forward over one column: what every model decodes with."""

    def forward(tokens: mx.array, cache: list[Any], shift: mx.array | None = None) -> mx.array:
        if shift is None:
            return model(tokens[:, None], cache)[:, -1, :]
        return model(tokens[:, None], cache, shift=shift)[:, -1, :]

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
    """The lean forward for ``model`` (see the module docstring): its decoder's own
    (``lean_decoder()``), else the mirror of a layout listed here, else None. Built once
    the model's structure is final (after fused projections and bound submodules)."""
    own = getattr(model, "lean_decoder", None)
    if callable(own):
        return own()
    model = _network(model)
    norms = _layout(model) if model is not None else None
    if norms is None:
        return None
    inner = model.model
    head = inner.embed_tokens.as_linear if model.args.tie_word_embeddings else model.lm_head
    return mirrored(inner, head, sys.modules[type(model).__module__], qk_norms=norms)


def mirrored(network: Any, head: Callable[[mx.array], mx.array], module: Any, *,
             qk_norms: bool = False, rotation: Rotation | None = None) -> Forward:
    """A decode step's forward on [B, D] activations over ``network``'s Llama-shaped
    layers: ``network.embed_tokens``, then each of ``network.layers`` (``input_layernorm``;
    ``self_attn`` with ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, ``n_heads``,
    ``n_kv_heads``, ``scale``, and ``q_norm``/``k_norm`` where ``qk_norms``;
    ``post_attention_layernorm``; ``mlp``), then ``network.norm`` and ``head``.

    ``module``: the Python module whose ``create_attention_mask`` and
    ``scaled_dot_product_attention`` the layers call, looked up each step (the engine's
    attention path may wrap them). ``rotation(offset, h)``: called once a step with the
    rows' offsets (each row's shift added) and the embeddings, it returns the
    ``rotate(q, k)`` every layer applies (a model whose rotary tables are computed once a
    step, as mlx-vlm's M-RoPE models do); None: each layer's own ``self_attn.rope`` at the
    offset. Every layer's cache holds the same positions (the batch caches of the shared
    path), so the offset is read once, from the first. Each layer's callables are looked
    up here, once: build it when the model is final."""
    embed, final_norm = network.embed_tokens, network.norm
    plan = []
    for layer in network.layers:
        attn = layer.self_attn
        plan.append((layer.input_layernorm, attn.q_proj, attn.k_proj, attn.v_proj,
                     attn.q_norm if qk_norms else None, attn.k_norm if qk_norms else None,
                     None if rotation else attn.rope, attn.o_proj, attn.n_heads, attn.n_kv_heads,
                     attn.scale, layer.post_attention_layernorm, layer.mlp))

    def forward(tokens: mx.array, cache: list[Any], shift: mx.array | None = None) -> mx.array:
        b = tokens.shape[0]
        h = embed(tokens)
        mask = module.create_attention_mask(SimpleNamespace(shape=(b, 1)), cache[0])
        attend = module.scaled_dot_product_attention  # looked up: install() may wrap it
        offset = cache[0].offset
        if shift is not None:
            offset = offset + shift
        rotate = rotation(offset, h) if rotation is not None else None
        for (in_norm, q_proj, k_proj, v_proj, q_norm, k_norm, rope, o_proj, heads,
             kv_heads, scale, post_norm, mlp), c in zip(plan, cache, strict=True):
            x = in_norm(h)
            q = q_proj(x).reshape(b, heads, 1, -1)  # [B, 1, H, D] transposed, for L = 1
            k = k_proj(x).reshape(b, kv_heads, 1, -1)
            v = v_proj(x).reshape(b, kv_heads, 1, -1)
            if q_norm is not None:
                q, k = q_norm(q), k_norm(k)
            if rotate is None:
                q, k = rope(q, offset=offset), rope(k, offset=offset)
            else:
                q, k = rotate(q, k)
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
        deviation = mx.max(mx.abs(want - got)).item() / scale
        if deviation > tol:  # the log says by how much, for a layout that nearly agrees
            log.warning("lean_decode_disagrees", deviation=float(f"{deviation:.3g}"),
                        tolerance=tol)
        return deviation <= tol
    except Exception as exc:  # a layout this mirror gets wrong: the model's own forward
        log.warning("lean_decode_check_failed", error=f"{type(exc).__name__}: {exc}")
        return False


def _precise(model: Any) -> bool:
    """Whether ``model`` computes in float32 (its final norm's weight does; a
    vision-language model's is its language model's)."""
    network = _network(model)
    text = getattr(network, "language_model", network)
    norm = getattr(getattr(text, "model", None), "norm", None)
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

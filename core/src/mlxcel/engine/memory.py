"""Request memory admission: estimate a request's KV + activation bytes, compare to a budget.

The budget is the smallest of what the device allows (Metal's recommended working set, the
MLX allocator limit) and ``--request-memory-budget`` (``MLXCEL_REQUEST_MEMORY_BUDGET``,
parsed by ``mlxcel.options.byte_size``), which can only lower it.
"""

from __future__ import annotations

import math

KV_STEP = 256  # mlx-lm's KV caches grow in steps of this many tokens


def device_budget() -> int:
    """What the MLX device allows one request to use."""
    import mlx.core as mx

    limits = [mx.get_memory_limit()]
    info = mx.device_info()
    for key in ("max_recommended_working_set_size", "memory_size"):
        if isinstance(info.get(key), int) and info[key] > 0:
            limits.append(info[key])
    return min(v for v in limits if v > 0)


def request_budget(cap: int | None = None) -> int:
    """The device's budget, lowered to the operator's ``cap`` (bytes) when one is set."""
    device = device_budget()
    return device if cap is None else min(device, cap)


def estimate_request_bytes(config: dict, prompt_tokens: int, max_tokens: int,
                           prefill_chunk: int, dtype_bytes: int) -> int:
    """Conservative bytes one request needs: its KV cache plus peak prefill activations."""
    layers = int(config.get("num_hidden_layers", 1))
    hidden = int(config.get("hidden_size", 1))
    heads = int(config.get("num_attention_heads", 1))
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // max(heads, 1))
    inter = int(config.get("intermediate_size") or 4 * hidden)
    vocab = int(config.get("vocab_size", 1))
    total = prompt_tokens + max_tokens
    kv_len = math.ceil(total / KV_STEP) * KV_STEP
    kv = 2 * layers * kv_heads * head_dim * kv_len * dtype_bytes
    chunk = min(prompt_tokens, prefill_chunk)
    activations = chunk * (4 * hidden + 2 * inter) * dtype_bytes
    scores = heads * chunk * total * 4  # attention scores in float32
    logits = 2 * vocab * 4
    return kv + activations + scores + logits


def compute_dtype_bytes(model: object) -> int:
    """Bytes per element of the model's floating-point activations (and KV cache)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    for _, value in tree_flatten(model.parameters()):  # type: ignore[attr-defined]
        if mx.issubdtype(value.dtype, mx.floating):
            return value.dtype.size
    return 2

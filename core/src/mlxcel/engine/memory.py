"""Request memory admission: estimate a request's KV + activation bytes, compare to a budget.

The budget is the smallest of what the device allows (Metal's recommended working set, the
MLX allocator limit) and ``MLXCEL_REQUEST_MEMORY_BUDGET``, which can only lower it.
"""

from __future__ import annotations

import math
import os
import re

from mlxcel.errors import StartupError

BUDGET_ENV = "MLXCEL_REQUEST_MEMORY_BUDGET"
KV_STEP = 256  # mlx-lm's KV caches grow in steps of this many tokens
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"12G"``, ``"512MiB"``, ``"1.5g"``, ``"1048576"`` -> bytes; > 0 or ValueError."""
    match = _SIZE.match(text or "")
    if not match:
        raise ValueError(f"not a byte size: {text!r}")
    value = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if value <= 0:
        raise ValueError(f"byte size must be positive: {text!r}")
    return value


def env_budget() -> int | None:
    """The operator's cap from the environment; a bad value stops the server."""
    raw = os.environ.get(BUDGET_ENV)
    if raw is None:
        return None
    try:
        return parse_size(raw)
    except ValueError:
        raise StartupError(f"{BUDGET_ENV}={raw!r} is not a positive byte size "
                           "(examples: 12G, 512M, 1073741824)") from None


def device_budget() -> int:
    """What the MLX device allows one request to use."""
    import mlx.core as mx

    limits = [mx.get_memory_limit()]
    info = mx.device_info()
    for key in ("max_recommended_working_set_size", "memory_size"):
        if isinstance(info.get(key), int) and info[key] > 0:
            limits.append(info[key])
    return min(v for v in limits if v > 0)


def request_budget() -> int:
    cap = env_budget()
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

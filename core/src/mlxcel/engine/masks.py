"""Per-row output constraints in a batched step: one mask buffer, applied with mx.where.

Each constrained row's matcher writes its allowed tokens into its row of one int32
``(B, W)`` bit buffer (``engine.constraints.protocol`` gives the format); the other rows
allow everything. The bits become a boolean mask over the logits and disallowed tokens
get -inf before the sampler chain, so a constraint never changes another row's logits.
``mx.where`` keeps this portable: outlines-core's own MLX kernel is Metal-only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np

from mlxcel.engine.constraints.protocol import mask_words


def guided_rows(rows: list[Any]) -> list[int]:
    """Rows whose constraint applies to the next token."""
    return [i for i, s in enumerate(rows)
            if s.matcher is not None and s.matcher.active and not s.finished]


def apply_masks(logits: mx.array, rows: list[Any], guided: list[int],
                guard: Callable[..., Any]) -> mx.array:
    """``logits`` [B, V] with each guided row's disallowed tokens at -inf. A row whose
    matcher fails to write its mask fails alone (``guard``) and is left unconstrained for
    this step, as it leaves the batch."""
    batch, width = logits.shape
    words = mask_words(width)
    buf = np.full((batch, words), -1, dtype=np.int32)
    for i in guided:
        guard(i, rows[i].matcher.write_mask_into, buf[i])
    bits = (mx.array(buf)[:, :, None] >> mx.arange(32, dtype=mx.int32)) & 1
    allowed = bits.reshape(batch, words * 32)[:, :width].astype(mx.bool_)
    return mx.where(allowed, logits, mx.array(-float("inf"), dtype=logits.dtype))

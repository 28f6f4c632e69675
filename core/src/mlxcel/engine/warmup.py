"""Warm-up before the first request: run every forward shape the engine can produce once.

On CUDA, MLX builds a plan the first time it meets a shape: a cuBLASLt matmul heuristic
(~4 ms per new shape on an H200) and, for attention, a cuDNN graph (~50 ms), and it JIT
compiles custom kernels. A burst of traffic then pays them all at once: the ramp of 64
requests arriving together took ~0.9 s, most of it plans for the batch sizes and prefill
chunks it met for the first time (`bench/results/serving_gpu.md`, session 3). The engine's
shapes are few: a decode step has one row per running sequence (1 .. ``parallel``) and a
prefill chunk has rows x columns with columns a multiple of ``align`` (``prefill_align``)
and rows x columns <= the chunk size (a single row may take a whole chunk), so all of them
are run here, on empty caches, and thrown away.
"""

from __future__ import annotations

import time
from typing import Any

import mlx.core as mx
import structlog
from mlx_lm.models.cache import make_prompt_cache

from mlxcel.engine.kvcache import BatchCache

log = structlog.get_logger("mlxcel.engine")


def prefill_shapes(chunk: int, align: int) -> list[tuple[int, int]]:
    """(rows, columns) of every prefill chunk the engine can run with these settings."""
    shapes = []
    for cols in range(align, chunk + 1, align):
        shapes += [(rows, cols) for rows in range(1, chunk // cols + 1)]
    return shapes


def warm_up(model: Any, rope: Any | None, parallel: int, chunk: int, align: int) -> float:
    """Run each decode batch size and prefill chunk shape once; seconds spent."""
    t = time.perf_counter()
    layers = len(make_prompt_cache(model))
    for rows in range(1, parallel + 1):
        # the last row padded: the masked decode path (mlxcel.engine.attention) runs too
        cache = [BatchCache([0] * (rows - 1) + [1], rope) for _ in range(layers)]
        logits = model(mx.zeros((rows, 1), mx.uint32), cache)[:, -1, :]
        mx.eval(mx.argmax(logits, axis=-1))
    if parallel > 1:  # copying rows out for the prompt cache (a JIT-compiled gather)
        mx.eval(cache[0].rows([0, 1], [1, 1]))
    shapes = prefill_shapes(chunk, align)
    for rows, cols in shapes:
        cache = [BatchCache([0] * (rows - 1) + [1], rope) for _ in range(layers)]
        model(mx.zeros((rows, cols), mx.uint32), cache)
        mx.eval([c.state for c in cache])
    seconds = time.perf_counter() - t
    log.info("engine_warmup", decode_batches=parallel, prefill_shapes=len(shapes),
             seconds=round(seconds, 2))
    return seconds

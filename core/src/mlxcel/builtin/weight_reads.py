"""Give a text model its checkpoint's weights read with several threads, for the text
loader; the threaded reader itself is ``mlxcel.model.safetensors_reads.read_weights``
(shared with the prompt cache's disk tier). The server asks for this on CUDA only
(``mlxcel.backend.weight_read_threads``); Metal and the CPU keep MLX's own load.

``load_in_threads`` keeps mlx-lm in charge of what the model is: mlx-lm builds it lazily
(quantization, its ``sanitize``), the threads read the same files, the family's
``sanitize`` maps them, and they replace the lazy parameters only where every name, shape
and dtype matches. Anything else (a loader that transformed its weights in a way this path
does not repeat) evaluates mlx-lm's own lazy parameters instead, as a plain load would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from mlxcel.model.safetensors_reads import read_weights


def layout(arrays: dict[str, mx.array]) -> dict[str, tuple[tuple[int, ...], Any]]:
    """Each array's shape and dtype by name: what must match for one set to replace another."""
    return {name: (tuple(a.shape), a.dtype) for name, a in arrays.items()}


def load_in_threads(model: Any, path: Path, threads: int) -> bool:
    """Give ``model`` (built by mlx-lm with ``lazy=True``) its weights read in ``threads``
    threads, evaluated; True when they replaced the lazy ones, False (nothing read) when
    the files, mapped by the model's ``sanitize``, would not match its parameters name for
    name, shape for shape and dtype for dtype: the caller then evaluates them as they are."""
    files = sorted(path.glob("model*.safetensors"))
    if not files:
        return False
    headers = {f: mx.load(str(f)) for f in files}  # lazy: what the read will give
    lazy = {name: array for part in headers.values() for name, array in part.items()}
    sanitize = getattr(model, "sanitize", lambda weights: weights)
    if layout(sanitize(lazy)) != layout(dict(tree_flatten(model.parameters()))):
        return False
    weights = sanitize(read_weights(files, threads, headers))
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())
    return True

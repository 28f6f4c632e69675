"""Read a checkpoint's safetensors with several threads, for the text loader.

MLX's CUDA ``Load`` reads each tensor on the thread that evaluates it, into freshly
allocated pageable host memory, and copies it to the device from there: one tensor after
another, so a large checkpoint loads at the speed of one thread's page faults and copies.
Here the tensors are dealt out by size among ``threads`` threads, each loading its share on
a stream of its own (MLX releases the GIL while it evaluates), so the reads and copies run
side by side. The server asks for this on CUDA only (``mlxcel.backend.weight_read_threads``);
Metal and the CPU keep MLX's own load.

``load_in_threads`` keeps mlx-lm in charge of what the model is: mlx-lm builds it lazily
(quantization, its ``sanitize``), the threads read the same files, the family's
``sanitize`` maps them, and they replace the lazy parameters only where every name, shape
and dtype matches. Anything else (a loader that transformed its weights in a way this path
does not repeat) evaluates mlx-lm's own lazy parameters instead, as a plain load would.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten


def read_weights(files: list[Path], threads: int,
                 headers: dict[Path, dict[str, mx.array]] | None = None) -> dict[str, mx.array]:
    """Every tensor of ``files``, evaluated, read by ``threads`` threads on their own
    streams; the largest tensors are dealt out first, so the threads' shares even out.
    ``headers``: each file's lazy ``mx.load``, where the caller has it already."""
    headers = headers or {f: mx.load(str(f)) for f in files}
    sizes = {(f, name): array.nbytes for f in files for name, array in headers[f].items()}
    shares: list[list[tuple[Path, str]]] = [[] for _ in range(max(1, threads))]
    for i, key in enumerate(sorted(sizes, key=lambda k: sizes[k], reverse=True)):
        shares[i % len(shares)].append(key)
    parts: list[dict[str, mx.array]] = [{} for _ in shares]
    errors: list[BaseException] = []

    def read(i: int) -> None:
        try:
            stream = mx.new_stream(mx.default_device())  # MLX's streams are per thread
            opened = {f: mx.load(str(f), stream=stream) for f in {f for f, _ in shares[i]}}
            part = {name: opened[f][name] for f, name in shares[i]}
            mx.eval(part)
            mx.synchronize(stream)
            parts[i] = part
        except BaseException as exc:  # re-raised on the calling thread below
            errors.append(exc)

    workers = [threading.Thread(target=read, args=(i,), name=f"mlxcel-weights-{i}")
               for i in range(len(shares)) if shares[i]]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    weights: dict[str, mx.array] = {}
    for part in parts:
        weights.update(part)
    return weights


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

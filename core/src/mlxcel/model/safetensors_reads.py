"""Read safetensors files with several threads: a checkpoint's weights (the text loader) and
a prompt-cache entry file (the engine's disk tier) alike.

MLX's CUDA ``Load`` reads each tensor on the thread that evaluates it, into freshly
allocated pageable host memory, and copies it to the device from there: one tensor after
another, so a large file loads at the speed of one thread's page faults and copies. Here
the tensors are dealt out by size among ``threads`` threads, each loading its share on a
stream of its own (MLX releases the GIL while it evaluates), so the reads and copies run
side by side. The reader threads and their streams are made once and kept for every later
read. Callers ask for this on CUDA only (``mlxcel.backend.weight_read_threads``); Metal and
the CPU keep MLX's own load.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import mlx.core as mx

_readers: list[ThreadPoolExecutor] = []  # one thread each, kept for the process's life
_readers_lock = threading.Lock()
_local = threading.local()


def _pool(n: int) -> list[ThreadPoolExecutor]:
    """``n`` reader threads, started on first need and kept: a caller that reads on every
    prompt-cache hit must not make threads, nor streams, per read."""
    with _readers_lock:
        while len(_readers) < n:
            _readers.append(ThreadPoolExecutor(1, f"mlxcel-reads-{len(_readers)}"))
        return _readers[:n]


def _stream() -> mx.Stream:
    """This reader thread's stream, made on its first read and kept: an MLX stream may only
    be used on the thread that made it, and each one made keeps its own threads (and on a
    GPU its device queue) until the process ends."""
    stream = getattr(_local, "stream", None)
    if stream is None:
        stream = _local.stream = mx.new_stream(mx.default_device())
    return stream


def _read(share: list[tuple[Path, str]]) -> dict[str, mx.array]:
    stream = _stream()
    opened = {f: mx.load(str(f), stream=stream) for f in {f for f, _ in share}}
    part = {name: opened[f][name] for f, name in share}
    mx.eval(part)
    mx.synchronize(stream)
    return part


def read_weights(files: list[Path], threads: int,
                 headers: dict[Path, dict[str, mx.array]] | None = None) -> dict[str, mx.array]:
    """Every tensor of ``files``, evaluated, read by ``threads`` reader threads on their own
    streams; the largest tensors are dealt out first, so the threads' shares even out.
    ``headers``: each file's lazy ``mx.load``, where the caller has it already. A reader's
    error is raised here, once every reader is done."""
    headers = headers or {f: mx.load(str(f)) for f in files}
    sizes = {(f, name): array.nbytes for f in files for name, array in headers[f].items()}
    shares: list[list[tuple[Path, str]]] = [[] for _ in range(max(1, threads))]
    for i, key in enumerate(sorted(sizes, key=lambda k: sizes[k], reverse=True)):
        shares[i % len(shares)].append(key)
    shares = [share for share in shares if share]
    readers = _pool(len(shares))
    futures = [reader.submit(_read, share) for reader, share in zip(readers, shares, strict=True)]
    wait(futures)
    weights: dict[str, mx.array] = {}
    for future in futures:
        weights.update(future.result())
    return weights

"""How many threads OpenBLAS may use for a small model on MLX's CPU device.

A second BLAS thread pays for a large matmul and costs a small one: on the 2-core CI
machine a prefill chunk's MLP matmul (512 tokens) took 0.28 ms on one thread and 0.19-0.24
on two for the tiny benchmark model (hidden 64, intermediate 192), 10.6-12.5 vs 6.0-6.6 ms
for the ~30M one (512, 1536). For the small one the second thread saves a few hundredths of
a millisecond per call but takes the core that the HTTP side (and, on a small machine, the
clients) needs: at 16 concurrent streams one BLAS thread measured TTFT p50 82-116 ms (median
102, six runs) against 97-142 ms (median 124) with two, and more tokens per second.

So when a prefill chunk's largest matmul is under ``SMALL_GEMM_FLOPS``, the engine asks
OpenBLAS for one thread (``openblas_set_num_threads``; Debian's OpenBLAS, which the server
preloads on Linux, exports it). A thread count the user set (``OPENBLAS_NUM_THREADS``,
``OMP_NUM_THREADS``) is left alone, and so is any other BLAS.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Any

from mlxcel.backend import library_env

SMALL_GEMM_FLOPS = 1e8  # the tiny model's chunk matmul: 1.3e7; the ~30M one's: 8.1e8
USER_SETTINGS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")


def chunk_gemm_flops(config: dict[str, Any], chunk: int) -> float | None:
    """FLOPs of a prefill chunk's MLP up-projection (``chunk`` tokens), or None when the
    config does not say (``hidden_size``, ``intermediate_size``, or a ``text_config``)."""
    config = config.get("text_config", config)
    hidden, inner = config.get("hidden_size"), config.get("intermediate_size")
    if not isinstance(hidden, int) or not isinstance(inner, int):
        return None
    return 2.0 * chunk * hidden * inner


def _openblas() -> Any | None:
    try:
        lib = ctypes.CDLL(None)
        return lib.openblas_set_num_threads
    except (OSError, AttributeError):
        return None


def limit_threads(config: dict[str, Any], chunk: int, env: Mapping[str, str] | None = None,
                  setter: Any | None = None) -> int | None:
    """One OpenBLAS thread for a small model (see the module docstring); returns the
    count set, or None when nothing was changed. ``env``: the process environment
    (``mlxcel.backend.library_env``), where OpenBLAS reads its own thread settings."""
    env = library_env() if env is None else env
    if any(env.get(name) for name in USER_SETTINGS):
        return None
    flops = chunk_gemm_flops(config, chunk)
    if flops is None or flops >= SMALL_GEMM_FLOPS:
        return None
    setter = setter or _openblas()
    if setter is None:
        return None
    setter(1)
    return 1

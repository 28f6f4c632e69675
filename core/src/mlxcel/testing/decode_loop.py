"""The raw decode loop the benchmarks measure the engine against (``bench/gpu/raw_loop.py``,
``bench/engine_profile.py``): mlx-lm's own generate loop, without a server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def pipelined_greedy(step: Callable[[Any], Any], y: Any, steps: int) -> Any:
    """Run ``steps`` greedy steps from tokens ``y`` as mlx-lm's generate loop does: step
    n+1 is queued (``mx.async_eval``) before step n's tokens are read back to Python, so
    the device computes while Python builds. Returns the last step's tokens, queued."""
    import mlx.core as mx

    nxt = step(y)
    mx.async_eval(nxt)
    for i in range(steps):
        cur = nxt
        if i < steps - 1:
            nxt = step(cur)
            mx.async_eval(nxt)
        cur.tolist()
    return nxt

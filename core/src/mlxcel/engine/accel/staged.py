"""A verify forward queued to the device in stages while its graph is still being built.

A one-token decode step hides the host's work: step n + 1's graph is built while the
device computes step n. A speculative verify step cannot overlap that way (its inputs
continue the tokens the previous step accepted), so without help the device idles while
the host builds the whole forward's graph, then the host waits while the device computes
it. Here the forward is queued in parts as it is built: every ``len(caches) / stages``
layers, the layer's new keys and values are handed to ``mx.async_eval`` from its cache's
``update_and_fetch``, which starts everything up to that layer on the device while Python
goes on building the next layers. The result is the same graph, evaluated in parts.

For the engine's own batch caches (``BatchCache``), through an instance attribute that
shadows the class's method for one forward: other steps run the class's unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx


@contextmanager
def staged(caches: list[Any], stages: int) -> Iterator[None]:
    """Within the block, a forward over ``caches`` (one per layer) is queued in ``stages``
    parts (1 or fewer: as one, at its evaluation). Caches without the engine's
    ``update_and_fetch`` protocol, or too few layers to split, are left alone."""
    layers = len(caches)
    if stages <= 1 or layers < 2 or not all(hasattr(c, "update_and_fetch") for c in caches):
        yield
        return
    step = max(1, layers // stages)
    marked = []
    for i, cache in enumerate(caches):
        if (i + 1) % step or i == layers - 1:
            continue
        try:  # a cache class with __slots__ takes no instance attribute: left whole
            cache.update_and_fetch = _launching(cache.update_and_fetch)
        except AttributeError:
            continue
        marked.append(cache)
    try:
        yield
    finally:
        for cache in marked:
            del cache.update_and_fetch


def _launching(update: Any) -> Any:
    def update_and_fetch(keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        mx.async_eval(keys, values)
        return update(keys, values)

    return update_and_fetch

"""Faults to inject into a loaded checkpoint, for tests of how the server fails.

``raise_on_marker(checkpoint, marker, make_error)``: the model raises on any prefill whose
tokens hold ``marker``'s token id, so a test picks which request fails (the one whose
prompt carries the marker) while every other request runs as usual.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def raise_on_marker(checkpoint: Any, marker: str,
                    make_error: Callable[[], BaseException]) -> None:
    """Swap ``checkpoint.model``'s class for one that raises ``make_error()`` on a prefill
    (more than one token in a row) holding ``marker``'s token; decode steps pass."""
    import mlx.core as mx

    token = checkpoint.tokenizer.hf.token_to_id(marker)
    base = type(checkpoint.model)

    def call(self: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        if inputs.ndim == 2 and inputs.shape[1] > 1 and mx.any(inputs == token).item():
            raise make_error()
        return base.__call__(self, inputs, *args, **kwargs)

    checkpoint.model.__class__ = type("Failing" + base.__name__, (base,), {"__call__": call})

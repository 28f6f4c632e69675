"""Where a model keeps its decoder layers, for the accel paths that act on them."""

from __future__ import annotations

from typing import Any

import mlx.nn as nn


def layer_holder(model: Any) -> Any:
    """The module whose ``layers`` list is the decoder's, or None: engine wrapper ->
    (a VLM's ``language_model``) -> mlx-lm Model -> the module that holds the layers."""
    inner = model
    for _ in range(5):
        if isinstance(inner, nn.Module) and isinstance(inner.get("layers"), list):
            return inner
        language = getattr(inner, "language_model", None)
        inner = language if language is not None else getattr(inner, "model", None)
        if inner is None:
            return None
    return None


def first_layer(model: Any) -> Any:
    """The decoder's first layer this process holds, or None (a pipeline rank holds None
    for the other ranks' layers)."""
    holder = layer_holder(model)
    layers = holder["layers"] if holder is not None else []
    return next((layer for layer in layers if layer is not None), None)

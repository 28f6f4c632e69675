"""Each image's vision features, one image at a time, through the engine's feature cache
(``mlxcel.engine.media_rows.FeatureCache``: by the image's digest), concatenated in the
form the model's ``get_input_embeddings`` takes as ``cached_image_features``.

Only where an image can be encoded alone is it cached: Qwen-VL's tower over the image's
grid rows (``grid``), Gemma 3's tower and projector (``sequence``), a model's own
``encode_image``. Any other model (or a tower that returns more than features, as
Qwen3-VL's deep-stack one does) encodes the prompt's images together, uncached.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
from mlxcel.types.media import MediaPrompt


def _dtype(module: Any) -> Any:
    for _, value in _leaves(module.parameters()):
        return value.dtype
    return mx.float32


def _leaves(tree: Any) -> Any:
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from ((key, v) for _, v in _leaves(value))
    elif isinstance(tree, list):
        for value in tree:
            yield from _leaves(value)
    elif isinstance(tree, mx.array):
        yield "", tree


def _per_image(model: Any, prompt: MediaPrompt, pixels: mx.array, arrays: dict[str, Any]
               ) -> list[Any] | None:
    """One function per image that encodes it alone, or None where the model cannot."""
    rule = (prompt.inputs or {}).get("rule")
    tower = getattr(model, "vision_tower", None)
    count = len(prompt.digests)
    if rule == "grid" and tower is not None and "image_grid_thw" in arrays:
        grids = np.asarray(arrays["image_grid_thw"]).reshape(-1, 3)
        rows = np.concatenate([[0], np.cumsum(np.prod(grids, axis=1))]).astype(int)
        dtype = _dtype(tower)

        def grid(i: int) -> Any:
            return tower(pixels[rows[i]:rows[i + 1]].astype(dtype),
                         mx.array(grids[i:i + 1]), output_hidden_states=False)
        return [lambda i=i: grid(i) for i in range(count)]
    if rule == "sequence" and tower is not None and hasattr(model, "multi_modal_projector") \
            and pixels.ndim == 4 and pixels.shape[0] == count:
        dtype = _dtype(tower)

        def sequence(i: int) -> Any:
            hidden, *_ = tower(pixels[i:i + 1].transpose(0, 2, 3, 1).astype(dtype),
                               output_hidden_states=True)
            return model.multi_modal_projector(hidden)
        return [lambda i=i: sequence(i) for i in range(count)]
    if hasattr(model, "encode_image") and pixels.shape[0] == count:
        return [lambda i=i: model.encode_image(pixels[i:i + 1]) for i in range(count)]
    return None


def encoded(model: Any, prompt: MediaPrompt, pixels: mx.array, arrays: dict[str, Any],
            features: Any) -> Any:
    """The prompt's images' features for ``cached_image_features``, each from
    ``features`` or encoded alone; None where the model encodes them together."""
    encoders = _per_image(model, prompt, pixels, arrays)
    if encoders is None:
        return None
    parts = [features.get(digest, encode)
             for digest, encode in zip(prompt.digests, encoders, strict=True)]
    if any(not isinstance(p, mx.array) for p in parts):
        return None  # a tower that returns more than features (deep stack)
    rule = (prompt.inputs or {}).get("rule")
    return mx.concatenate(parts, axis=0) if len(parts) > 1 or rule != "grid" else parts[0]

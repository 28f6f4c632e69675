"""Each image's vision features, one image at a time, through the engine's feature cache
(``mlxcel.engine.media_rows.FeatureCache``: by the image's digest), concatenated in the
form the model's ``get_input_embeddings`` takes as ``cached_image_features``.

Only where an image can be encoded alone is it cached: Qwen-VL's tower over the image's
grid rows (``grid``), Gemma 3's tower and projector (``sequence``), a model's own
``encode_image``. Any other model (or a tower that returns more than features, as
Qwen3-VL's deep-stack one does) encodes the prompt's images together, uncached.

``encoded_together`` encodes the images of several prompts (image rows prefilling in one
group) in one tower call where the rule allows it (``grid``: the tower takes several
grids, each image attending within its own; ``sequence``: a batch of pixel tensors) and
splits the features per image: one call for a burst of images instead of one each.
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


def encoded_together(model: Any, prompts: list[MediaPrompt],
                     held: Any) -> dict[bytes, mx.array]:
    """The features of the images of ``prompts`` whose digest ``held`` does not hold
    (each image once), from one tower call, by digest; empty where the rule encodes each
    image alone or together with its prompt only."""
    tower = getattr(model, "vision_tower", None)
    rules = {(p.inputs or {}).get("rule") for p in prompts}
    if tower is None or len(rules) != 1:
        return {}
    rule = rules.pop()
    wanted: dict[bytes, tuple[Any, int]] = {}
    for prompt in prompts:
        for i, digest in enumerate(prompt.digests):
            if digest not in wanted and not held(digest):
                wanted[digest] = (prompt, i)
    if len(wanted) < 2:
        return {}
    if rule == "grid":
        return _grids_together(tower, wanted)
    if rule == "sequence" and hasattr(model, "multi_modal_projector"):
        return _sequences_together(model, tower, wanted)
    return {}


def _grids_together(tower: Any, wanted: dict[bytes, tuple[Any, int]]) -> dict[bytes, Any]:
    pixels, grids = [], []
    for prompt, i in wanted.values():
        inputs = prompt.inputs
        if "image_grid_thw" not in inputs:
            return {}
        grid = np.asarray(inputs["image_grid_thw"]).reshape(-1, 3)
        rows = np.concatenate([[0], np.cumsum(np.prod(grid, axis=1))]).astype(int)
        pixels.append(np.asarray(inputs["pixel_values"])[rows[i]:rows[i + 1]])
        grids.append(grid[i])
    grid = np.stack(grids)
    out = tower(mx.array(np.concatenate(pixels)).astype(_dtype(tower)), mx.array(grid),
                output_hidden_states=False)
    if not isinstance(out, mx.array):
        return {}
    sizes = [_merged(tower, g) for g in grid]
    if sum(sizes) != out.shape[0]:
        return {}
    bounds = np.cumsum([0, *sizes])
    return {digest: out[bounds[k]:bounds[k + 1]]
            for k, digest in enumerate(wanted)}


def _merged(tower: Any, grid: np.ndarray) -> int:
    """How many features the tower gives for an image of ``grid`` (t, h, w patches):
    one per merged block of ``spatial_merge_size`` x ``spatial_merge_size`` patches."""
    size = int(getattr(tower, "spatial_merge_size", None)
               or getattr(getattr(tower, "config", None), "spatial_merge_size", None) or 2)
    return int(np.prod(grid)) // (size * size)


def _sequences_together(model: Any, tower: Any,
                        wanted: dict[bytes, tuple[Any, int]]) -> dict[bytes, Any]:
    pixels = []
    for prompt, i in wanted.values():
        values = np.asarray(prompt.inputs["pixel_values"])
        if values.ndim != 4:
            return {}
        pixels.append(values[i:i + 1])
    hidden, *_ = tower(mx.array(np.concatenate(pixels)).transpose(0, 2, 3, 1)
                       .astype(_dtype(tower)), output_hidden_states=True)
    out = model.multi_modal_projector(hidden)
    return {digest: out[k:k + 1] for k, digest in enumerate(wanted)}

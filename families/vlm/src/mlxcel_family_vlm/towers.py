"""Repairs the family makes to mlx-vlm's vision towers when it loads them.

``skip_empty_windows``: Qwen2.5-VL's tower (and any tower with its ``get_window_index``)
splits its window attention at cumulative window boundaries. Windows made only of the
padding that rounds the grid up to whole windows are empty and repeat a boundary; the
tower means to drop repeated boundaries, but does it with a set of ``mx.array`` scalars,
which hash by identity, so it drops none, and each empty window reaches
``mx.fast.scaled_dot_product_attention`` as a zero-length sequence: work for nothing,
and a kernel edge case that no backend should have to meet (a crash of this tower on
MLX's CUDA backend is not yet explained). The repair drops repeated boundaries where the
tower computes them; an empty window contributes nothing to the output, so the tower's
result is unchanged.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx


def repair(model: Any) -> None:
    """Apply every repair that ``model``'s vision tower needs (none for most towers)."""
    tower = getattr(model, "vision_tower", None)
    if tower is not None and callable(getattr(tower, "get_window_index", None)):
        skip_empty_windows(tower)


def skip_empty_windows(tower: Any) -> None:
    """``tower.get_window_index`` with repeated window boundaries dropped (the module
    docstring), on this instance only."""
    original = tower.get_window_index

    def get_window_index(grid_thw: Any) -> tuple[Any, Any]:
        index, bounds = original(grid_thw)
        kept = distinct_bounds(bounds.tolist())
        return index, mx.array(kept, dtype=bounds.dtype) if len(kept) < bounds.size else bounds

    tower.get_window_index = get_window_index


def distinct_bounds(bounds: list[int]) -> list[int]:
    """Cumulative boundaries without repeats: each empty segment dropped."""
    out: list[int] = []
    for b in bounds:
        if not out or b != out[-1]:
            out.append(b)
    return out

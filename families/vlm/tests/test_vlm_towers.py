"""The family's repairs to mlx-vlm's vision towers (``mlxcel_family_vlm.towers``)."""

import mlx.core as mx
import numpy as np
from mlxcel.families.api import LoadOptions
from mlxcel_family_vlm.load import load
from mlxcel_family_vlm.towers import distinct_bounds


def test_distinct_bounds_drop_only_repeats():
    assert distinct_bounds([0, 16, 16, 16, 32, 32]) == [0, 16, 32]
    assert distinct_bounds([0, 4, 8]) == [0, 4, 8]


def test_qwen2_5_vl_windows_of_padding_alone_are_skipped(vlm_checkpoint):
    """A 56x56 image is a 2x2 grid of merged patches in the tiny tower's 2x2 windows,
    which mlx-vlm pads to 4x4: three windows are padding alone. The family's tower gives
    each window boundary once (no zero-length attention) and the same features as
    mlx-vlm's own tower."""
    from mlx_vlm.utils import load as vlm_load

    path = vlm_checkpoint("qwen2_5_vl")
    ours = load(path, LoadOptions()).model
    theirs, _ = vlm_load(str(path))
    grid = mx.array([[1, 4, 4]])
    _, raw = theirs.vision_tower.get_window_index(grid)
    _, bounds = ours.vision_tower.get_window_index(grid)
    assert len(set(raw.tolist())) < raw.size  # mlx-vlm's own has repeats here
    assert bounds.tolist() == sorted(set(raw.tolist()))
    pixels = mx.array(np.random.default_rng(0).normal(size=(16, 3 * 2 * 14 * 14)),
                      dtype=mx.float32)
    expected = theirs.vision_tower(pixels, grid)
    got = ours.vision_tower(pixels, grid)
    got, expected = (x[0] if isinstance(x, tuple) else x for x in (got, expected))
    assert mx.allclose(got, expected, atol=1e-5).item()

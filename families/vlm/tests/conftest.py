"""Tiny VLM checkpoints for the distribution's tests, built once per session, offline."""

import pytest


@pytest.fixture(scope="session")
def vlm_checkpoint(mlxcel_checkpoint_cache):
    """``vlm_checkpoint(shape)``: a tiny float32 VLM checkpoint of ``shape``
    (``mlxcel.testing.vlm_checkpoints.SHAPES``), built once."""
    from mlxcel.testing.vlm_checkpoints import cached_vlm_checkpoint

    return lambda shape: cached_vlm_checkpoint(shape, cache_dir=mlxcel_checkpoint_cache)

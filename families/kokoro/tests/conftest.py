"""A tiny Kokoro checkpoint for the distribution's tests, built once per session, offline,
and its ``speak`` runner made once: the checkpoint is ~224 MB and a CPU synthesizes
slowly, so tests share both and speak a few phonemes each."""

import pytest


@pytest.fixture(scope="session")
def kokoro_checkpoint(mlxcel_checkpoint_cache):
    """A tiny float32 Kokoro checkpoint with af_heart, bf_emma and ff_siwis voice packs
    (``mlxcel.testing.kokoro_checkpoints``)."""
    from mlxcel.testing.kokoro_checkpoints import cached_kokoro_checkpoint

    return cached_kokoro_checkpoint(cache_dir=mlxcel_checkpoint_cache)


@pytest.fixture(scope="session")
def speaker(kokoro_checkpoint):
    """The family's ``speak`` runner on the tiny checkpoint."""
    from mlxcel.families.api import LoadOptions
    from mlxcel_family_kokoro.load import load
    from mlxcel_family_kokoro.speaker import make

    return make(load(kokoro_checkpoint, LoadOptions(dtype="float32")))

"""Tiny Whisper checkpoints for the distribution's tests, built once per session, offline."""

import pytest


@pytest.fixture(scope="session")
def whisper_checkpoint(mlxcel_checkpoint_cache):
    """``whisper_checkpoint(layout="hf", multilingual=True, **kw)``: a tiny random-weight
    Whisper checkpoint (``mlxcel.testing.whisper_checkpoints``), built once."""
    from mlxcel.testing.whisper_checkpoints import cached_whisper_checkpoint

    return lambda layout="hf", multilingual=True, **kw: cached_whisper_checkpoint(
        layout, multilingual, cache_dir=mlxcel_checkpoint_cache, **kw)


@pytest.fixture(scope="session")
def transcriber(whisper_checkpoint):
    """``transcriber(layout="hf", multilingual=True)``: the family's runner on a tiny
    checkpoint loaded in float32, made once per session."""
    from mlxcel.families.api import LoadOptions
    from mlxcel_family_whisper.load import load
    from mlxcel_family_whisper.runner import make

    made = {}

    def get(layout="hf", multilingual=True):
        if (layout, multilingual) not in made:
            path = whisper_checkpoint(layout, multilingual)
            made[layout, multilingual] = make(load(path, LoadOptions(dtype="float32")))
        return made[layout, multilingual]

    return get


@pytest.fixture(scope="session")
def greedy():
    """``greedy(path)``: a runner on the checkpoint at ``path`` whose windows never fall
    back. Random weights fail every fallback threshold, so each window would otherwise
    be decoded six times; mlx-audio's greedy pass is what the tests compare."""
    from mlxcel.families.api import LoadOptions
    from mlxcel_family_whisper.load import load
    from mlxcel_family_whisper.runner import make

    def get(path):
        runner = make(load(path, LoadOptions(dtype="float32")))
        runner.decoder.compression_ratio_threshold = runner.decoder.logprob_threshold = None
        return runner

    return get

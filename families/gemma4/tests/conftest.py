"""The distribution's tests import their shared fixtures module, ``gemma4_fixtures``, from
this folder (a name of its own, so that several distributions' tests run in one pytest).
Tests run offline: mlxcel's pytest plugin sets ``HF_HUB_OFFLINE``."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def gemma4_checkpoint(mlxcel_checkpoint_cache):
    """A tiny float32 ``gemma4_text`` checkpoint with Gemma 4's real-shaped template."""
    from mlxcel.testing.checkpoint import cached_checkpoint

    return cached_checkpoint("gemma4_text", cache_dir=mlxcel_checkpoint_cache,
                             dtype="float32", template="gemma4")


@pytest.fixture(scope="session")
def gemma4_assistant(gemma4_checkpoint, mlxcel_checkpoint_cache):
    """A tiny random ``gemma4_assistant`` checkpoint for ``gemma4_checkpoint``."""
    from gemma4_assistant import build_assistant
    from mlxcel.testing.checkpoint import build_once

    final = mlxcel_checkpoint_cache / f"gemma4_assistant-for-{gemma4_checkpoint.name}"
    return build_once(final, lambda tmp: build_assistant(tmp, gemma4_checkpoint))

"""pytest plugin (entry point ``mlxcel``): session fixtures with tiny checkpoints.

Nothing heavy is imported at module level: this module is loaded by every pytest
run in an environment where mlxcel is installed.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Tests run offline (model weights cannot be downloaded; every checkpoint is built):
    Hugging Face's hub is told so before any test imports it, for every distribution's
    suite alike."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def mlxcel_checkpoint_cache(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Cache dir for test checkpoints: ``$MLXCEL_CACHE_DIR`` if set, else under basetemp."""
    from .checkpoint import default_cache_dir

    if os.environ.get("MLXCEL_CACHE_DIR"):
        return default_cache_dir()
    return tmp_path_factory.getbasetemp() / "mlxcel-checkpoints"


@pytest.fixture(scope="session")
def tiny_checkpoint(mlxcel_checkpoint_cache: pathlib.Path) -> pathlib.Path:
    """Tiny qwen3 checkpoint with default builder arguments."""
    from .checkpoint import cached_checkpoint

    return cached_checkpoint("qwen3", mlxcel_checkpoint_cache)


@pytest.fixture(scope="session")
def side_checkpoint(mlxcel_checkpoint_cache: pathlib.Path) -> Any:
    """``side_checkpoint("embedder" | "reranker", kind=..., ...)``: a tiny embedder or
    reranker (``mlxcel.testing.side_checkpoints``, which needs mlx-vlm), built once."""
    from .side_checkpoints import cached_side_checkpoint

    return lambda builder, **kw: cached_side_checkpoint(builder, mlxcel_checkpoint_cache, **kw)


@pytest.fixture(scope="session")
def tiny_llama_checkpoint(mlxcel_checkpoint_cache: pathlib.Path) -> pathlib.Path:
    """Tiny llama checkpoint with default builder arguments."""
    from .checkpoint import cached_checkpoint

    return cached_checkpoint("llama", mlxcel_checkpoint_cache)

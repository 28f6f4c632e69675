"""Core's builtin families pass the conformance runner third-party families use."""

from __future__ import annotations

import pytest
from mlxcel.testing.checkpoint import cached_checkpoint
from mlxcel.testing.conformance import check_family


@pytest.mark.parametrize("shape,family", [("qwen3", "mlx-lm-text"),
                                          ("gemma4_text", "mlx-lm-generic"),
                                          ("qwen3_next", "mlx-lm-generic")])
def test_builtin_families_conform(shape, family, mlxcel_checkpoint_cache):
    check_family(cached_checkpoint(shape, cache_dir=mlxcel_checkpoint_cache, dtype="float32"),
                 family)


def test_the_runner_names_a_family_that_does_not_claim_the_checkpoint(mlxcel_checkpoint_cache):
    path = cached_checkpoint("qwen3", cache_dir=mlxcel_checkpoint_cache, dtype="float32")
    with pytest.raises(AssertionError, match="served by 'mlx-lm-text', not 'acme'"):
        check_family(path, "acme")


def test_builtin_dialects_conform(tiny_checkpoint):
    from apphelpers import make_client, wait_ready
    from mlxcel.plugins import load_plugins
    from mlxcel.testing.conformance import check_dialect

    dialects = load_plugins().dialects
    with make_client(tiny_checkpoint, api_key="s3cret", parallel=1) as c:
        wait_ready(c)
        check_dialect(c, dialects.get("openai"), "/v1/models", "s3cret")
        check_dialect(c, dialects.get("llamacpp"), "/props", "s3cret")

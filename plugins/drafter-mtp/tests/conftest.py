"""The distribution's tests import their shared fixtures module, ``mtp_fixtures``, from
this folder (a name of its own, so that several distributions' tests run in one pytest).
Tests run offline: mlxcel's pytest plugin sets ``HF_HUB_OFFLINE``."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def qwen3_5_plain(mlxcel_checkpoint_cache):
    """A tiny float32 ``qwen3_5`` checkpoint (gated delta-net and full attention), as
    mlx-lm converts it: no ``mtp.*`` weights."""
    from mlxcel.testing.checkpoint import cached_checkpoint

    return cached_checkpoint("qwen3_5", cache_dir=mlxcel_checkpoint_cache, dtype="float32")


@pytest.fixture(scope="session")
def qwen3_5_mtp(qwen3_5_plain, mlxcel_checkpoint_cache):
    """``qwen3_5_plain`` with random ``mtp.*`` weights beside its own."""
    from mlxcel.testing.checkpoint import build_once
    from mtp_fixtures import with_mtp_heads

    final = mlxcel_checkpoint_cache / f"{qwen3_5_plain.name}-mtp"
    return build_once(final, lambda tmp: with_mtp_heads(tmp, qwen3_5_plain))


MOE = {"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
       "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
       "shared_expert_intermediate_size": 32}


@pytest.fixture(scope="session")
def qwen3_5_moe_mtp(mlxcel_checkpoint_cache):
    """A tiny float32 ``qwen3_5_moe`` checkpoint (mixture-of-experts MLPs) with random
    ``mtp.*`` heads, an MoE layer like the target's."""
    from mlxcel.testing.checkpoint import build_once, cached_checkpoint
    from mtp_fixtures import with_mtp_heads

    plain = cached_checkpoint("qwen3_5", cache_dir=mlxcel_checkpoint_cache, dtype="float32",
                              config=MOE)
    final = mlxcel_checkpoint_cache / f"{plain.name}-moe-mtp"
    return build_once(final, lambda tmp: with_mtp_heads(tmp, plain))


@pytest.fixture(params=["dense", "moe"])
def mtp_target(request):
    """Each kind of Qwen3.5 target with MTP heads: ``qwen3_5`` and ``qwen3_5_moe``."""
    name = "qwen3_5_mtp" if request.param == "dense" else "qwen3_5_moe_mtp"
    return request.getfixturevalue(name)


@pytest.fixture(scope="session")
def dflash_draft(tiny_checkpoint, mlxcel_checkpoint_cache):
    """A random DFlash drafter for ``tiny_checkpoint`` (a 2-layer qwen3), reading both
    its layers."""
    from dflash_fixtures import with_dflash
    from mlxcel.testing.checkpoint import build_once

    final = mlxcel_checkpoint_cache / f"{tiny_checkpoint.name}-dflash"
    return build_once(final, lambda tmp: with_dflash(tmp, tiny_checkpoint))


@pytest.fixture(scope="session")
def constant_pair(tiny_checkpoint, mlxcel_checkpoint_cache):
    """A target that says token 0 after any context and a DFlash drafter that always
    guesses it: every draft is kept."""
    from dflash_fixtures import constant_target, with_dflash
    from mlxcel.testing.checkpoint import build_once

    root = mlxcel_checkpoint_cache / f"{tiny_checkpoint.name}-constant"
    target = build_once(root, lambda tmp: constant_target(tmp, tiny_checkpoint))
    draft = build_once(root.with_name(f"{root.name}-dflash"),
                       lambda tmp: with_dflash(tmp, target, constant=True))
    return target, draft


@pytest.fixture(scope="session")
def gemma4_dflash_pair(mlxcel_checkpoint_cache):
    """A tiny float32 ``gemma4_text`` target (sliding-window and full attention, layers
    that share keys and values) and a random Gemma 4 DFlash drafter reading its 4
    layers."""
    from dflash_fixtures import with_dflash
    from mlxcel.testing.checkpoint import build_once, cached_checkpoint

    target = cached_checkpoint("gemma4_text", cache_dir=mlxcel_checkpoint_cache,
                               dtype="float32")
    draft = build_once(mlxcel_checkpoint_cache / f"{target.name}-dflash",
                       lambda tmp: with_dflash(tmp, target, model_type="gemma4",
                                               final_logit_softcapping=30.0))
    return target, draft

"""Fused projections (``mlxcel.engine.accel.fused_proj``): q/k/v and gate/up as one matmul each,
with the same outputs as the separate projections."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models import llama, qwen2
from mlxcel.engine.accel import fused_proj
from mlxcel.engine.config import EngineConfig
from mlxcel.errors import StartupError
from mlxcel.options import build_parser
from twin_models import SHAPE, twin_models


def size(model) -> int:
    return sum(p.size for _, p in tree_flatten(model.parameters()))


@pytest.mark.parametrize("module,model_type", [(llama, "llama"), (qwen2, "qwen2")])
def test_fused_model_gives_the_same_logits(module, model_type):
    plain, fused = twin_models(module, {**SHAPE, "model_type": model_type})
    before = size(fused)
    assert fused_proj.fuse(fused) == 2 * SHAPE["num_hidden_layers"]
    assert size(fused) == before  # the stacked weights replace the separate ones
    attn = fused.model.layers[0].self_attn
    assert not isinstance(attn.q_proj, nn.Linear)
    if model_type == "qwen2":  # biased q/k/v
        assert "bias" in attn.mlxcel_q_proj_stacked
    x = mx.array([[5, 9, 17, 33, 2, 8]])
    assert mx.allclose(plain(x), fused(x), atol=1e-5).item()


def test_quantized_projections_fuse_too():
    plain, fused = twin_models(llama, {**SHAPE, "model_type": "llama"})
    for m in (plain, fused):
        nn.quantize(m, group_size=32, bits=4)
    assert fused_proj.fuse(fused) == 4
    assert fused.model.layers[0].self_attn.mlxcel_q_proj_stacked.quant == (32, 4, "affine")
    x = mx.array([[5, 9, 17, 33]])
    assert mx.allclose(plain(x), fused(x), atol=1e-4).item()


class Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(8, 8, bias=False)
        self.k_proj = nn.Linear(8, 4, bias=False)
        self.v_proj = nn.Linear(8, 4, bias=False)


def reference(m: Attn):
    return {n: mx.array(getattr(m, n).weight) for n in ("q_proj", "k_proj", "v_proj")}


def test_parts_on_other_inputs_or_out_of_order_stay_exact():
    m = Attn()
    w = reference(m)
    assert fused_proj.fuse(m) == 1
    x, y = mx.random.normal((2, 8)), mx.random.normal((3, 8))

    def check(name, inp):
        assert mx.allclose(getattr(m, name)(inp), inp @ w[name].T, atol=1e-6).item()

    check("v_proj", x)  # out of order: the stacked product, then the others from it
    check("q_proj", x)
    check("q_proj", x)  # the same input twice
    check("k_proj", x)
    check("q_proj", y)  # a forward that stops half-way, then a new input
    check("q_proj", x)
    check("k_proj", x)
    check("v_proj", x)
    group = m.q_proj.func.__self__  # the partial of the group's project
    assert not group.split
    check("q_proj", x)  # cross-attention: keys and values from another input
    check("k_proj", y)
    check("v_proj", y)
    assert group.split
    check("q_proj", x)
    check("k_proj", y)


def test_mixed_or_unsupported_groups_are_left_alone():
    m = Attn()
    m.k_proj = nn.Linear(8, 4, bias=True)  # bias on one part only
    assert fused_proj.fuse(m) == 0 and isinstance(m.q_proj, nn.Linear)


def test_the_setting(monkeypatch):
    env = "MLXCEL_FUSE_PROJECTIONS"

    def parsed(*argv):
        return build_parser().parse_args(list(argv)).fuse_projections

    monkeypatch.delenv(env, raising=False)
    assert parsed() is None  # auto: the engine fuses on CUDA only
    assert parsed("--fuse-projections", "1") is True
    monkeypatch.setenv(env, "0")
    assert parsed() is False and parsed("--fuse-projections", "auto") is None
    monkeypatch.setenv(env, "sometimes")
    with pytest.raises(StartupError, match=env):
        build_parser()


def test_engine_with_fused_projections_gives_the_same_tokens(path):
    from apphelpers import PROMPTS
    from mlxcel.engine.worker import EngineWorker
    from mlxcel.model.loader import load_checkpoint
    from mlxcel.plugins import load_plugins
    from mlxcel.testing.engine import run_until_done, submit

    families = load_plugins().families
    outputs = {}
    for fuse in (None, False, True):  # None: auto, off on MLX's CPU device
        worker = EngineWorker(lambda: load_checkpoint(str(path), families), parallel=8,
                              config=EngineConfig(fuse_projections=fuse))
        assert worker.setup()
        stacked = [k for k in worker.checkpoint.model.model.model.layers[0].self_attn
                   if k.startswith("mlxcel_")]
        assert bool(stacked) == bool(fuse)
        sinks = [submit(worker, p, max_tokens=8) for p in PROMPTS]
        run_until_done(worker, sinks)
        outputs[fuse] = [s.tokens for s in sinks]
    assert outputs[None] == outputs[False] == outputs[True]

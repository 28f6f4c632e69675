"""The lean decode forward (``mlxcel.engine.accel.lean_decode``): the logits of the model's
own forward, on [B, D] activations, for the layouts it knows and no other."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
import structlog.testing
from mlx_lm.models import gemma3_text, llama, qwen2, qwen3
from mlxcel.engine.accel import fused_proj, lean_decode, module_attrs
from mlxcel.engine.cache.kvcache import BatchCache, shared_position_rope
from mlxcel.engine.config import EngineConfig
from mlxcel.errors import StartupError
from mlxcel.options import build_parser

SHAPE = dict(hidden_size=64, num_hidden_layers=3, intermediate_size=96, num_attention_heads=4,
             num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=300, rope_theta=10000.0,
             max_position_embeddings=512)
MODULES = {"llama": llama, "qwen2": qwen2, "qwen3": qwen3}


def model_of(model_type: str, tied: bool = False, **extra) -> nn.Module:
    mx.random.seed(7)
    args = {**SHAPE, "model_type": model_type, "tie_word_embeddings": tied, **extra}
    if model_type == "qwen3":
        args["head_dim"] = 16
    module = MODULES[model_type]
    model = module.Model(module.ModelArgs(**args))
    mx.eval(model.parameters())
    return model


def caches(model: nn.Module, pads: list[int], shared: bool) -> list[BatchCache]:
    rope = shared_position_rope(model, True) if shared else None
    return [BatchCache(pads, rope) for _ in model.layers]


def decode_both(model: nn.Module, lean, pads: list[int], shared: bool, steps: int = 4):
    """Logits of ``steps`` greedy decode steps, the model's own forward and ``lean``, each
    on caches prefilled with the same left-padded prompts."""
    prompts = mx.array([[11, 12, 13, 14, 15, 16], [0, 21, 22, 23, 24, 25]], dtype=mx.uint32)
    out = []
    for forward in (lean_decode.generic(model), lean):
        cache = caches(model, pads, shared)
        model(prompts, cache)
        tokens, logits = prompts[:, -1], []
        for _ in range(steps):
            step = forward(tokens, cache)
            logits.append(step)
            tokens = mx.argmax(step, axis=-1).astype(mx.uint32)
        out.append(mx.stack(logits))
    return out


@pytest.mark.parametrize("model_type", sorted(MODULES))
@pytest.mark.parametrize("shared", [True, False])
def test_lean_forward_gives_the_models_logits(model_type, shared):
    model = model_of(model_type, attention_bias=True) if model_type == "llama" \
        else model_of(model_type)
    lean = lean_decode.decoder(model)
    assert lean is not None
    want, got = decode_both(model, lean, [0, 1], shared)
    assert want.shape == got.shape == (4, 2, SHAPE["vocab_size"])
    assert mx.allclose(want, got, atol=1e-5).item()


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_lean_forward_on_fused_bound_quantized_and_tied_models(model_type):
    model = model_of(model_type, tied=True)
    nn.quantize(model, group_size=32, bits=4)
    fused_proj.fuse(model)
    module_attrs.bind(model)
    lean = lean_decode.decoder(model)  # after the structure is final, as at setup
    want, got = decode_both(model, lean, [2, 0], shared=True)
    assert mx.allclose(want, got, atol=1e-4).item()


VIEWS = ("Transpose", "Flatten", "Unflatten", "ExpandDims", "Squeeze")


def views(*outputs) -> int:
    """View primitives (no kernel of their own) in the unevaluated graph behind
    ``outputs``."""
    import re
    import tempfile

    with tempfile.NamedTemporaryFile("r", suffix=".dot") as f:
        mx.export_to_dot(f.name, *outputs)
        names = re.findall(r'label ="([^"]+)", shape=rectangle', f.read())
    return sum(name in VIEWS for name in names)


def test_lean_forward_builds_fewer_views():
    model = model_of("llama")
    fused_proj.fuse(model)
    tokens = mx.array([1, 2], dtype=mx.uint32)
    plain = views(lean_decode.generic(model)(tokens, caches(model, [0, 0], True)))
    lean = views(lean_decode.decoder(model)(tokens, caches(model, [0, 0], True)))
    assert lean <= plain / 2, (lean, plain)


def test_other_layouts_keep_the_models_forward():
    args = gemma3_text.ModelArgs(model_type="gemma3_text", hidden_size=64,
                                 num_hidden_layers=2, intermediate_size=96,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                 vocab_size=300, sliding_window=8)
    gemma = gemma3_text.Model(args)
    assert lean_decode.decoder(gemma) is None
    sliding = model_of("llama", layer_types=["sliding_attention", "full_attention",
                                             "full_attention"], sliding_window=4)
    assert lean_decode.decoder(sliding) is None
    forward, lean = lean_decode.forward_for(gemma, True, [])
    assert lean is False and forward is not None


def padded_check(model):
    def check():
        cache = caches(model, [0, 1], True)
        model(mx.array([[3, 4, 5, 6], [0, 8, 9, 10]], dtype=mx.uint32), cache)
        return cache, mx.array([11, 12], dtype=mx.uint32)

    return check


def test_a_forward_that_disagrees_or_fails_is_not_taken(monkeypatch):
    model = model_of("llama")
    lean = lean_decode.decoder(model)

    def scaled(tokens, cache):
        return lean(tokens, cache) * 1.5

    def fails(tokens, cache):
        raise ValueError("a layout the mirror gets wrong")

    check = padded_check(model)
    assert lean_decode.agrees(model, lean, check)
    with structlog.testing.capture_logs() as logs:
        assert not lean_decode.agrees(model, scaled, check)
    # the log says by how much: logits x 1.5 are half of the largest one off
    assert [e["deviation"] for e in logs if e["event"] == "lean_decode_disagrees"] \
        == [pytest.approx(0.5, rel=1e-2)]
    assert not lean_decode.agrees(model, fails, check)
    assert lean_decode.forward_for(model, True, [check])[1] is True
    assert lean_decode.forward_for(model, False, [check])[1] is False
    monkeypatch.setattr(lean_decode, "decoder", lambda m: scaled)
    assert lean_decode.forward_for(model, True, [check])[1] is False


def test_the_setting(monkeypatch):
    env = "MLXCEL_LEAN_DECODE"

    def parsed(*argv):
        return build_parser().parse_args(list(argv)).lean_decode

    monkeypatch.delenv(env, raising=False)
    assert parsed() is None and EngineConfig().lean_decode is None  # auto: CUDA only
    assert parsed("--lean-decode", "0") is False and parsed("--lean-decode", "1") is True
    monkeypatch.setenv(env, "0")
    assert parsed() is False
    monkeypatch.setenv(env, "maybe")
    with pytest.raises(StartupError, match=env):
        build_parser()


@pytest.mark.parametrize("shape", ["llama", "qwen2"])
def test_engine_batches_the_same_tokens_lean_or_not(shape, mlxcel_checkpoint_cache):
    """Rows of mixed lengths on ``--parallel 4``, joining and leaving mid-batch: the same
    greedy tokens with the lean forward as without."""
    from mlxcel.testing.checkpoint import cached_checkpoint
    from mlxcel.testing.engine import run_until_done, submit, worker_for

    path = cached_checkpoint(shape, cache_dir=mlxcel_checkpoint_cache, dtype="float32")
    prompts = [list(range(5, 5 + n)) for n in (5, 23, 40, 9, 31, 3)]
    outputs = []
    for lean in (False, True):
        worker = worker_for(path, parallel=4, chunk=16, lean_decode=lean)
        assert worker.path == "shared"
        assert worker.forward.__qualname__.startswith("mirrored") is lean
        sinks = [submit(worker, p, max_tokens=6 + i) for i, p in enumerate(prompts)]
        run_until_done(worker, sinks)
        outputs.append([s.tokens for s in sinks])
    assert outputs[0] == outputs[1]


def test_models_on_the_mixed_path_keep_their_forward(mlxcel_checkpoint_cache):
    """Gemma 4 decodes on mlx-lm's batch caches through its own forward, lean asked or
    not (no mirror of its layers is kept: one measured slower on CUDA at batch 1)."""
    from mlxcel.testing.checkpoint import cached_checkpoint
    from mlxcel.testing.engine import worker_for

    path = cached_checkpoint("gemma4_text", cache_dir=mlxcel_checkpoint_cache, dtype="float32")
    worker = worker_for(path, parallel=4, lean_decode=True)
    assert worker.path == "mixed"
    assert worker.forward.__qualname__.startswith("generic")


def test_the_engine_batch_line_says_how_long_its_setup_steps_took(mlxcel_checkpoint_cache):
    """An operator reads where startup time goes from the log: the attention path and
    fused projections, and the lean forward's agreement check, each in seconds."""
    from mlxcel.testing.checkpoint import cached_checkpoint
    from mlxcel.testing.engine import worker_for
    from structlog.testing import capture_logs

    path = cached_checkpoint("llama", cache_dir=mlxcel_checkpoint_cache, dtype="float32")
    with capture_logs() as logs:
        worker_for(path, parallel=2, lean_decode=True)
    line = next(e for e in logs if e["event"] == "engine_batch")
    assert line["lean_decode"] is True
    for key in ("attention_and_fuse_s", "decode_check_s"):
        assert isinstance(line[key], float) and line[key] >= 0

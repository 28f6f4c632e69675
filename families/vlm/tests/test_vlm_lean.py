"""The lean decode step of Qwen-VL language models (``mlxcel_family_vlm.lean``): the logits
of the model's own forward for text rows and shifted image rows, the same tokens from the
engine with it as without, and the model's own forward for every other layout."""

from __future__ import annotations

import asyncio

import mlx.core as mx
import pytest
from mlxcel.engine.accel import lean_decode
from mlxcel.engine.cache.kvcache import BatchCache
from mlxcel.families.api import LoadOptions
from mlxcel.testing.engine import collect, cpu_policy, engine_for, media_request, request
from mlxcel.testing.vlm_reference import noise_item

QWEN = ["qwen2_vl", "qwen2_5_vl"]


def _model(path):
    from mlxcel_family_vlm.load import decoder, load

    return decoder(load(path, LoadOptions()))


def _steps(model, forward, shift, steps: int = 5) -> mx.array:
    """Logits of ``steps`` greedy decode steps through ``forward``, from caches that hold
    three left-padded prompts (a row of each length)."""
    prompts = mx.array([[11, 12, 13, 14, 15, 16], [0, 0, 21, 22, 23, 24],
                        [0, 31, 32, 33, 34, 35]], dtype=mx.uint32)
    cache = [BatchCache([0, 2, 1]) for _ in model.make_cache()]
    model(prompts, cache)
    tokens, out = prompts[:, -1], []
    for _ in range(steps):
        logits = forward(tokens, cache) if shift is None else forward(tokens, cache, shift)
        out.append(logits)
        tokens = mx.argmax(logits, axis=-1).astype(mx.uint32)
    return mx.stack(out)


@pytest.mark.parametrize("shape", QWEN)
@pytest.mark.parametrize("shift", [None, [0, 7, 300]])
def test_the_lean_step_gives_the_models_logits(vlm_checkpoint, shape, shift):
    """``shift``: each row's rope delta, as image rows carry them (0: a text row)."""
    model = _model(vlm_checkpoint(shape))
    lean = model.lean_decoder()
    assert lean is not None
    shifts = None if shift is None else mx.array(shift, dtype=mx.int32)
    want = _steps(model, lean_decode.generic(model), shifts)
    got = _steps(model, lean, shifts)
    scale = mx.max(mx.abs(want)).item()
    assert mx.max(mx.abs(want - got)).item() <= 1e-5 * scale
    if shift is not None:  # the shift moves the positions: the logits differ without it
        unshifted = _steps(model, lean, None)
        assert mx.max(mx.abs(unshifted - got)).item() > 1e-3 * scale


def test_other_layouts_keep_the_models_forward(vlm_checkpoint):
    assert _model(vlm_checkpoint("gemma3")).lean_decoder() is None  # no M-RoPE
    model = _model(vlm_checkpoint("qwen2_vl"))
    layer = model.language_model.model.layers[-1]
    layer.__class__ = type("Changed", (type(layer),), {})  # a layer the mirror does not know
    assert model.lean_decoder() is None


@pytest.mark.parametrize("shape", QWEN)
def test_the_lean_step_rounds_as_the_model_does_in_bfloat16(vlm_checkpoint, shape):
    """The rotation is the model's own (its cos/sin tables, its apply), so in bfloat16
    the lean step gives the model's logits within the kernel order's noise, as the
    engine's startup check asks on a GPU."""
    from mlxcel_family_vlm.load import decoder, load

    model = decoder(load(vlm_checkpoint(shape), LoadOptions(dtype="bfloat16")))
    assert not lean_decode._precise(model)  # the startup check's bf16 tolerance
    assert lean_decode._precise(_model(vlm_checkpoint(shape)))  # float32: the tight one
    shifts = mx.array([0, 7, 300], dtype=mx.int32)
    want = _steps(model, lean_decode.generic(model), shifts).astype(mx.float32)
    got = _steps(model, model.lean_decoder(), shifts).astype(mx.float32)
    assert mx.max(mx.abs(want - got)).item() <= 1e-3 * mx.max(mx.abs(want)).item()


@pytest.mark.parametrize("shape", QWEN)
def test_the_engine_gives_the_same_tokens_lean_or_not(vlm_checkpoint, shape):
    """Image rows (shifted positions) and text rows decoding in one batch, joining and
    leaving it: the same greedy tokens with the lean step as with the model's forward."""
    from tokenizers import Tokenizer

    path = vlm_checkpoint(shape)
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    mark = "<|vision_start|><|image_pad|><|vision_end|>"
    texts = [f"Look at {mark} and say what colour it is.",
             f"Here is a picture {mark} of something; describe it."]
    ids = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    outputs = []
    for lean in (False, True):
        engine = engine_for(path, parallel=4, chunk=16,
                            policy=cpu_policy(lean_decode=lean, burst_chunks=8))
        try:
            model = engine.worker.checkpoint.model
            assert engine.worker.forward.__qualname__.startswith("mirrored") is lean
            reqs = [media_request(model.expand_media(p, [noise_item(seed)], {}), 6 + seed)
                    for seed, p in enumerate(ids)]
            reqs += [request(ids[0][:9], 5), request(ids[1][:4], 9)]

            async def go(reqs=reqs, engine=engine):
                return await asyncio.gather(*(collect(engine, r) for r in reqs))

            outputs.append([tokens for tokens, _ in asyncio.run(go())])
        finally:
            engine.shutdown()
    assert outputs[0] == outputs[1]
    assert all(outputs[0])

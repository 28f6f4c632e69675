"""The engine's warm-up plays one image row's life on a VLM (``accel.warmup.media_lifecycle``):
the vision tower runs during setup, before any client's image, and the engine then serves
an image request as an engine without the warm-up does."""

from __future__ import annotations

import pytest
from mlxcel.engine import mixed_batch
from mlxcel.engine.accel.warmup import media_lifecycle, media_prompt
from mlxcel.engine.cache.kvcache import shared_position_rope
from mlxcel.model.loader import load_checkpoint
from mlxcel.plugins import load_plugins
from mlxcel.testing.engine import cpu_policy, engine_for, media_request, run
from structlog.testing import capture_logs


class Counting:
    """``model`` with its media embeddings counted (the call that runs the tower)."""

    def __init__(self, model) -> None:
        self.model, self.calls = model, 0

    def media_embeddings(self, prompt, features):
        self.calls += 1
        return self.model.media_embeddings(prompt, features)

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.model, name)


@pytest.mark.parametrize("shape", ["qwen2_vl", "gemma3"])
def test_the_warm_up_feeds_a_synthetic_image_through_the_tower(vlm_checkpoint, shape):
    checkpoint = load_checkpoint(str(vlm_checkpoint(shape)), load_plugins().families)
    model = Counting(checkpoint.model)
    prompt = media_prompt(model, checkpoint.tokenizer)
    assert len(prompt.spans) == 1 and prompt.spans[0][1] > 0
    path, merge, _ = mixed_batch.cache_path(checkpoint.model, checkpoint.family)
    rope = shared_position_rope(checkpoint.model, True) if path == "shared" else None
    media_lifecycle(model, rope, checkpoint.tokenizer.vocab_size, prompt,
                    merge=merge if path == "mixed" else None)
    assert model.calls == 1


def test_a_warmed_engine_serves_an_image_as_a_cold_one(vlm_checkpoint):
    path = vlm_checkpoint("qwen2_vl")
    checkpoint = load_checkpoint(str(path), load_plugins().families)
    prompt = media_prompt(checkpoint.model, checkpoint.tokenizer)
    tokens = []
    for policy in (None, cpu_policy(warm_up=True)):
        with capture_logs() as logs:
            engine = engine_for(path, parallel=2, chunk=32, policy=policy)
        try:
            (out, _), = run(engine, [media_request(prompt, max_tokens=6)])
            tokens.append(out)
        finally:
            engine.shutdown()
        events = {e["event"]: e for e in logs}
        assert "engine_media_warmup_failed" not in events
        warmed = events.get("engine_warmup", {})
        assert ("media_s" in warmed) == (policy is not None), events
    assert tokens[0] == tokens[1] and len(tokens[0]) == 6

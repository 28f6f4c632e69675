"""A row's first token comes from its prompt's own forward: the prefill's last chunk gives
the logits at each prompt's last position (the output projection narrowed to that column,
``mlxcel.engine.heads``), and the join samples and hands them out before any decode step.
"""

from __future__ import annotations

import random

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache
from mlxcel.engine.heads import Heads, pick
from mlxcel.model.loader import load_checkpoint
from mlxcel.plugins import load_plugins
from mlxcel.testing.checkpoint import cached_checkpoint
from mlxcel.testing.engine import run_until_done, submit, worker_for

rng = random.Random(11)
PROMPT = [rng.randrange(5, 400) for _ in range(27)]
BLOCKS = [rng.randrange(5, 400) for _ in range(32)]  # two of the prompt cache's blocks


def _model(path):
    return load_checkpoint(str(path), load_plugins().families).model


def _reference(model, prompt, n):
    """mlx-lm's own generate loop, greedy: what the engine's tokens must be."""
    steps = generate_step(mx.array(prompt), model, max_tokens=n,
                          prompt_cache=make_prompt_cache(model),
                          sampler=lambda logits: mx.argmax(logits, axis=-1))
    return [int(t) for t, _ in steps]


@pytest.mark.parametrize("shape", ["qwen3", "gemma3_text", "qwen3_next"])
def test_the_first_token_goes_out_at_the_join_before_any_decode_step(shape,
                                                                    mlxcel_checkpoint_cache):
    path = cached_checkpoint(shape, cache_dir=mlxcel_checkpoint_cache, dtype="float32")
    worker = worker_for(path, chunk=16, parallel=4)
    sink = submit(worker, PROMPT, max_tokens=8)
    steps = 0
    while not sink.tokens:
        worker.step()
        steps += 1
    # out in the iteration of the prompt's last chunk (27 tokens: 2 chunks of 16), not
    # read back from a decode step in the next one
    assert steps == worker.stats.prefill_chunks_processed == 2
    assert worker.stats.total_decode_tokens == 1
    assert worker.heads.targets  # the projection was narrowed for these models
    run_until_done(worker, [sink])
    assert sink.tokens == _reference(_model(path), PROMPT, 8)


def test_a_one_token_answer_needs_no_decode_step_and_is_stored(path):
    worker = worker_for(path, cache=True, chunk=64, parallel=4)
    sink = submit(worker, BLOCKS, max_tokens=1)
    run_until_done(worker, [sink], settle=True)
    assert len(sink.tokens) == 1 and worker.stats.decode_steps_processed == 0
    assert not worker.batch  # it left with its finish
    # the whole prompt was stored: the same prompt with one more token reuses all of it
    assert worker.prompt_cache.stats()["entries"] == 1
    again = submit(worker, [*BLOCKS, sink.tokens[0], 7], max_tokens=2)
    run_until_done(worker, [again])
    assert again.events[-1].usage.cached_tokens == len(BLOCKS)


def test_rows_of_unequal_tails_each_take_their_own_last_position(mlxcel_checkpoint_cache):
    """On mlx-lm's batch caches a group's rows are right-padded, so a short row's prompt
    ends in an earlier chunk than a long one's: each still gets its own first token."""
    path = cached_checkpoint("gemma3_text", cache_dir=mlxcel_checkpoint_cache,
                             dtype="float32")
    prompts = [PROMPT, PROMPT[:5], PROMPT[:18]]
    worker = worker_for(path, chunk=48, parallel=4)
    sinks = [submit(worker, p, max_tokens=4) for p in prompts]
    run_until_done(worker, sinks)
    model = _model(path)
    assert [s.tokens for s in sinks] == [_reference(model, p, 4) for p in prompts]


def test_the_narrowed_projection_gives_the_full_forwards_logits_and_is_restored(path):
    model = _model(path)
    heads = Heads.for_model(model)
    assert heads.targets
    owner, attr = heads.targets[0]
    before = vars(owner).get(attr)
    tokens = mx.array([[5, 6, 7, 8, 9], [10, 11, 12, 13, 14]], dtype=mx.uint32)
    cols = mx.array([4, 2], dtype=mx.int32)
    want = pick(model(tokens, make_prompt_cache(model)), cols)
    with heads.only(cols):
        narrow = model(tokens, make_prompt_cache(model))
    assert narrow.shape[1] == 1  # only the chosen column was projected
    assert mx.allclose(pick(narrow, cols), want, atol=1e-4).item()
    assert vars(owner).get(attr) is before  # the model's own projection again


class _MixingHead(nn.Module):
    """A model whose logits mix positions after the head: narrowing would change them."""

    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(32, 8)
        self.lm_head = nn.Linear(8, 32)

    def __call__(self, tokens: mx.array, cache=None) -> mx.array:
        return mx.cumsum(self.lm_head(self.embed_tokens(tokens)), axis=1)

    def make_cache(self) -> list:
        return []


def test_a_head_that_does_not_agree_is_left_alone():
    model = _MixingHead()
    heads = Heads.for_model(model)
    assert not heads.targets  # full logits, then the column taken
    tokens = mx.array([[1, 2, 3]], dtype=mx.uint32)
    got = heads.logits(lambda: model(tokens), None)
    assert mx.allclose(got, model(tokens)[:, -1]).item()

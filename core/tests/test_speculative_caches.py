"""Speculation on the mixed path: sliding-window (rotating) and recurrent caches roll back
per row (``mlxcel.engine.cache.rollback``), the output stays exact, and what the prompt
cache stores of a row after verify steps is exactly its context.

Checkpoints are float32 with a 16-token window (``mlxcel.testing.configs.WINDOW``), so the
rings wrap during every run; prompts repeat so that prompt lookup proposes drafts.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import (
    ArraysCache,
    BatchKVCache,
    BatchRotatingKVCache,
    KVCache,
    RotatingKVCache,
)
from mlxcel.engine.cache.rollback import begin_verify, leaves
from mlxcel.engine.config import EngineConfig
from mlxcel.testing.checkpoint import cached_checkpoint
from mlxcel.testing.engine import ListSink, request, run_joining, worker_for
from mlxcel.testing.stub_drafters import OneWrong
from mlxcel.types import SamplingParams

LOOKUP = "mlxcel.drafters.lookup:new_session"
MODELS = {"gemma3": ("gemma3_text", None), "gpt-oss": ("gpt_oss", None),
          "qwen3-next": ("qwen3_next", None), "jamba": ("jamba", None),
          "nemotron-h": ("nemotron_h", None)}
# different lengths, around and past the window; each repeats a run of tokens
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12] * 4, [20, 21, 22, 23] * 3, [40, 41, 42] * 9,
           [100, 200, 100, 200, 100, 200], [60 + i % 7 for i in range(21)]]
MAX_TOKENS = [40, 24, 33, 45, 28]


def checkpoint(name, cache_dir):
    shape, overrides = MODELS[name]
    return cached_checkpoint(shape, cache_dir=cache_dir, dtype="float32", config=overrides)


def spec_config(drafter=LOOKUP, **kw) -> EngineConfig:
    return EngineConfig(drafter=drafter, prompt_lookup="on", draft_max=6, **kw)


def run(path, config=None, parallel=3, sampling=SamplingParams(temperature=0.0), **policy):
    """Every prompt, one joining per engine step (more than ``parallel`` rows in all, so
    rows wait, join a running batch and leave it at different times)."""
    reqs = [request(prompt, n, sampling) for prompt, n in zip(PROMPTS, MAX_TOKENS, strict=True)]
    return run_joining(path, reqs, config, parallel=parallel, chunk=16, **policy)


# -- exactness on the engine ------------------------------------------------------------------


@pytest.mark.parametrize("name,stages", [("gemma3", 1), ("gpt-oss", 1), ("qwen3-next", 1),
                                         ("gemma3", 4), ("qwen3-next", 4)])
def test_greedy_output_is_the_same_with_and_without_speculation(name, stages,
                                                                mlxcel_checkpoint_cache):
    """Ragged acceptance, rows joining and leaving, rings wrapping: the tokens of
    one-token decoding; also with the verify forward queued in stages (CUDA's policy)."""
    path = checkpoint(name, mlxcel_checkpoint_cache)
    plain, _, base = run(path)
    assert base.path == "mixed" and base.spec is None
    stub = OneWrong({tuple(p): out for p, out in zip(PROMPTS, plain, strict=True)})
    fast, usages, worker = run(path, spec_config(drafter=stub), verify_stages=stages)
    assert worker.spec is not None, "speculation stayed off"
    assert fast == plain
    accepted = [u.draft_n_accepted for u in usages]
    assert sum(accepted) > 0 and len(set(accepted)) > 1  # ragged acceptance
    assert sum(u.draft_n for u in usages) > sum(accepted)  # some drafts were rejected
    assert worker.stats.draft_rounds > 0


@pytest.mark.parametrize("name", ["gemma3", "qwen3-next"])
def test_prompt_lookup_on_repeating_prompts_keeps_the_output(name, mlxcel_checkpoint_cache):
    """The prompt-lookup drafter forced on, the output held to two tokens by a logit bias
    (the model's own logits choose between them): the runs it repeats give the drafter
    n-grams to copy, which the model keeps in part; every rejection rolls the caches
    back."""
    path = checkpoint(name, mlxcel_checkpoint_cache)
    two = SamplingParams(temperature=0.0, logit_bias=((31, 100.0), (32, 100.0)))
    plain, _, _ = run(path, sampling=two)
    fast, usages, worker = run(path, spec_config(), sampling=two)
    assert worker.spec is not None and fast == plain
    assert sum(u.draft_n for u in usages) > sum(u.draft_n_accepted for u in usages) > 0


@pytest.mark.parametrize("name", ["jamba", "nemotron-h"])
def test_rows_that_cannot_replay_keep_speculation_off(name, mlxcel_checkpoint_cache):
    """Ragged acceptance cannot be replayed on these (see the test below): no drafting."""
    worker = worker_for(checkpoint(name, mlxcel_checkpoint_cache), parallel=2,
                        config=spec_config())
    assert worker.path == "mixed" and worker.spec is None


# -- what the prompt cache stores --------------------------------------------------------------

def _fresh(model, tokens):
    caches = model.make_cache()
    model(mx.array([tokens], dtype=mx.uint32), caches)
    mx.eval([c.state for c in caches])
    return caches


def _window(cache):
    """A single-row attention cache's last ``size()`` keys/values, in temporal order."""
    if type(cache) is RotatingKVCache:
        n = cache.size()
        return (cache._temporal_order(cache.keys)[..., -n:, :],
                cache._temporal_order(cache.values)[..., -n:, :])
    return cache.keys[..., :cache.offset, :], cache.values[..., :cache.offset, :]


def _same_state(stored, fresh):
    for mine, theirs in zip(stored, fresh, strict=True):
        assert type(mine) is type(theirs)
        if isinstance(mine, ArraysCache):
            for a, b in zip(mine.cache, theirs.cache, strict=True):
                assert mx.allclose(a, b, atol=1e-4).item()
            continue
        assert mine.offset == theirs.offset
        for a, b in zip(_window(mine), _window(theirs), strict=True):
            assert a.shape == b.shape and mx.allclose(a, b, atol=1e-4).item()


@pytest.mark.parametrize("name", ["gemma3", "qwen3-next"])
def test_a_rows_snapshot_after_verify_steps_holds_exactly_its_context(
        name, mlxcel_checkpoint_cache):
    """Mid-run, after verify steps that kept and rejected drafts, each row's copy for the
    prompt cache (``MixedOps.snapshots``) is the state a fresh prefill of the tokens it
    names gives, and names the row's context up to what its caches were fed."""
    path = checkpoint(name, mlxcel_checkpoint_cache)
    plain, _, _ = run(path)
    stub = OneWrong({tuple(p): out for p, out in zip(PROMPTS, plain, strict=True)})
    worker = worker_for(path, parallel=3, config=spec_config(drafter=stub), chunk=16)
    sinks = [ListSink() for _ in range(3)]
    for sink, prompt, n in zip(sinks, PROMPTS[:3], MAX_TOKENS[:3], strict=True):
        worker.enqueue(request(prompt, n, SamplingParams(temperature=0.0)), sink)
    checked = 0
    while not all(s.done for s in sinks):
        worker.step()
        if worker.inflight is not None:
            continue  # the last step was a one-token step
        for seq in worker.batch.rows:  # after a verify step, before the next
            if seq.finished or not 0 < seq.drafts.accepted < seq.drafts.drafted:
                continue
            (tokens, stored), = worker.batch.snapshots([seq])
            assert tokens == seq.context[:-1]  # all but the bonus token, next step's input
            _same_state(stored.caches, _fresh(worker.checkpoint.model, tokens))
            checked += 1
    assert checked >= 6


# -- the caches one by one ---------------------------------------------------------------------

def _kv(cols, dtype=mx.float32):
    k = mx.array(cols, dtype=dtype)[:, None, :, None]  # [B, 1, n, 1]: a value per token
    return k, k


def _feed(cache, cols):
    cache.update_and_fetch(*_kv(cols))


def _tokens(single):
    keys, _ = _window(single)
    return keys.reshape(-1).tolist()


@pytest.mark.parametrize("kind", ["plain", "rotating"])
def test_ragged_rollback_leaves_each_row_what_its_kept_tokens_give(kind):
    """Two rows, the second shorter (left-padded); a window of 4 that has wrapped; a
    5-token verify feed in which row 0 keeps 3 and row 1 keeps 1. Each row then holds what
    a single-row cache fed only its kept tokens holds, and decodes on from there."""
    rows = [list(range(1, 12)), list(range(20, 26))]
    kept = [[101, 102, 103], [201]]

    def single(tokens):
        c = KVCache() if kind == "plain" else RotatingKVCache(4)
        for t in tokens:
            _feed(c, [[t]])
        return c

    caches = [BatchKVCache.merge([single(r) for r in rows]) if kind == "plain"
              else BatchRotatingKVCache.merge([single(r) for r in rows])]
    for t in range(3):  # one-token steps: the batch ring rotates
        _feed(caches[0], [[50 + t], [60 + t]])
    rows = [rows[0] + [50, 51, 52], rows[1] + [60, 61, 62]]
    feed = mx.array([[*kept[0], 0, 0], [*kept[1], 7, 7, 7, 7]], dtype=mx.uint32)
    begin_verify(None, caches, feed)
    _feed(caches[0], [[*kept[0], 104, 105], [*kept[1], 202, 203, 204, 205]])
    for c in caches:
        c.rollback([2, 4])
    assert not hasattr(caches[0], "rollback")  # detached once every layer rolled back
    _feed(caches[0], [[110], [210]])  # the next one-token step
    for i in range(2):
        expect = single(rows[i] + kept[i] + [110 if i == 0 else 210])
        got = caches[0].extract(i)
        assert _tokens(got) == _tokens(expect)
        assert got.offset == expect.offset


def test_a_rotated_ring_is_in_temporal_order_before_the_verify_mask():
    """mlx-lm's batch ring builds a multi-token mask as if the update had not yet put the
    ring in temporal order: a padded row that joined late would lose its oldest key.
    ``begin_verify`` orders the ring first, so each query sees its whole window."""
    def single(tokens):
        c = RotatingKVCache(8)
        for t in tokens:
            _feed(c, [[t]])
        return c

    cache = BatchRotatingKVCache.merge([single(list(range(1, 21))), single([101, 102, 103])])
    for t in range(3):
        _feed(cache, [[30 + t], [110 + t]])
    assert cache.rotated
    feed = mx.array([[40, 41, 42], [120, 121, 122]], dtype=mx.uint32)
    begin_verify(None, [cache], feed)
    mask = cache.make_mask(3)
    keys, _ = cache.update_and_fetch(*_kv(feed.tolist()))
    seen = [int(k) for k, m in zip(keys[1, 0, :, 0].tolist(), mask[1, 0, 0].tolist(),
                                   strict=True) if m]
    assert seen == [101, 102, 103, 110, 111, 112, 120]
    cache.rollback([0, 0])


def test_recurrent_state_is_replayed_for_the_kept_tokens():
    """An ``ArraysCache`` layer beside a KV layer, driven by a toy model whose state is a
    running sum: after a ragged verify step each row's state sums exactly its kept tokens,
    and its KV layer holds them."""

    class Toy:
        def __call__(self, tokens, caches):
            kv, state = caches
            x = tokens.astype(mx.float32)
            kv.update_and_fetch(x[:, None, :, None], x[:, None, :, None])
            if state.lengths is not None:  # right padding: only each row's own tokens
                x = mx.where(mx.arange(x.shape[1])[None] < state.lengths[:, None], x, 0)
            prev = state[0] if state[0] is not None else mx.zeros((x.shape[0], 1))
            state[0] = prev + x.sum(axis=1, keepdims=True)
            state.advance(x.shape[1])
            return x

    model = Toy()
    caches = [BatchKVCache([0, 0]), ArraysCache(1)]
    model(mx.array([[1, 2], [3, 4]]), caches)
    feed = mx.array([[10, 11, 12, 13], [20, 21, 22, 23]], dtype=mx.uint32)
    begin_verify(model, caches, feed)
    model(feed, caches)
    for c in caches:
        c.rollback([1, 3])  # row 0 keeps 3 tokens, row 1 keeps 1
    assert caches[1][0].reshape(-1).tolist() == [1 + 2 + 10 + 11 + 12, 3 + 4 + 20]
    assert caches[1].lengths is None
    assert _tokens(caches[0].extract(0)) == [1, 2, 10, 11, 12]
    assert _tokens(caches[0].extract(1)) == [3, 4, 20]


def test_which_models_roll_back_and_why_not(mlxcel_checkpoint_cache):
    """Rotating and recurrent kinds roll back; jamba's state layers ignore padding, and
    Nemotron-H's SSM drops a right-padded row's state (checked on the model), so neither
    can replay ragged acceptance."""
    from mlxcel.engine.cache.rollback import rollback_reason
    from mlxcel.engine.mixed_batch import pads_state
    from mlxcel.model.loader import load_checkpoint
    from mlxcel.plugins import load_plugins

    families = load_plugins().families
    expect = {"gemma3": None, "qwen3-next": None, "jamba": "do not mask padding",
              "nemotron-h": "lose their state under right padding"}
    for name, why in expect.items():
        ckpt = load_checkpoint(str(checkpoint(name, mlxcel_checkpoint_cache)), families)
        kinds = {type(leaf) for c in ckpt.model.make_cache() for leaf in leaves(c)}
        assert kinds & {RotatingKVCache, ArraysCache}
        reason = rollback_reason(ckpt.model, ckpt.family, pads_state(ckpt.model))
        assert (reason is None) if why is None else (why in reason), (name, reason)

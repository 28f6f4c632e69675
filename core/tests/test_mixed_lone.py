"""A lone row of a model on mlx-lm's batch caches decodes on the model's own plain caches,
as mlx-lm's generate loop does; a second row joining moves it to batch caches and back to
plain ones when it is alone again, with the tokens unchanged.

Checkpoints are float32 (see test_mixed_batch.py's docstring).
"""

from __future__ import annotations

import random

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache
from mlxcel.engine.cache.kinds import arrays, is_lone, lone_kinds, private
from mlxcel.model.loader import load_checkpoint
from mlxcel.plugins import load_plugins
from mlxcel.testing.checkpoint import cached_checkpoint
from mlxcel.testing.engine import run_until_done, solo_outputs, submit, worker_for

rng = random.Random(5)
LONG = [rng.randrange(5, 400) for _ in range(40)]  # past the 16-token window
SHORT = [rng.randrange(5, 400) for _ in range(9)]


def gemma4(cache_dir):
    return cached_checkpoint("gemma4_text", cache_dir=cache_dir, dtype="float32")


def _kinds(worker) -> str:
    """What the running batch decodes on: "lone", "batch" or "" (no batch)."""
    if not worker.batch or worker.batch.cache is None:
        return ""
    return "lone" if is_lone(worker.batch.cache) else "batch"


def test_a_lone_row_takes_the_plain_step_of_mlx_lms_generate_loop(mlxcel_checkpoint_cache):
    """Its caches are the model's ``make_cache()`` kinds with integer offsets, and its
    greedy tokens are mlx-lm's own generate loop's on them."""
    path = gemma4(mlxcel_checkpoint_cache)
    worker = worker_for(path, chunk=16, parallel=4)
    sink = submit(worker, LONG, max_tokens=12)
    seen = set()
    while not sink.done:
        worker.step()
        seen.add(_kinds(worker))
        if worker.batch and worker.batch.cache is not None:
            assert {type(c) for c in worker.batch.cache} == {KVCache, RotatingKVCache}
            assert all(isinstance(c.offset, int) for c in worker.batch.cache)
    assert seen - {""} == {"lone"}
    model = load_checkpoint(str(path), load_plugins().families).model
    steps = generate_step(mx.array(LONG), model, max_tokens=12, prompt_cache=make_prompt_cache(model),
                          sampler=lambda logits: mx.argmax(logits, axis=-1))
    assert sink.tokens == [int(t) for t, _ in steps]


def test_rows_joining_and_leaving_a_lone_row_keep_every_rows_tokens(mlxcel_checkpoint_cache):
    """A row alone, a second joining it (batch caches), leaving (plain again), a third
    joining: every row gets the tokens it gets alone."""
    path = gemma4(mlxcel_checkpoint_cache)
    worker = worker_for(path, chunk=16, parallel=4, lazy_leave=False)
    first = submit(worker, LONG, max_tokens=30)
    seen: list[str] = []
    later = []
    for prompt, n in ((SHORT, 5), (LONG[:23], 4)):
        while len(first.tokens) < 4 + 10 * len(later):
            worker.step()
            seen.append(_kinds(worker))
        later.append(submit(worker, prompt, max_tokens=n))
    while not first.done:
        worker.step()
        seen.append(_kinds(worker))
    states = [k for i, k in enumerate(seen) if k and (i == 0 or k != seen[i - 1])]
    assert states == ["lone", "batch", "lone", "batch", "lone"]
    alone = solo_outputs(path, [LONG, SHORT, LONG[:23]], max_tokens=[30, 5, 4], chunk=16)
    assert [first.tokens, *(s.tokens for s in later)] == alone


def test_the_whole_cuda_policy_on_a_lone_row_and_its_joiners(mlxcel_checkpoint_cache):
    """Every choice CUDA resolves, run on this device: a lone row (plain caches, bound
    submodules, fused projections), rows joining it and lazily leaving, a prompt-cache
    hit among them: each gets its solo tokens."""
    path = gemma4(mlxcel_checkpoint_cache)
    worker = worker_for(path, cache=True, chunk=16, hold_groups=True, burst_chunks=8,
                        lazy_leave=True, emit_first=True, fuse_projections=True,
                        bind_modules=True, decode_attention="grouped", prefill_align=32)
    first = submit(worker, LONG, max_tokens=12)
    run_until_done(worker, [first], settle=True)
    lone = submit(worker, LONG, max_tokens=12)
    while len(lone.tokens) < 3:
        worker.step()
    assert is_lone(worker.batch.cache)
    prompts = [LONG + first.tokens + [4, 5], SHORT, LONG[:23]]  # the first: a cache hit
    sinks = [submit(worker, p, max_tokens=6) for p in prompts]
    run_until_done(worker, [lone, *sinks])
    assert sinks[0].last.usage.cached_tokens > len(LONG)
    want = solo_outputs(path, [LONG, *prompts], max_tokens=[12, 6, 6, 6], chunk=16)
    assert [lone.tokens, *(s.tokens for s in sinks)] == want


def test_a_lone_row_from_a_stored_entry_leaves_the_entry_as_it_was(mlxcel_checkpoint_cache):
    """The agent-turn case: a lone row starting from a prompt-cache entry whose rotating
    layers are full decodes in place on its own arrays, never the entry's, and gets the
    tokens of a cold run."""
    path = gemma4(mlxcel_checkpoint_cache)
    worker = worker_for(path, cache=True, chunk=16, parallel=2)
    first = submit(worker, LONG, max_tokens=8)
    run_until_done(worker, [first], settle=True)
    entry, = worker.prompt_cache._entries.values()
    stored = [mx.array(a) for a in arrays(entry.payload.caches)]
    mx.eval(stored)
    turn2 = LONG + first.tokens + [7, 8, 9]
    second = submit(worker, turn2, max_tokens=8)
    run_until_done(worker, [second], settle=True)
    assert second.last.usage.cached_tokens >= len(LONG) + len(first.tokens) - 1
    assert all(mx.array_equal(a, b) for a, b in zip(arrays(entry.payload.caches), stored,
                                                     strict=True))
    assert second.tokens == solo_outputs(path, [turn2], max_tokens=8, chunk=16)[0]


def test_private_copies_share_no_array_handle_with_the_entry():
    entry = RotatingKVCache(4)
    entry.update_and_fetch(mx.ones((1, 1, 4, 2)), mx.ones((1, 1, 4, 2)))
    mine, = private([entry])
    mine.update_and_fetch(mx.zeros((1, 1, 1, 2)), mx.zeros((1, 1, 1, 2)))
    assert mine.offset == 5 and entry.offset == 4
    assert entry.keys.sum().item() == 8  # the entry's slots are as they were


def test_private_caches_are_views_until_written():
    """A restore's caches hold the entry's buffers, not copies of them (a 32k-token
    entry would otherwise be copied once here and once more by its first write); the
    first write then leaves the entry's values as they were."""
    entry = KVCache()
    entry.update_and_fetch(mx.ones((1, 4, 4096, 128)), mx.ones((1, 4, 4096, 128)))
    mx.eval(entry.keys, entry.values)
    before = mx.get_active_memory()
    mine, = private([entry])
    mx.eval(mine.keys, mine.values)
    assert mx.get_active_memory() - before < entry.keys.nbytes // 2
    mine.update_and_fetch(mx.zeros((1, 4, 1, 128)), mx.zeros((1, 4, 1, 128)))
    assert entry.offset == 4096 and entry.keys.sum().item() == entry.keys.size


def test_lone_kinds_are_plain_and_rotating_caches_without_kept_tokens():
    assert lone_kinds([KVCache(), RotatingKVCache(8)])
    assert not lone_kinds([KVCache(), RotatingKVCache(8, keep=4)])
    assert not lone_kinds([])


def _job(worker, prompts):
    from mlxcel.engine.sequence import Sequence
    from mlxcel.testing.engine import ListSink, request

    tok = worker.checkpoint.tokenizer
    return worker._new_job([Sequence(request(p), ListSink(), tok, worker.eos_ids, i)
                            for i, p in enumerate(prompts)])


def test_aligned_prefill_pads_a_lone_row_and_trims_it_back(mlxcel_checkpoint_cache):
    """CUDA's aligned prefill columns on a lone row's plain caches: right-padded, then
    trimmed to the real tokens; not padded where a rotating layer's window would fill."""
    path = gemma4(mlxcel_checkpoint_cache)  # sliding window 16
    worker = worker_for(path, chunk=16, parallel=4, prefill_align=8)
    job = _job(worker, [SHORT[:6]])
    assert (job.width, job.trim) == (8, 2)
    while not job.step(16):
        pass
    assert {c.offset for c in job.cache} == {6}
    assert job.trim == 0
    long = LONG[:39]  # 39 columns: padding to 40 would fill the window
    assert (_job(worker, [long]).width, _job(worker, [long]).trim) == (39, 0)
    group = _job(worker, [SHORT[:8], SHORT[7::-1]])  # tails of 8: aligned already
    assert group.width == 8 and not group.padded
    group = _job(worker, [SHORT[:4], SHORT[:6]])  # tails 4 and 6: both padded on the right
    assert group.width == 8 and group.padded


def test_aligned_prefill_keeps_every_rows_tokens(mlxcel_checkpoint_cache):
    """Rows prefilled alone and in groups with aligned columns get their unaligned solo
    tokens (float32: exact)."""
    path = gemma4(mlxcel_checkpoint_cache)
    worker = worker_for(path, chunk=16, parallel=4, prefill_align=8, lazy_leave=False)
    lone = submit(worker, SHORT[:6], max_tokens=10)
    run_until_done(worker, [lone], settle=True)
    prompts = [SHORT[:4], SHORT, LONG[:13], LONG]
    sinks = [submit(worker, p, max_tokens=6) for p in prompts]
    run_until_done(worker, sinks)
    want = solo_outputs(path, [SHORT[:6], *prompts], max_tokens=[10, 6, 6, 6, 6], chunk=16)
    assert [lone.tokens, *(s.tokens for s in sinks)] == want


def test_aligned_prefill_from_a_stored_entry_keeps_the_tokens(mlxcel_checkpoint_cache):
    """The agent-turn case with aligned columns (a 64-token window, so the rows stay
    trimmable): a padded lone row is stored, the next turn starts from that entry and is
    padded too; both get their cold tokens."""
    path = cached_checkpoint("gemma4_text", cache_dir=mlxcel_checkpoint_cache, dtype="float32",
                             config={"sliding_window": 64})
    worker = worker_for(path, cache=True, chunk=16, parallel=2, prefill_align=8)
    prompt = LONG[:21]  # 21 to prefill -> 24 columns, trimmed back
    assert _job(worker, [prompt]).trim == 3
    first = submit(worker, prompt, max_tokens=6)
    run_until_done(worker, [first], settle=True)
    turn2 = prompt + first.tokens + [7, 8, 9]
    second = submit(worker, turn2, max_tokens=5)
    run_until_done(worker, [second], settle=True)
    assert second.last.usage.cached_tokens >= 16
    want = solo_outputs(path, [prompt, turn2], max_tokens=[6, 5], chunk=16)
    assert [first.tokens, second.tokens] == want

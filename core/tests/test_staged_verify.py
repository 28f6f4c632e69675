"""A verify forward queued in stages as it is built (``EnginePolicy.verify_stages``)."""

from __future__ import annotations

import mlx.core as mx
from mlxcel.engine.accel import staged as staged_mod
from mlxcel.engine.cache.kvcache import BatchCache
from mlxcel.engine.config import EngineConfig
from mlxcel.testing.engine import ListSink, request, run_until_done, worker_for

LOOKUP = "mlxcel.drafters.lookup:new_session"
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12] * 4, [20, 21, 22, 23] * 3, list(range(30, 61))]


def outputs(checkpoint, config, **policy):
    worker = worker_for(checkpoint, parallel=4, config=config, **policy)
    sinks = []
    for prompt in PROMPTS:
        sink = ListSink()
        worker.enqueue(request(prompt, 24), sink)
        sinks.append(sink)
    run_until_done(worker, sinks)
    return [s.tokens for s in sinks], [s.last.usage for s in sinks]


def test_a_staged_verify_forward_gives_the_same_tokens(tiny_checkpoint, monkeypatch):
    launched = []
    real = mx.async_eval
    monkeypatch.setattr(mx, "async_eval", lambda *a: (launched.append(len(a)), real(*a))[1])
    plain, _ = outputs(tiny_checkpoint, EngineConfig())
    launched.clear()
    staged, usages = outputs(tiny_checkpoint, EngineConfig(drafter=LOOKUP, prompt_lookup="on",
                                                           draft_max=8), verify_stages=4)
    assert sum(u.draft_rounds for u in usages) > 0
    assert staged == plain
    # each verify round queued its keys and values part-way (plain steps queue one array)
    assert launched.count(2) >= sum(1 for u in usages if u.draft_rounds)


def test_staging_marks_every_nth_layer_for_one_forward_only():
    caches = [BatchCache([0]) for _ in range(8)]
    with staged_mod.staged(caches, 4):
        marked = [i for i, c in enumerate(caches) if "update_and_fetch" in vars(c)]
    assert marked == [1, 3, 5]  # the last layer's forward is evaluated whole anyway
    assert not any("update_and_fetch" in vars(c) for c in caches)
    with staged_mod.staged(caches, 1):
        assert not any("update_and_fetch" in vars(c) for c in caches)
    k = mx.ones((1, 2, 3, 4))
    with staged_mod.staged(caches, 8):
        got = caches[0].update_and_fetch(k, k)  # the marked method still updates
    assert caches[0]._idx == 3 and mx.array_equal(got[0], k)


def test_a_cache_that_takes_no_attribute_is_left_whole():
    class Slotted:
        __slots__ = ("n",)

        def update_and_fetch(self, keys, values):
            return keys, values

    caches = [Slotted() for _ in range(4)]
    with staged_mod.staged(caches, 2):  # no error: the forward runs as one
        assert caches[1].update_and_fetch(1, 2) == (1, 2)

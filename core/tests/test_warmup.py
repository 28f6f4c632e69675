"""Engine warm-up: every decode batch size and prefill chunk shape runs once, what a lone
request meets before the engine is ready and the rest between served steps."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlxcel.engine.accel.warmup import prefill_shapes, shared_plan, warm_up
from mlxcel.engine.cache.kvcache import shared_position_rope


def test_prefill_shapes_cover_every_chunk_the_engine_can_cut():
    shapes = prefill_shapes(chunk=128, align=32)
    assert set(shapes) == {(1, 32), (2, 32), (3, 32), (4, 32), (1, 64), (2, 64), (1, 96),
                           (1, 128)}
    # what PrefillJob cuts: rows x max(align, chunk // rows // align * align) columns
    for rows in (1, 2, 3, 4):
        cols = max(32, 128 // rows // 32 * 32)
        assert (rows, cols) in shapes


def _spy(model, seen):
    """``model``, recording each call's input shape in ``seen``."""
    inner = model.__call__

    class Spy:
        def __getattr__(self, name):
            return getattr(model, name)

        def __call__(self, inputs, cache=None):
            seen.append(tuple(inputs.shape))
            return inner(inputs, cache=cache)

    return Spy()


def test_warm_up_runs_each_shape_on_the_model(mlxcel_checkpoint_cache):
    from mlx_lm import load
    from mlxcel.testing.checkpoint import cached_checkpoint

    path = cached_checkpoint("qwen3", cache_dir=mlxcel_checkpoint_cache, dtype="float32")
    model, _ = load(str(path))
    seen = []
    spy = _spy(model, seen)
    seconds = warm_up(spy, shared_position_rope(model, True), parallel=3, chunk=64,
                      align=32)
    assert seconds > 0
    # a lone row's shapes first, grouped ones (fewest columns first) after them
    assert seen == [(1, 1), (2, 1), (3, 1), (1, 32), (1, 64), (2, 32)]
    assert mx.array(1).item() == 1  # the device is still usable afterwards


def test_a_failing_warm_up_does_not_stop_the_engine(mlxcel_checkpoint_cache, monkeypatch):
    from mlxcel.engine import setup as setup_module
    from mlxcel.engine.worker import EngineWorker
    from mlxcel.model.loader import load_checkpoint
    from mlxcel.plugins import load_plugins
    from mlxcel.testing.checkpoint import cached_checkpoint

    path = cached_checkpoint("qwen3", cache_dir=mlxcel_checkpoint_cache, dtype="float32")
    calls = []

    def failing(*args):
        calls.append(args)
        raise MemoryError("no room for the warm-up")

    from mlxcel.engine.policy import EnginePolicy

    monkeypatch.setattr(setup_module, "shared_plan", failing)
    families = load_plugins().families
    worker = EngineWorker(lambda: load_checkpoint(str(path), families),
                          parallel=2, policy=EnginePolicy(warm_up=True))
    assert worker.setup() and worker.state == "ready" and calls


def test_lifecycle_warm_up_runs_every_batch_operation_once(mlxcel_checkpoint_cache,
                                                           monkeypatch):
    """Each op variant the engine meets while serving runs in the warm-up (MLX's CUDA
    backend JIT-compiles them on first use: a 2.5-3.2 s stall in a served step)."""
    from mlxcel.engine import batch, penalties, sampling
    from mlxcel.engine.accel.warmup import warm_lifecycle
    from mlxcel.engine.cache import kvcache
    from mlxcel.model.loader import load_checkpoint
    from mlxcel.plugins import load_plugins
    from mlxcel.testing.checkpoint import cached_checkpoint

    path = cached_checkpoint("qwen3", cache_dir=mlxcel_checkpoint_cache, dtype="float32")
    ck = load_checkpoint(str(path), load_plugins().families)
    seen: set[str] = set()

    def spy(owner, name, label=None):
        real = getattr(owner, name)

        def wrapper(*args, **kwargs):
            seen.add(label or name)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    spy(kvcache.BatchCache, "filter")
    real_stored = batch.stored_rows

    def stored(caches, idx, lengths):
        seen.add("stored one" if len(idx) == 1 else "stored several")
        return real_stored(caches, idx, lengths)

    monkeypatch.setattr(batch, "stored_rows", stored)
    real_extend = kvcache.BatchCache.extend

    def extend(self, *others, keep=None):
        seen.add("extend" if keep is None else "extend keeping rows")
        return real_extend(self, *others, keep=keep)

    monkeypatch.setattr(kvcache.BatchCache, "extend", extend)
    spy(kvcache.BatchCache, "from_prefixes")
    spy(batch, "logprob_arrays")
    spy(penalties.Penalties, "__call__", "penalties")
    spy(sampling.BatchSampler, "_choose", "sampled")
    real_update = kvcache.BatchCache.update_and_fetch

    def update(self, keys, values):
        if self.keys is not None and self._idx + keys.shape[2] > self.keys.shape[2]:
            seen.add("grow")
        return real_update(self, keys, values)

    monkeypatch.setattr(kvcache.BatchCache, "update_and_fetch", update)
    for rope in (shared_position_rope(ck.model, True), None):
        seen.clear()
        warm_lifecycle(ck.model, rope, ck.tokenizer.vocab_size, align=32)
        assert seen == {"extend", "extend keeping rows", "filter", "stored one",
                        "stored several",
                        "from_prefixes", "logprob_arrays",
                        "penalties", "sampled", "grow"}
    assert mx.array(1).item() == 1


def test_burst_shapes_cover_every_group_the_budget_allows():
    from mlxcel.engine.scheduler import aligned

    chunk, align, parallel, burst = 128, 32, 6, 4
    shapes = set(prefill_shapes(chunk, align, parallel, burst))
    assert max(r for r, _ in shapes) == parallel and max(c for _, c in shapes) == chunk
    assert all(r * c <= burst * chunk for r, c in shapes)
    # what the worker cuts: budget f chunks, rows <= parallel, <= one chunk of columns
    # per row per step, and a last step of any aligned width up to that
    for f in range(1, burst + 1):
        for rows in range(1, parallel + 1):
            cols = max(align, min(chunk, f * chunk // rows) // align * align)
            if rows * cols <= f * chunk:
                for last in range(align, cols + 1, align):
                    assert (rows, aligned(last, align)) in shapes


def test_one_layer_runs_the_first_layer_and_restores_the_rest(mlxcel_checkpoint_cache):
    from mlxcel.engine.accel.warmup import one_layer
    from mlxcel.model.loader import load_checkpoint
    from mlxcel.plugins import load_plugins
    from mlxcel.testing.checkpoint import cached_checkpoint
    from mlxcel.testing.engine import warm_up_layers

    path = cached_checkpoint("qwen3", cache_dir=mlxcel_checkpoint_cache, dtype="float32")
    model = load_checkpoint(str(path), load_plugins().families).model
    layers = list(model.model.model.layers)
    assert warm_up_layers(model, layers) == (1, [0])
    assert model.model.model.layers == layers
    try:
        with one_layer(model):
            raise RuntimeError("a shape failed")
    except RuntimeError:
        pass
    assert model.model.model.layers == layers


@pytest.mark.parametrize("shape", ["gemma4_text", "qwen3_next", "gpt_oss"])
def test_mixed_warm_up_plays_every_batch_cache_operation(shape, mlxcel_checkpoint_cache,
                                                         monkeypatch):
    """On mlx-lm's batch caches: a padded group (prepare / finalize), joins, a row
    leaving, a copy out and a prompt extending it; afterwards the engine serves as before."""
    from mlx_lm.models import cache as mlc
    from mlxcel.engine import mixed_batch
    from mlxcel.engine.accel.warmup import warm_mixed
    from mlxcel.model.loader import load_checkpoint
    from mlxcel.plugins import load_plugins
    from mlxcel.testing.checkpoint import cached_checkpoint

    path = cached_checkpoint(shape, cache_dir=mlxcel_checkpoint_cache, dtype="float32")
    seen: set[str] = set()
    for name in ("join", "filter", "snapshots"):
        real = getattr(mixed_batch.MixedOps, name)
        monkeypatch.setattr(mixed_batch.MixedOps, name,
                            staticmethod(lambda *a, _r=real, _n=name: (seen.add(_n), _r(*a))[1]))
    for cls in (mlc.BatchKVCache, mlc.BatchRotatingKVCache, mlc.ArraysCache):
        real_finalize = cls.finalize
        monkeypatch.setattr(cls, "finalize",
                            lambda self, _r=real_finalize: (seen.add("finalize"), _r(self))[1])
    ckpt = load_checkpoint(str(path), load_plugins().families)
    assert warm_mixed(ckpt.model, mixed_batch.merge_rows, ckpt.tokenizer.vocab_size) > 0
    assert seen == {"join", "filter", "snapshots", "finalize"}


def test_mixed_warm_up_runs_every_aligned_lone_prefill_shape(mlxcel_checkpoint_cache):
    """With aligned prefill columns (CUDA), a lone row's every chunk shape runs once."""
    from mlxcel.engine import mixed_batch
    from mlxcel.engine.accel.warmup import warm_mixed
    from mlxcel.model.loader import load_checkpoint
    from mlxcel.plugins import load_plugins
    from mlxcel.testing.checkpoint import cached_checkpoint

    path = cached_checkpoint("gemma4_text", cache_dir=mlxcel_checkpoint_cache, dtype="float32")
    ckpt = load_checkpoint(str(path), load_plugins().families)
    model, vocab = ckpt.model, ckpt.tokenizer.vocab_size
    shapes: list[tuple[int, ...]] = []

    class Spy:
        def make_cache(self):
            return model.make_cache()

        def __call__(self, inputs, cache):
            shapes.append(tuple(inputs.shape))
            return model(inputs, cache)

    warm_mixed(Spy(), mixed_batch.merge_rows, vocab, chunk=32, align=8)
    assert {(1, cols) for cols in (8, 16, 24, 32)} <= set(shapes)
    shapes.clear()
    warm_mixed(Spy(), mixed_batch.merge_rows, vocab)  # unaligned: none of those
    assert (1, 24) not in shapes


def test_the_plan_leaves_only_grouped_prefill_shapes_for_later(mlxcel_checkpoint_cache):
    from mlxcel.engine.accel.warmup import run_items
    from mlxcel.model.loader import load_checkpoint
    from mlxcel.plugins import load_plugins
    from mlxcel.testing.checkpoint import cached_checkpoint

    path = cached_checkpoint("qwen3", cache_dir=mlxcel_checkpoint_cache, dtype="float32")
    ck = load_checkpoint(str(path), load_plugins().families)
    model = ck.model
    seen = []
    spy = _spy(model, seen)
    plan = shared_plan(spy, shared_position_rope(model, True), parallel=4, chunk=64,
                       align=16, burst=2, vocab=ck.tokenizer.vocab_size)
    spent = run_items(plan.first)
    assert set(spent) == {"decode", "prefill", "lifecycle"}
    lone = [s for s in seen if s[1] > 1 and s[0] == 1]
    assert [c for _, c in lone[:4]] == [16, 32, 48, 64]  # every lone chunk, before ready
    seen.clear()
    run_items(plan.later)
    grouped = set(prefill_shapes(64, 16, 4, 2)) - {(1, c) for c in (16, 32, 48, 64)}
    assert seen == sorted(grouped, key=lambda s: (s[1], s[0]))


def test_warming_runs_back_to_back_when_idle_and_within_its_share_when_busy():
    import time

    from mlxcel.engine.parts import Warming

    ran = []

    def item(n):
        return ("prefill", lambda: (ran.append(n), time.sleep(0.02)))

    warming = Warming([item(n) for n in range(4)], share=0.1, idle_s=0.0)
    assert warming.run_due(busy=False) and warming.run_due(busy=False)
    assert ran == [0, 1]
    assert not warming.run_due(busy=True)  # requests came: an idle run's wait holds too
    time.sleep(0.2)
    assert warming.run_due(busy=True) and ran == [0, 1, 2]
    assert not warming.run_due(busy=True)  # 0.02 s ran: the next waits ~0.18 s
    assert warming.run_due(busy=False) and ran == [0, 1, 2, 3]  # idle: due at once
    assert not warming and not warming.run_due(busy=False)


def test_an_idle_engine_warms_only_once_idle_for_a_while():
    """A client that sends its next request as soon as the last one ended finds no item
    in the way: items start once the engine has been idle for ``idle_s``."""
    import math
    import time

    from mlxcel.engine.parts import Warming

    ran = []
    warming = Warming([("prefill", lambda n=n: ran.append(n)) for n in range(3)], idle_s=0.05)
    assert not warming.run_due(busy=False) and ran == []  # just went idle
    assert 0 < warming.idle_wait() <= 0.05
    time.sleep(0.03)
    assert warming.run_due(busy=True) and ran == [0]  # busy: within its share
    assert not warming.run_due(busy=False) and warming.idle_wait() > 0.03  # idle anew
    time.sleep(0.06)
    assert warming.idle_wait() == 0 and warming.run_due(busy=False) and ran == [0, 1]
    assert warming.run_due(busy=False) and ran == [0, 1, 2]  # then back to back
    assert warming.idle_wait() == math.inf


def test_a_failing_later_item_drops_the_rest():
    from mlxcel.engine.parts import Warming

    def boom():
        raise MemoryError("no room")

    ran = []
    warming = Warming([("prefill", boom), ("prefill", lambda: ran.append(1))], idle_s=0.0)
    assert warming.run_due(busy=False) and not warming and ran == []


def test_requests_served_while_the_rest_warms_get_the_same_tokens(mlxcel_checkpoint_cache):
    """Grouped shapes warm between served steps (one layer swapped in for each): the rows
    decoding around them get the tokens they get with no warm-up."""
    from mlxcel.testing.checkpoint import cached_checkpoint
    from mlxcel.testing.engine import run_until_done, submit, worker_for

    path = cached_checkpoint("qwen3", cache_dir=mlxcel_checkpoint_cache, dtype="float32")
    prompts = [list(range(5 + i, 30 + 3 * i)) for i in range(4)]

    def serve(worker):
        sinks = [submit(worker, p, max_tokens=8) for p in prompts]
        run_until_done(worker, sinks)
        return [s.tokens for s in sinks]

    want = serve(worker_for(path, chunk=64, parallel=4))
    warmed = worker_for(path, chunk=64, parallel=4, warm_up=True, prefill_align=16)
    left = len(warmed.warming.items)
    assert left == len(prefill_shapes(64, 16, 4, warmed.burst_chunks)) - 4
    warmed.warming.turns.share = 1.0  # an item after every step while the rows decode
    assert serve(warmed) == want
    assert len(warmed.warming.items) < left


def test_with_speculation_every_verify_shape_warms_last(mlxcel_checkpoint_cache):
    from mlxcel.engine.accel.warmup import run_items
    from mlxcel.model.loader import load_checkpoint
    from mlxcel.plugins import load_plugins
    from mlxcel.testing.checkpoint import cached_checkpoint

    path = cached_checkpoint("qwen3", cache_dir=mlxcel_checkpoint_cache, dtype="float32")
    model = load_checkpoint(str(path), load_plugins().families).model
    seen = []
    rope = shared_position_rope(model, True)
    plain = shared_plan(model, rope, parallel=3, chunk=32, align=16)
    plan = shared_plan(_spy(model, seen), rope, parallel=3, chunk=32, align=16,
                       verify_width=4)
    assert len(plan.first) == len(plain.first)
    extra = plan.later[len(plain.later):]
    assert {phase for phase, _ in extra} == {"verify"}
    run_items(extra)
    assert seen == [(rows, width) for width in (2, 3, 4) for rows in (1, 2, 3)]


def test_an_engine_with_speculation_leaves_its_verify_shapes_for_later(
        mlxcel_checkpoint_cache):
    from mlxcel.engine.config import EngineConfig
    from mlxcel.testing.checkpoint import cached_checkpoint
    from mlxcel.testing.engine import worker_for

    path = cached_checkpoint("qwen3", cache_dir=mlxcel_checkpoint_cache, dtype="float32")
    config = EngineConfig(drafter="mlxcel.drafters.lookup:new_session", prompt_lookup="on",
                          draft_max=3)
    worker = worker_for(path, chunk=32, parallel=2, config=config, warm_up=True,
                        prefill_align=16)
    assert worker.spec is not None
    verify = [phase for phase, _ in worker.warming.items if phase == "verify"]
    assert len(verify) == 2 * 3  # batch sizes 1..2 by widths 2..4

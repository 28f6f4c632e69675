"""Warm-up: run every forward shape the engine can produce once, before or between steps.

On CUDA, MLX builds a plan the first time it meets a shape (a cuBLASLt matmul heuristic,
and for attention a cuDNN graph) and JIT-compiles custom kernels: a burst of traffic
would pay them all at once. The engine's shapes are few: a decode step has one row per
running sequence (1 .. ``parallel``) and a prefill chunk has rows x columns with columns a
multiple of ``align`` (``prefill_align``) and rows x columns <= the chunk size (a single
row may take a whole chunk; a burst's group up to ``burst`` chunks, see
``scheduler.budget``), so all of them are run, on empty caches, and thrown away; prefill
shapes on the first decoder layer only, which meets every plan a layer needs at 1/layers
of the compute.

Sizes are not all: MLX's CUDA backend JIT-compiles a kernel per op variant (dtype, rank,
index kind) the first time it runs, and served decode steps stalled the first time a row
left a batch (the gathers that drop it). So ``warm_lifecycle`` also plays one batch's life
on a few short rows, through the engine's own classes: groups prefilled and joined, sampled
and seeded rows, penalties and logprobs, the cache growing, a row leaving, rows copied out
for the prompt cache and a prompt reusing them.

A decoder that takes images also plays one image row's life (``media_lifecycle``): a
synthetic image through the vision tower and the media feed, its row decoding beside a
text row. The tower's kernels compile then, not on the first image a client sends.

What a lone request meets runs before the engine is ready, the rest between served steps
(``WarmPlan``): time-to-ready stays short while bursts still find their shapes warm.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any, NamedTuple

import mlx.core as mx
import structlog
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from mlxcel.engine.accel import lean_decode
from mlxcel.engine.accel.layers import layer_holder
from mlxcel.engine.batch import DecodeBatch, PrefillJob
from mlxcel.engine.cache.kinds import arrays, lone_kinds
from mlxcel.engine.cache.kvcache import BatchCache, stored_rows
from mlxcel.engine.sampling import RowRandom
from mlxcel.types import SamplingParams

log = structlog.get_logger("mlxcel.engine")


def prefill_shapes(chunk: int, align: int, parallel: int | None = None,
                   burst: int = 1) -> list[tuple[int, int]]:
    """(rows, columns) of every prefill chunk the engine can run with these settings:
    columns a multiple of ``align`` up to ``chunk``, rows x columns up to ``burst`` chunks
    (the engine's burst budget, ``scheduler.budget``) and rows up to ``parallel``."""
    shapes = []
    for cols in range(align, chunk + 1, align):
        most = burst * chunk // cols if parallel is None else \
            min(parallel, burst * chunk // cols)
        shapes += [(rows, cols) for rows in range(1, most + 1)]
    return shapes


@contextlib.contextmanager
def one_layer(model: Any) -> Iterator[int]:
    """While inside, ``model`` runs its first decoder layer only, when all of its layers
    have the same parameter shapes (a prefill shape then costs its plans and 1/layers of
    its compute); yields the number of layers the model runs. The layers are found through
    ``language_model`` too (a VLM's decoder, mlx-lm's multimodal wrappers): a model whose
    layers are not found runs whole, and a warm-up item between served steps then holds
    the engine thread for a full forward, which a request arriving then waits out."""
    inner = layer_holder(model)
    layers = None if inner is None else inner["layers"]
    if layers is None or len(layers) < 2 or \
            len({_signature(layer) for layer in layers}) != 1:
        yield len(make_prompt_cache(model))
        return
    inner.layers = layers[:1]
    try:
        yield 1
    finally:
        inner.layers = layers


def _signature(layer: Any) -> tuple:
    return tuple((name, tuple(p.shape), p.dtype)
                 for name, p in tree_flatten(layer.parameters()))


Item = tuple[str, Callable[[], Any]]  # (phase, work): one shape or one batch's life


class WarmPlan(NamedTuple):
    """A warm-up's items in the order they run. ``first`` runs before the engine is ready:
    what a lone request meets (every decode batch size, a lone row's prefill chunks, one
    batch's life), so the first requests after startup pay no plan. ``later`` runs between
    served steps (``mlxcel.engine.parts.Warming``): the grouped prefill shapes, which only
    a burst meets, fewest columns first (short chat prompts are what bursts of requests
    carry). Most of the shapes are grouped ones, so they stay off the time to ready: a
    shape a burst meets before its turn costs that one step its plans, as it would with no
    warm-up."""

    first: list[Item]
    later: list[Item]


def run_items(items: list[Item]) -> dict[str, float]:
    """Run ``items`` now; seconds spent per phase."""
    spent: dict[str, float] = {}
    for phase, work in items:
        t = time.perf_counter()
        work()
        spent[phase] = spent.get(phase, 0.0) + time.perf_counter() - t
    return spent


def shared_plan(model: Any, rope: Any | None, parallel: int, chunk: int, align: int,
                burst: int = 1, vocab: int | None = None, forward: Any = None,
                verify_width: int = 0) -> WarmPlan:
    """The shared path's plan: each decode batch size (through ``forward``, the engine's
    decode forward; the largest also copies rows out for the prompt cache), each prefill
    chunk shape (``prefill_shapes``, on one layer: ``one_layer``), then (``vocab`` given)
    ``warm_lifecycle``; lone-row shapes first, grouped ones later (``WarmPlan``). With
    speculation, ``verify_width`` is the widest verify forward (1 + the longest draft): its
    shapes, every batch size by every width from 2, go last (``mlxcel.engine.verify``:
    rows feed their last token and their drafts, right-padded to the widest)."""
    forward = forward or lean_decode.generic(model)
    layers = len(make_prompt_cache(model))

    def decode(rows: int) -> None:
        # the last row padded: the masked decode path (mlxcel.engine.accel.attention) runs too
        cache = [BatchCache([0] * (rows - 1) + [1], rope) for _ in range(layers)]
        logits = forward(mx.zeros((rows,), mx.uint32), cache)
        mx.eval(mx.argmax(logits, axis=-1))
        if rows > 1 and rows == parallel:  # copying rows out (a JIT-compiled gather)
            mx.eval([r.keys for r in stored_rows(cache, [0, 1], [1, 1])])

    def prefill(rows: int, cols: int) -> None:
        with one_layer(model) as running:
            cache = [BatchCache([0] * (rows - 1) + [1], rope) for _ in range(running)]
            model(mx.zeros((rows, cols), mx.uint32), cache)
            mx.eval([c.state for c in cache])

    shapes = sorted(prefill_shapes(chunk, align, parallel, burst), key=lambda s: (s[1], s[0]))
    first = [("decode", functools.partial(decode, rows)) for rows in range(1, parallel + 1)]
    first += [("prefill", functools.partial(prefill, 1, cols)) for rows, cols in shapes
              if rows == 1]
    if vocab is not None:
        first.append(("lifecycle", functools.partial(warm_lifecycle, model, rope, vocab,
                                                     align, forward)))
    later = [("prefill", functools.partial(prefill, rows, cols)) for rows, cols in shapes
             if rows > 1]
    later += [("verify", functools.partial(prefill, rows, width))
              for width in range(2, verify_width + 1) for rows in range(1, parallel + 1)]
    return WarmPlan(first, later)


def warm_up(model: Any, rope: Any | None, parallel: int, chunk: int, align: int,
            burst: int = 1, vocab: int | None = None, forward: Any = None) -> float:
    """``shared_plan``'s every item, now; seconds spent."""
    plan = shared_plan(model, rope, parallel, chunk, align, burst, vocab, forward)
    return sum(run_items(plan.first + plan.later).values())


class _Row:
    """What the batch classes read of a ``Sequence``."""

    def __init__(self, prompt: list[int], sampling: SamplingParams) -> None:
        self.req = SimpleNamespace(prompt_tokens=tuple(prompt), sampling=sampling)
        self.random = RowRandom(sampling.seed)
        self.context = list(prompt)
        self.cached = self.fed_from = 0
        self.finished = False
        self.matcher = None  # warm-up rows are never constrained

    @property
    def generated_ids(self) -> list[int]:
        return self.context[len(self.req.prompt_tokens):]


def _prefilled(model: Any, rows: list[_Row], rope: Any | None, align: int,
               prefixes: list | None = None) -> PrefillJob:
    job = PrefillJob(model, rows, True, prefixes, rope, align)
    while not job.step(4 * align * len(rows)):
        pass
    return job


def _step(batch: DecodeBatch) -> None:
    step = batch.launch()
    step.start()
    mx.eval(step.sampled, *step.logprobs)
    for row, token in zip(step.rows, step.sampled.tolist(), strict=True):
        row.context.append(token)


def warm_lifecycle(model: Any, rope: Any | None, vocab: int, align: int = 1,
                   forward: Any = None) -> None:
    """One batch's life on four short rows (see the module docstring)."""
    greedy = SamplingParams(temperature=0.0)
    rows = [_Row(list(range(3, 43)), greedy),  # long enough to be reused past ``align``
            _Row(list(range(3, 12)), SamplingParams(temperature=0.8, top_p=0.9, top_k=40,
                                                    min_p=0.05)),
            _Row(list(range(5, 17)), SamplingParams(temperature=0.7, seed=1, logprobs=True,
                                                    top_logprobs=2)),
            _Row([8, 9, 10], SamplingParams(temperature=0.0, repetition_penalty=1.1))]
    batch = DecodeBatch(model, vocab, lazy_leave=True, forward=forward)
    batch.join([_prefilled(model, rows[:2], rope, align)])  # into an empty batch
    batch.join([_prefilled(model, rows[2:], rope, align)])  # merged into a running one
    _step(batch)
    for c in batch.cache:  # past the buffer's room: it grows
        b, h, size, d = c.keys.shape
        room = size - c._idx + 1
        c.update_and_fetch(mx.zeros((b, h, room, d), c.keys.dtype),
                           mx.zeros((b, h, room, c.values.shape[3]), c.values.dtype))
    _step(batch)
    rows[1].finished = True
    batch.drop_finished()  # a row leaves lazily: it stays in the batch
    _step(batch)
    stored = [kv for _, kv in batch.snapshots([rows[0], rows[2]]) + batch.snapshots([rows[3]])]
    mx.eval([a for kv in stored for a in (kv.keys, kv.values)])
    hit = _Row(rows[0].context[:36] + [20, 21], greedy)
    hit.cached = 36  # a prompt-cache hit: its first tokens come from the stored copy
    # the join drops the finished row in its copy (a gather of the kept rows)
    batch.join([_prefilled(model, [hit], rope, align, prefixes=[(stored[0].keys, stored[0].values)])])
    _step(batch)
    rows[0].finished = rows[2].finished = rows[3].finished = True
    batch.drop_finished()  # finished rows are the majority: gathers of the cache
    _step(batch)


def _mixed_prefilled(model: Any, rows: list[_Row], merge: Any,
                     starts: list | None = None) -> Any:
    from mlxcel.engine.mixed_batch import MixedPrefill

    job = MixedPrefill(model, rows, starts or [None] * len(rows), merge)
    while not job.step(8 * len(rows), 8):  # several chunks: the padded path's every op
        pass
    return job


def mixed_lifecycle(model: Any, merge: Any, vocab: int) -> None:
    """``warm_lifecycle`` for a model on mlx-lm's batch caches (``mixed_batch``): a padded
    group prefilled in chunks (``prepare`` / ``finalize``), groups joined (``extend``),
    sampled and penalised rows, a row leaving (``filter``), rows copied out for the prompt
    cache (``extract``) and a prompt extending one of them. Each op variant of these caches
    is JIT-compiled by MLX's CUDA backend the first time it runs: a served step would wait
    for it."""
    from mlxcel.engine.mixed_batch import MixedOps

    greedy = SamplingParams(temperature=0.0)
    rows = [_Row(list(range(3, 43)), greedy),
            _Row(list(range(3, 12)), SamplingParams(temperature=0.8, top_p=0.9, top_k=40)),
            _Row(list(range(5, 17)), SamplingParams(temperature=0.7, seed=1, logprobs=True,
                                                    top_logprobs=2)),
            _Row([8, 9, 10], SamplingParams(temperature=0.0, repetition_penalty=1.1))]
    batch = DecodeBatch(model, vocab, lazy_leave=True, ops=MixedOps)
    batch.join([_mixed_prefilled(model, rows[:2], merge)])  # into an empty batch
    batch.join([_mixed_prefilled(model, rows[2:], merge)])  # merged into a running one
    _step(batch)
    _step(batch)
    rows[1].finished = True
    batch.drop_finished()  # lazily: it stays
    _step(batch)
    (tokens, stored), = batch.snapshots([rows[0]])
    mx.eval(arrays(stored.caches))
    hit = _Row(list(tokens) + [20, 21], greedy)
    hit.cached = len(tokens)  # the agent-turn case: the whole stored state is reused
    batch.join([_mixed_prefilled(model, [hit], merge, [stored.prefix(len(tokens)).caches])])
    _step(batch)
    for row in (rows[0], rows[2], rows[3]):
        row.finished = True
    batch.drop_finished()  # finished rows are the majority: filtered out
    _step(batch)


def mixed_plan(model: Any, merge: Any, vocab: int, chunk: int = 512,
               align: int = 1) -> WarmPlan:
    """The mixed path's plan (``WarmPlan``): ``mixed_lifecycle``, then, with ``align`` > 1,
    every prefill chunk shape of a lone row (one row of each multiple of ``align`` up to
    ``chunk`` columns, on its plain caches), each with its kernel plans then. Grouped
    shapes on these caches are not warmed, so nothing is left for later."""
    from mlxcel.engine.mixed_batch import merge_rows

    def lone(cols: int) -> None:
        cache = model.make_cache()
        model(mx.zeros((1, cols), mx.uint32), cache)
        mx.eval(arrays(cache))

    first = [("lifecycle", functools.partial(mixed_lifecycle, model, merge, vocab))]
    if align > 1 and merge is merge_rows and lone_kinds(model.make_cache()):
        first += [("prefill", functools.partial(lone, cols))
                  for cols in range(align, chunk + 1, align)]
    return WarmPlan(first, [])


def warm_mixed(model: Any, merge: Any, vocab: int, chunk: int = 512, align: int = 1) -> float:
    """``mixed_plan``'s every item, now; seconds spent."""
    plan = mixed_plan(model, merge, vocab, chunk, align)
    return sum(run_items(plan.first + plan.later).values())


WARM_SIDE = 224  # the synthetic image's side: a few dozen tokens on most VLMs


def media_prompt(model: Any, tokenizer: Any) -> Any:
    """A short prompt holding one synthetic image (a mid-grey one, ``media.image.plain``),
    expanded by ``model``'s decoder (``mlxcel.families.media``)."""
    from mlxcel.media.image import plain

    item = plain(WARM_SIDE, WARM_SIDE)
    text = f"Look: {model.media_placeholder('image')} What is it?"
    return model.expand_media(list(tokenizer.encode(text)), [item], {})


def media_lifecycle(model: Any, rope: Any | None, vocab: int, prompt: Any,
                    forward: Any = None, merge: Any = None, align: int = 1) -> None:
    """One image row's life (``prompt``: ``media_prompt``'s): its prefill through the
    media feed (``engine.media_rows``, no feature kept) in the engine's prefill alignment,
    then decode steps beside a text row, on the shared path's caches, or with ``merge``
    the mixed path's."""
    from mlxcel.engine.media_rows import FeatureCache, MediaFeed

    greedy = SamplingParams(temperature=0.0)
    row = _Row(list(prompt.token_ids), greedy)
    row.req.media = prompt
    feed = MediaFeed(model, [row], FeatureCache(0))
    text = _Row(list(range(3, 12)), greedy)
    if merge is None:
        job = PrefillJob(model, [row], True, None, rope, align, feed=feed)
        while not job.step(len(prompt.token_ids)):
            pass
        batch = DecodeBatch(model, vocab, lazy_leave=True, forward=forward)
        beside = _prefilled(model, [text], rope, 1)
    else:
        from mlxcel.engine.mixed_batch import MixedOps, MixedPrefill

        job = MixedPrefill(model, [row], [None], merge, align, feed=feed)
        while not job.step(len(prompt.token_ids)):
            pass
        batch = DecodeBatch(model, vocab, lazy_leave=True, ops=MixedOps)
        beside = _mixed_prefilled(model, [text], merge)
    batch.join([job])
    batch.join([beside])
    _step(batch)
    _step(batch)

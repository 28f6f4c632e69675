"""Batches on mlx-lm's batch-cache protocol, for any mix of cache kinds.

This is the path of every model whose caches the shared-position ``BatchCache`` does not
hold: sliding-window (rotating) layers, KV-shared layers, recurrent or conv state
(``ArraysCache``), ``CacheList`` layers, and mixtures of them in one model.

Each row starts from its own per-layer caches: the model's ``make_cache()``, or a
prompt-cache entry cut to what the row reuses (``mlxcel.engine.cache.kinds``). A prefill
group merges them into batch caches (each layer cache's ``merge``: ``BatchKVCache``,
``BatchRotatingKVCache``, ``ArraysCache``, ``CacheList``; or the family's ``batch_cache``
factory), then computes every row's own uncached tail, right-padded to the longest
(``prepare(lengths=..., right_padding=...)``, and ``finalize()`` at the end, which moves
each row's padding to its left). The group joins the decode batch with ``extend``, rows
leave with ``filter``, and a finished row is copied out for the prompt cache with
``extract``.

A lone row decodes on its own plain caches (``cache.kinds.lone_kinds``: the model's
``KVCache`` / ``RotatingKVCache``) with no mask and scalar offsets, the step of mlx-lm's
own generate loop: a group of one prefills on them, a second row joining merges them into
batch caches (``merge``), and a batch filtered down to one row goes back to plain ones
(``extract``). The batch caches' per-row offsets, masks and bookkeeping cost a lone row
host work per layer and step for nothing.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import structlog
from mlx_lm.models.cache import BatchKVCache, BatchRotatingKVCache

from mlxcel.engine.batch import Prefill, is_batchable
from mlxcel.engine.cache.capture import checkpoint
from mlxcel.engine.cache.kinds import (
    RowCaches,
    arrays,
    is_lone,
    lone_kinds,
    owned,
    private,
    row_copy,
)
from mlxcel.engine.heads import Heads
from mlxcel.engine.scheduler import aligned
from mlxcel.engine.sequence import Sequence
from mlxcel.lazy import resolve

log = structlog.get_logger("mlxcel.engine")
Merge = Callable[[list[list[Any]]], list[Any]]
_EXTRACTS: tuple[type, ...] = (BatchKVCache, BatchRotatingKVCache)  # to the lone kinds


def merge_rows(rows: list[list[Any]]) -> list[Any]:
    """mlx-lm's own merge: per layer, the layer cache class's ``merge`` of every row's."""
    return [type(layer[0]).merge(list(layer)) for layer in zip(*rows, strict=True)]


def merger(model: Any, family: Any) -> Merge | None:
    """How rows' caches become batch caches for ``model``: the family's ``batch_cache``
    factory if it names one, else mlx-lm's ``merge`` when every cache the model makes has
    one (the rule ``mlx_lm.server`` batches by), else None (one slot)."""
    factory = getattr(family, "batch_cache", None)
    if factory:
        return resolve(factory)
    caches = model.make_cache()
    if caches and all(callable(getattr(c, "merge", None)) for c in caches):
        return merge_rows
    return None


def cache_path(model: Any, family: Any) -> tuple[str, Merge | None, bool]:
    """(path, merge, grouped): ``shared`` (the engine's ``BatchCache``: plain KV layers
    only, one per layer, and no family factory), ``mixed`` (this module: any other mix
    whose caches batch, through ``merge``) or ``single`` (one slot); ``grouped``: rows
    may prefill together, padded (``pads_state``). The rule is documented in
    ``docs/reference/hooks.md``."""
    if not family.supports_batching:
        return "single", None, False
    if family.batch_cache is None and is_batchable(model):
        return "shared", None, True
    merge = merger(model, family)
    if merge is None:
        return "single", None, False
    return "mixed", merge, family.batch_cache is not None or pads_state(model)


def _leaves(cache: Any) -> list[Any]:
    inner = getattr(cache, "caches", None)
    return [leaf for c in inner for leaf in _leaves(c)] if inner is not None else [cache]


def pads_state(model: Any) -> bool:
    """Whether rows may be padded together in a prefill group.

    Attention caches mask padding. A state layer (``ArraysCache``) keeps a padded row's
    state only if the model reads the cache's padding: mlx-lm's recurrent layers that do
    mask their inputs by it and ``advance`` it each call. A model whose modules never do
    would fold the padding tokens into a row's state, so its rows prefill one per group
    (they still decode together: a decode step has no padding)."""
    from mlx_lm.models.cache import ArraysCache

    if not any(isinstance(leaf, ArraysCache) for c in model.make_cache()
               for leaf in _leaves(c)):
        return True
    module_tree = getattr(model, "model", model)  # a LoadedModel wraps the nn.Module
    names = {type(m).__module__ for _, m in module_tree.named_modules()}
    for name in names:
        module = sys.modules.get(name)
        if module is not None and name.startswith("mlx_lm.models."):
            try:
                if ".advance(" in inspect.getsource(module):
                    return True
            except (OSError, TypeError):
                continue
    return False


class MixedPrefill(Prefill):
    """Prefills ``seqs`` (each from ``starts[i]``, its caches for its first ``cached``
    tokens, or fresh) a chunk per engine step; the same interface as ``PrefillJob``.
    A row's logits at its prompt's last position come from the chunk that holds it
    (rows of unequal tails end in different chunks).

    ``align`` (the policy's ``prefill_align``; the caller passes 1 where rows may not be
    padded, ``pads_state``): the columns computed are a multiple of it, so prefill shapes
    repeat and CUDA's per-shape plans are made once (``batch.prefill_align``). A group pads
    its rows on the right, as it does for rows of unequal length. A lone row on its plain
    caches is right-padded too and its caches trimmed back after the last chunk: under a
    causal mask no real token sees the padding, so the cache holds exactly what an
    unpadded prefill leaves. It is padded only where every layer can be trimmed afterwards
    (a rotating layer whose window the padded prompt does not fill)."""

    def __init__(self, model: Any, seqs: list[Sequence], starts: list[list[Any] | None],
                 merge: Merge, align: int = 1,
                 marks: list[list[tuple[int, str]]] | None = None, feed: Any = None,
                 heads: Heads | None = None) -> None:
        self.model = model
        self.feed = feed  # media rows' chunk feeder (``media_rows.MediaFeed``)
        self.heads = heads or Heads(None)  # the output projection at one column per row
        self.seqs = seqs
        self.align = max(1, align)
        rows = [start if start is not None else model.make_cache() for start in starts]
        lone = len(rows) == 1 and merge is merge_rows and lone_kinds(rows[0])
        self.lone = lone
        # checkpoints to take (``cache.capture``): per prefill column, the rows and marks
        # met there. Every mark lies before its prompt's last token (the prompt's end is
        # taken there, so that the same prompt again can still compute a column), so a
        # chunk ends at each
        self.marks: dict[int, list[tuple[int, int, str]]] = {}
        for r, (seq, row_marks) in enumerate(zip(seqs, marks or [[]] * len(seqs),
                                                 strict=True)):
            for position, kind in row_marks:
                self.marks.setdefault(position - seq.cached, []).append((r, position, kind))
        if lone:
            self.cache = private(rows[0]) if starts[0] is not None else rows[0]
        else:
            self.cache = merge(rows)
        tails = [list(s.req.prompt_tokens[s.cached:]) for s in seqs]
        lengths = [len(t) for t in tails]
        self.lengths = lengths
        self.first: list[mx.array | None] = [None] * len(seqs)  # per row, [V]
        width = max(lengths)
        self.width = aligned(width, self.align)
        self.trim = 0  # a lone row's padding columns, trimmed off once they are in
        if lone and self.width > width:
            if _trimmable_after(self.cache, self.width):
                self.trim = self.width - width
            else:
                self.width = width
        pads = [self.width - n for n in lengths]
        self.padded = any(pads) and not lone
        if self.padded:
            for c in self.cache:
                c.prepare(lengths=lengths, right_padding=pads)
        self.tokens = mx.array([t + [0] * p for t, p in zip(tails, pads, strict=True)],
                               dtype=mx.uint32)
        self.done_cols = 0
        self.last_cols = 0

    def step(self, chunk: int, max_cols: int | None = None) -> bool:
        """Run one chunk (``chunk`` tokens in all, at most ``max_cols`` per row); True when
        the prompts are in the cache."""
        if self.done_cols < self.width:
            cols = max(self.align, self.per_row(chunk, max_cols) // self.align * self.align)
            end = min([self.width, self.done_cols + cols,
                       *(c for c in self.marks if c > self.done_cols)])
            if self.padded:
                end = no_lone_column(self.done_cols, end, self.width)
            chunk = self.tokens[:, self.done_cols:end]
            done = self.done_cols

            def forward() -> mx.array:
                if self.feed is not None:  # media rows: column c is row r's cached + c
                    return self.feed(chunk, self.cache, [s.cached + done for s in self.seqs])
                return self.model(chunk, self.cache)

            ending = [r for r, n in enumerate(self.lengths) if done < n <= end]
            if ending:  # rows whose prompt ends in this chunk: their last position's logits
                cols = mx.array([min(max(n - 1 - done, 0), end - done - 1)
                                 for n in self.lengths], dtype=mx.int32)
                logits = self.heads.logits(forward, cols)
                for r in ending:
                    self.first[r] = logits[r]
            else:
                forward()  # its logits are never evaluated
            self.last_cols, self.done_cols = end - self.done_cols, end
            if end < self.width:
                self._take(self.marks.pop(end, ()))
                mx.eval(arrays(self.cache), [self.first[r] for r in ending])
            else:
                self._finish()
        return self.done_cols >= self.width

    @property
    def logits(self) -> mx.array:
        """[B, V]: each row's logits at its prompt's last position (once done)."""
        return mx.stack(self.first)

    def _finish(self) -> None:
        if self.padded:
            for c in self.cache:
                c.finalize()
            self.padded = False
        if self.trim:
            for c in self.cache:
                c.trim(self.trim)
            self.trim = 0
        mx.eval(arrays(self.cache), self.first)

    def _take(self, marks: Any) -> None:
        """Copy out the checkpoints of ``marks`` (row, position, kind) into their rows. A
        cache that cannot be copied out (a family's own batch cache without ``extract``)
        costs the rows their checkpoints, never their answers."""
        try:
            for r, position, kind in marks:
                self.seqs[r].checkpoints.append(
                    checkpoint(self.cache, r, self.lone, position, kind))
        except Exception as exc:
            log.warning("prompt_cache_checkpoint_failed",
                        error=f"{type(exc).__name__}: {exc}")
            self.marks = {}


def no_lone_column(done: int, end: int, width: int) -> int:
    """Where a padded group's chunk from ``done`` ends, moved off ``end`` so that neither
    it nor the group's last chunk is one column wide: mlx-lm takes a one-column update for
    a decode step, which a batch cache still padded (``prepare`` before ``finalize``)
    refuses. A checkpoint mark one column on is passed over (that row loses that one
    checkpoint); a group one column wide stays one column (its cache cannot tell)."""
    if end - done == 1:
        end = min(width, done + 2)
    if width - end == 1:
        end = end - 1 if end - done > 2 else width
    return end


def _trimmable_after(caches: list[Any], cols: int) -> bool:
    """Whether one row's plain ``caches`` can still be trimmed once ``cols`` more tokens
    are in: a rotating layer only while it holds fewer tokens than its window."""
    from mlx_lm.models.cache import RotatingKVCache

    return all(type(c) is not RotatingKVCache or c.offset + cols < c.max_size
               for c in caches)


class MixedOps:
    """What ``DecodeBatch`` does to its caches on this path."""

    @staticmethod
    def join(cache: list[Any], parts: list[list[Any]], keep: list[int] | None) -> None:
        """``parts`` join ``cache`` (filtered to ``keep`` first); a lone row's plain caches,
        the batch's or a part's, become batch caches first (``merge``)."""
        if is_lone(cache):
            cache[:] = merge_rows([cache])  # one row: ``keep`` is [0] or None
        elif keep is not None:
            MixedOps._filter(cache, keep)
        for part in parts:
            part = merge_rows([part]) if is_lone(part) else part
            for mine, theirs in zip(cache, part, strict=True):
                mine.extend(theirs)

    @staticmethod
    def filter(cache: list[Any], keep: list[int]) -> None:
        """Keep the rows ``keep``; one row left of mlx-lm's batch KV and rotating caches
        goes back to its own plain caches (``extract``)."""
        if is_lone(cache):
            return  # a lone row that is kept
        if len(keep) == 1 and all(type(c) in _EXTRACTS for c in cache):
            cache[:] = [c.extract(keep[0]) for c in cache]
            return
        MixedOps._filter(cache, keep)

    @staticmethod
    def _filter(cache: list[Any], keep: list[int]) -> None:
        index = mx.array(keep, dtype=mx.int32)
        for c in cache:
            c.filter(index)

    @staticmethod
    def snapshots(batch: Any, seqs: list[Sequence]) -> list[tuple[list[int], RowCaches]]:
        """Each row's caches, copied, and the tokens they hold (``DecodeBatch.fed``);
        queued, not waited for."""
        out = []
        for seq in seqs:
            i = batch.rows.index(seq)
            caches = [row_copy(c) for c in batch.cache] if is_lone(batch.cache) \
                else [owned(c.extract(i)) for c in batch.cache]
            out.append((seq.context[:batch.fed(seq)], RowCaches(caches)))
        mx.async_eval([a for _, stored in out for a in arrays(stored.caches)])
        return out

"""Rows whose prompt holds media: they prefill from input embeddings, not token ids.

Media rows prefill in groups of media rows only (never beside text rows), each padded to
the group's width (and aligned as text rows are); where the decoder does not say it takes
padded rows (``batches_media``), each alone. Its decoder (``mlxcel.families.media``) gives the whole
prompt's rotary positions and the row's position shift once, when the row is admitted
(cheap), and its input embeddings at its first chunk, each item's features from the
vision-feature cache (``FeatureCache``) or the vision tower; every chunk then feeds its
slice of both. After prefill the row decodes beside text rows: ``DecodeBatch`` hands
each row's shift to the decoder (``shift``), so M-RoPE positions stay right per row.

A chunk that holds no item's tokens is fed its token ids with its positions, as a text
row's chunk: the embeddings of a text token are the model's own. So a prompt-cache hit,
which works as for text rows (the media digests are in the block hashes) and feeds only
the uncached tail, builds no embeddings for the whole prompt when its items are all in
the cached prefix (an agent's next turn about the same image). Beside another row's
items in one chunk, such a row takes its tokens' own embeddings (the decoder's
``text_embeddings``) for its columns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx

from mlxcel.engine.sequence import Sequence
from mlxcel.media.recent import Recent


class FeatureCache(Recent[Any]):
    """Vision features by item digest, least recently used first out; ``size`` items at
    most (``--vision-cache-size``; 0 keeps none): the media path's memo
    (``mlxcel.media.recent.Recent``), counted in items, not bytes."""

    def __init__(self, size: int = 20) -> None:
        super().__init__(size, 1, lambda features: 0)

    def get(self, digest: bytes, compute: Callable[[], Any]) -> Any:
        """The features of the item ``digest``, computed (and evaluated) on a miss."""
        return super().get(digest, lambda: _evaluated(compute()))


def _evaluated(features: Any) -> Any:
    mx.eval(features)
    return features


class MediaFeed:
    """Feeds the prefill chunks of a group of media rows (``Prefill.feed``): each chunk's
    columns of every row's embeddings and rotary positions.

    ``starts`` (per call) gives the prompt position of the chunk's first column for each
    row: rows of a group are padded to one width (on the left by ``PrefillJob``, on the
    right by ``MixedPrefill``), so a column may lie before a row's prompt (negative) or
    past its end. A padded column gets zero embeddings and positions: the cache masks
    it, so its values reach no real token."""

    def __init__(self, model: Any, seqs: list[Sequence], features: FeatureCache,
                 together: bool = False) -> None:
        """``together``: the group's new items go through the decoder's
        ``media_features`` in one call (``EnginePolicy.media_together``)."""
        self.model = model
        self.together = together
        self.prompts = [seq.req.media for seq in seqs]
        self.features = features
        self.positions: list[mx.array | None] = []
        for seq, prompt in zip(seqs, self.prompts, strict=True):
            positions, shift = model.media_positions(prompt)
            seq.position_shift = int(shift)
            self.positions.append(positions)
        self.embeds: list[mx.array | None] = [None] * len(seqs)
        # per row, whether what it computes holds no item (its items all lie in its cached
        # prefix: an agent's next turn); known at the first chunk
        self.text_tail: list[bool] | None = None

    def __call__(self, tokens: mx.array, cache: list[Any], starts: list[int]) -> Any:
        width = tokens.shape[1]
        if self.text_tail is None:
            self.text_tail = [all(s + n <= max(start, 0) for s, n in prompt.spans)
                              for prompt, start in zip(self.prompts, starts, strict=True)]
        positions = self._positions(starts, width)
        if not any(s < start + width and start < s + n
                   for prompt, start in zip(self.prompts, starts, strict=True)
                   for s, n in prompt.spans):
            return self.model(tokens, cache, positions=positions)  # text only
        return self.model(tokens, cache, embeds=self._embeds(tokens, starts),
                          positions=positions)

    def _embeds(self, tokens: mx.array, starts: list[int]) -> mx.array:
        """[B, width, D]: each row's embeddings in the chunk. A row whose computed part
        holds no item takes its tokens' own (the decoder's ``text_embeddings``), so that
        beside another row's image it builds no embeddings of its whole prompt."""
        width = tokens.shape[1]
        text = getattr(self.model, "text_embeddings", None)
        plain = [text is not None and bool(self.text_tail and self.text_tail[r])
                 for r in range(len(starts))]
        pending = [p for p, e, t in zip(self.prompts, self.embeds, plain, strict=True)
                   if e is None and not t]
        features: Any = self.features
        together = getattr(self.model, "media_features", None) if self.together else None
        if together is not None and pending:  # the rows' new items in one call
            features = _Encoded(self.features, together(pending, self.features.holds))
        rows = []
        for r, start in enumerate(starts):
            if plain[r]:
                rows.append(text(tokens[r:r + 1]))
                continue
            if self.embeds[r] is None:
                self.embeds[r] = self.model.media_embeddings(self.prompts[r], features)
            rows.append(_window(self.embeds[r], start, width, axis=1))
        return rows[0] if len(rows) == 1 else mx.concatenate(rows, axis=0)

    def _positions(self, starts: list[int], width: int) -> mx.array | None:
        """[3, B, width] (the model's rows of positions), or None where no row's model
        positions differ from the token index."""
        if all(p is None for p in self.positions):
            return None
        rows = []
        for prompt, positions, start in zip(self.prompts, self.positions, starts,
                                            strict=True):
            if positions is None:  # the token index, on every rotary axis
                n = len(prompt.token_ids)
                positions = mx.broadcast_to(mx.arange(n, dtype=mx.int32), (3, 1, n))
            rows.append(_window(positions, start, width, axis=-1))
        return rows[0] if len(rows) == 1 else mx.concatenate(rows, axis=1)


class _Encoded:
    """The feature cache, with items the decoder has just encoded together
    (``media_features``) handed to it in place of encoding each alone."""

    def __init__(self, cache: FeatureCache, ready: dict[bytes, Any]) -> None:
        self.cache, self.ready = cache, ready

    def get(self, digest: bytes, compute: Callable[[], Any]) -> Any:
        value = self.ready.get(digest)
        return self.cache.get(digest, compute if value is None else (lambda: value))


def _window(values: mx.array, start: int, width: int, axis: int) -> mx.array:
    """``values``' columns ``[start, start + width)`` along ``axis``, zeros where that
    runs past either end (a padded column)."""
    axis %= values.ndim
    n = values.shape[axis]
    lo = min(max(start, 0), n)
    hi = min(max(start + width, lo), n)
    before = min(max(lo - start, 0), width)
    after = width - before - (hi - lo)
    index = [slice(None)] * values.ndim
    index[axis] = slice(lo, hi)
    part = values[tuple(index)]
    if not before and not after:
        return part
    if hi == lo:
        shape = list(values.shape)
        shape[axis] = width
        return mx.zeros(shape, dtype=values.dtype)
    pad = [(0, 0)] * values.ndim
    pad[axis] = (before, after)
    return mx.pad(part, pad)


def batches_media(model: Any) -> bool:
    """Whether ``model``'s image rows may prefill together, padded to one width
    (``media_batch``: ``mlxcel.families.media``); else each prefills alone."""
    return bool(getattr(model, "media_batch", False))


def shifts(rows: list[Sequence]) -> mx.array | None:
    """Each row's position shift ``[B]`` for a decode step, or None when all are 0."""
    values = [getattr(s, "position_shift", 0) for s in rows]
    return mx.array(values, dtype=mx.int32) if any(values) else None

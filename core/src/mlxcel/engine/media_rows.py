"""Rows whose prompt holds media: they prefill from input embeddings, not token ids.

A media row is admitted alone (``Sequence.solo``) and unaligned, so its prefill columns
are its prompt's own tokens. Its decoder (``mlxcel.families.media``) gives the whole
prompt's rotary positions and the row's position shift once, when the row is admitted
(cheap), and its input embeddings at its first chunk, each item's features from the
vision-feature cache (``FeatureCache``) or the vision tower; every chunk then feeds its
slice of both. After prefill the row decodes beside text rows: ``DecodeBatch`` hands
each row's shift to the decoder (``shift``), so M-RoPE positions stay right per row.

A chunk that holds no item's tokens is fed its token ids with its positions, as a text
row's chunk: the embeddings of a text token are the model's own. So a prompt-cache hit,
which works as for text rows (the media digests are in the block hashes) and feeds only
the uncached tail, builds no embeddings for the whole prompt when its items are all in
the cached prefix (an agent's next turn about the same image).
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
    """Feeds a media row's prefill chunks (``Prefill.feed``): prompt positions
    ``[start, end)`` of its embeddings and rotary positions."""

    def __init__(self, model: Any, seq: Sequence, features: FeatureCache) -> None:
        self.model = model
        self.prompt = seq.req.media
        self.features = features
        self.positions, shift = model.media_positions(self.prompt)
        seq.position_shift = int(shift)
        self.embeds: mx.array | None = None

    def __call__(self, tokens: mx.array, cache: list[Any], start: int, end: int) -> Any:
        positions = None if self.positions is None else self.positions[..., start:end]
        if not any(s < end and start < s + n for s, n in self.prompt.spans):
            return self.model(tokens, cache, positions=positions)  # text only
        if self.embeds is None:
            self.embeds = self.model.media_embeddings(self.prompt, self.features)
        return self.model(tokens, cache, embeds=self.embeds[:, start:end],
                          positions=positions)


def shifts(rows: list[Sequence]) -> mx.array | None:
    """Each row's position shift ``[B]`` for a decode step, or None when all are 0."""
    values = [getattr(s, "position_shift", 0) for s in rows]
    return mx.array(values, dtype=mx.int32) if any(values) else None

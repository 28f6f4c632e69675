"""What a model's per-row caches allow a prompt cache to reuse, and copies cut to a prefix.

A stored entry holds one row's per-layer caches (mlx-lm's single-row ``KVCache``,
``RotatingKVCache``, ``ArraysCache`` or ``CacheList`` of those, as the batch caches'
``extract`` gives them) for its first ``length`` tokens. A later prompt can start from the
entry's first ``n`` tokens only if every layer can be cut back to ``n``:

* **plain KV** keeps every token: any prefix (``prefix``).
* **rotating** (sliding window of ``max_size``) keeps the last ``max_size`` tokens: any
  prefix while the whole entry still lies inside the window, otherwise the entry's full
  length only (``window``).
* **recurrent / conv state** (``ArraysCache``) is one state after the last token and cannot
  be rewound: the entry's full length only, the case of a conversation's next turn, whose
  prompt extends the last one (``exact``).
* anything else (a family's own cache class): ``exact``, the rule that needs nothing of a
  cache but ``merge``.

A model's rule is its strictest layer's.
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec

MODES = ("prefix", "window", "exact")  # loosest first


class Reuse(msgspec.Struct, frozen=True):
    """``mode`` (``MODES``); ``window``: the smallest rotating layer's size (``window``)."""

    mode: str = "prefix"
    window: int | None = None

    def covers(self, length: int, n: int) -> bool:
        """Whether an entry of ``length`` tokens may be cut back to its first ``n``."""
        if n >= length or self.mode == "prefix":
            return True
        return self.mode == "window" and self.window is not None and length <= self.window


def _layers(cache: Any) -> list[Any]:
    inner = getattr(cache, "caches", None)
    if inner is not None and type(cache).__name__ == "CacheList":
        return [leaf for c in inner for leaf in _layers(c)]
    return [cache]


def reuse_rule(caches: list[Any]) -> Reuse:
    """The rule (module docstring) of a model whose ``make_cache()`` gave ``caches``."""
    from mlx_lm.models.cache import KVCache, RotatingKVCache

    mode, window = "prefix", None
    for leaf in (leaf for c in caches for leaf in _layers(c)):
        if type(leaf) is KVCache:
            continue
        if type(leaf) is RotatingKVCache:
            window = leaf.max_size if window is None else min(window, leaf.max_size)
            mode = "exact" if mode == "exact" else "window"
        else:
            mode = "exact"
    return Reuse(mode, window if mode == "window" else None)


def cut(caches: list[Any], n: int) -> list[Any]:
    """Single-row ``caches`` (of ``length`` tokens) as new caches of their first ``n``
    tokens, sharing no array that a batch could write into: batch ``merge`` copies what it
    is given, so uncut layers are passed as they are."""
    return [_cut(c, n) for c in caches]


def _cut(cache: Any, n: int) -> Any:
    from mlx_lm.models.cache import CacheList, KVCache, RotatingKVCache

    if type(cache) is CacheList:
        return CacheList(*(_cut(c, n) for c in cache.caches))
    if type(cache) is KVCache and cache.offset > n:
        out = KVCache()
        out.keys, out.values, out.offset = cache.keys[..., :n, :], cache.values[..., :n, :], n
        return out
    if type(cache) is RotatingKVCache and cache.offset > n:
        # only while the entry lies in the window (Reuse.covers): slots are in order
        out = RotatingKVCache(cache.max_size, cache.keep)
        out.keys, out.values = cache.keys[..., :n, :], cache.values[..., :n, :]
        out.offset = out._idx = n
        return out
    return cache


def owned(cache: Any) -> Any:
    """An ``extract``-ed row cache whose arrays are copies, not views of the batch's
    buffers: ``ArraysCache.extract`` slices them, and a KV row that spans its batch
    buffer's whole width is already contiguous, so ``extract`` returns a view; either would
    keep the whole batch's buffer alive for as long as the entry lives."""
    import mlx.core as mx
    from mlx_lm.models.cache import ArraysCache, CacheList

    if type(cache) is CacheList:
        return CacheList(*(owned(c) for c in cache.caches))
    if isinstance(cache, ArraysCache):
        cache.cache = [None if a is None else mx.array(a) for a in cache.cache]
    elif getattr(cache, "keys", None) is not None:
        cache.keys, cache.values = mx.array(cache.keys), mx.array(cache.values)
    return cache


def lone_kinds(caches: list[Any]) -> bool:
    """Whether one row on ``caches`` (a ``make_cache()``) may decode on them as they are and
    move to and from batch caches through mlx-lm's ``merge`` and ``extract``, which give
    back the same kinds: plain KV and rotating layers without kept tokens (the batch
    rotating cache keeps none). Other kinds stay on batch caches even for one row."""
    from mlx_lm.models.cache import KVCache, RotatingKVCache

    return bool(caches) and all(type(c) is KVCache or (type(c) is RotatingKVCache
                                                       and c.keep == 0) for c in caches)


def is_lone(caches: list[Any]) -> bool:
    """Whether decode caches are one row's own (``lone_kinds``), not batch caches."""
    from mlx_lm.models.cache import KVCache, RotatingKVCache

    return type(caches[0]) in (KVCache, RotatingKVCache)


def private(caches: list[Any]) -> list[Any]:
    """Single-row plain ``caches`` (``lone_kinds``; a prompt-cache entry's, cut) as new
    cache objects on new array handles, so decoding on them, which writes into its arrays
    in place, never writes into the stored entry's. The handles are views of the entry's
    buffers, not copies: MLX writes in place only into a buffer no other array holds, so
    the first write into a shared one copies it (a KV layer's first write grows it into a
    new buffer anyway), and a restore copies no layer twice."""
    out = []
    for c in caches:
        mine = copy.copy(c)
        if c.keys is not None:
            mine.keys, mine.values = c.keys[...], c.values[...]
        out.append(mine)
    return out


def row_copy(cache: Any) -> Any:
    """A copy of a lone row's plain cache in the form batch ``extract`` gives (its tokens
    only, in temporal order): what a prompt-cache entry holds."""
    if cache.keys is None:  # no token yet: nothing to copy
        return copy.copy(cache)
    return owned(type(cache).merge([cache]).extract(0))


def arrays(caches: list[Any]) -> list[Any]:
    """Every array the caches hold (to queue, count or free them)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    return [a for _, a in tree_flatten([c.state for c in caches]) if isinstance(a, mx.array)]


def stored_arrays(payload: Any, checkpoints: Any = ()) -> list[Any]:
    """Every array of a prompt-cache entry: its payload (``RowCaches`` or the shared
    path's ``KVRows``) and its checkpoints."""
    caches = getattr(payload, "caches", None)
    out = arrays(caches) if caches is not None else [payload.keys, payload.values]
    for c in checkpoints:
        out += arrays([layer for layer in c.caches if layer is not None])
    return out


def nbytes(caches: list[Any]) -> int:
    return sum(int(a.nbytes) for a in arrays(caches))


class RowCaches:
    """One row's per-layer caches: what the prompt cache keeps of a row of the mixed path
    (``mlxcel.engine.mixed_batch``)."""

    def __init__(self, caches: list[Any]) -> None:
        self.caches = caches
        self.nbytes = nbytes(caches)

    def prefix(self, n: int) -> RowCaches:
        return RowCaches(cut(self.caches, n))

    def detached(self) -> RowCaches:
        """These caches on arrays of their own, computed: a shrunk entry then holds none of
        the longer one's buffers."""
        import mlx.core as mx

        caches = [owned(c) for c in self.caches]
        mx.eval(arrays(caches))
        return RowCaches(caches)

    def at(self, checkpoint: Checkpoint) -> RowCaches:
        """The row's state at ``checkpoint.position`` (at most our length): the
        checkpoint's own layers, and ours cut back where it holds None."""
        n = checkpoint.position
        return RowCaches([_cut(mine, n) if theirs is None else theirs
                          for mine, theirs in zip(self.caches, checkpoint.caches, strict=True)])


def cuttable(cache: Any) -> bool:
    """Whether a row's layer ``cache`` (as ``extract`` gives it) can be cut back to any
    shorter length later (``cut``): plain KV, and CacheLists of plain KV only."""
    from mlx_lm.models.cache import CacheList, KVCache

    if type(cache) is CacheList:
        return all(cuttable(c) for c in cache.caches)
    return type(cache) is KVCache


class Checkpoint:
    """One row's state after its first ``position`` tokens, for the layers that cannot be
    cut back to it later (``cuttable``: recurrent and conv state, rotating windows, a
    family's own kinds); ``caches`` has None for the others, which the entry that holds the
    checkpoint gives, cut (``RowCaches.at``). ``kind`` names the boundary it was taken at
    (``mlxcel.types.CACHE_MARKS``)."""

    def __init__(self, position: int, kind: str, caches: list[Any | None]) -> None:
        self.position, self.kind, self.caches = position, kind, caches
        self.nbytes = nbytes([c for c in caches if c is not None])

    @classmethod
    def of(cls, position: int, kind: str, caches: list[Any]) -> Checkpoint:
        """From a row's whole caches at ``position`` (owned copies): cuttable layers
        dropped."""
        return cls(position, kind, [None if cuttable(c) else c for c in caches])

"""How the prompt cache keeps within its capacity (``PromptCache``'s part that evicts).

Eviction is LRU by value: an entry with a checkpoint first shrinks to its most valuable
one (``CHECKPOINT_VALUE``), which then starts over as the most recently used, so the
system + tools prefix outlives a one-off prompt's tail; plus TTL. What leaves memory goes
to the disk tier where one is open (``--cache-disk-dir``). The methods run under the
cache's lock, on its state (``_entries`` in LRU order, ``bytes``, ``counters``).
"""

from __future__ import annotations

import time
from typing import Any

from mlxcel.engine.cache.entries import BLOCK_SIZE, CHECKPOINT_VALUE, CacheEntry


class Eviction:
    """A mixin of ``PromptCache``: expiry, room for a new entry, and shrinking (through
    the cache's own ``_add``, ``_drop`` and ``_same``)."""

    _entries: Any
    _ids: Any
    bytes: int
    capacity_bytes: int
    max_entries: int
    ttl_s: float
    counters: dict[str, int]
    disk: Any

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.ttl_s
        for entry_id in [i for i, e in self._entries.items() if e.created < cutoff]:
            self._drop(entry_id, "evictions_ttl")

    def _make_room(self, need: int, adding: int = 1) -> None:
        """Evict (LRU by value, see the module docstring) until ``need`` more bytes and
        ``adding`` more entries fit."""
        while self._entries and (self.bytes + need > self.capacity_bytes
                                 or len(self._entries) + adding > self.max_entries):
            victim = next(iter(self._entries.values()))
            bytes_bound = len(self._entries) + adding <= self.max_entries
            if not (bytes_bound and self._shrink(victim)):
                if self.disk is not None:
                    self.disk.put(victim)
                self._drop(victim.id, "evictions_lru")

    def _shrink(self, victim: CacheEntry) -> bool:
        """Replace ``victim`` by its state at its most valuable checkpoint, as the most
        recently used entry; False where it has none (or was shrunk already)."""
        if victim.shrunk or victim.payload is None or not victim.checkpoints:
            return False
        best = max(victim.checkpoints,
                   key=lambda c: (CHECKPOINT_VALUE.get(c.kind, 0), c.position))
        n = best.position
        if n < BLOCK_SIZE:
            return False
        tokens = victim.tokens[:n]
        small = CacheEntry(next(self._ids), tokens, victim.hashes[:n // BLOCK_SIZE],
                           victim.payload.at(best).detached(),
                           [c for c in victim.checkpoints if c.position < n], victim.digests)
        small.shrunk, small.kind = True, best.kind
        if self.disk is not None:
            self.disk.put(victim)
        self._drop(victim.id, None)
        self.counters["shrinks"] += 1
        if self._same(small) is None:
            self._add(small)
        return True


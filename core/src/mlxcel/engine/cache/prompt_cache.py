"""Prefix cache: reuse the KV state of the longest cached prefix of a new prompt.

Prompts are cut into blocks of 16 tokens; block ``i``'s hash is
``sha256(hash[i-1] + tokens of block i)``, so one hash names a whole prefix. An entry holds
one sequence's cached state (a ``Stored``) for its first ``length`` tokens and indexes every
full block hash of them, plus the tokens past its last full block (``tail``), so a later
prompt finds it by any block-aligned prefix and, exactly, by its whole length.

What a hit may reuse depends on the model's caches (``reuse``, a
``mlxcel.engine.cache.kinds.Reuse``): with plain KV any block-aligned prefix, and entries
are cut to whole blocks; with sliding-window or recurrent layers an entry keeps its full
length, and a prompt that extends it exactly reuses all of it, while a shorter prefix is
reused only where ``Reuse.covers`` allows. Capacity is in bytes and entries; eviction is
LRU, plus TTL; an entry larger than the capacity is refused.
Thread-safe: the engine thread looks up and inserts, HTTP handlers read stats and reset
(after any store the engine has announced, see ``begin_inserts``).
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from mlxcel.engine.cache.kinds import Reuse

BLOCK_SIZE = 16
INSERT_WAIT_S = 10.0  # stats/reset wait at most this long for the engine's inserts


def block_hashes(tokens: Sequence[int], limit: int | None = None) -> list[bytes]:
    """Chained sha256 of each full 16-token block (of the first ``limit`` tokens)."""
    n = len(tokens) if limit is None else min(limit, len(tokens))
    out, prev = [], b""
    for start in range(0, n - n % BLOCK_SIZE, BLOCK_SIZE):
        block = b"".join(int(t).to_bytes(4, "little", signed=False)
                         for t in tokens[start:start + BLOCK_SIZE])
        prev = hashlib.sha256(prev + block).digest()
        out.append(prev)
    return out


class Stored(Protocol):
    """One sequence's cached state for some tokens, in the form its engine path reuses."""

    nbytes: int

    def prefix(self, n: int) -> Stored:
        """The state of the first ``n`` tokens (only asked where the entry's rule allows)."""
        ...


class CacheEntry:
    """``payload`` for the first ``length`` tokens: ``hashes`` of its full blocks and the
    ``tail`` tokens after them."""

    def __init__(self, entry_id: int, tokens: Sequence[int], hashes: list[bytes],
                 payload: Stored) -> None:
        self.id = entry_id
        self.hashes = hashes
        self.length = len(tokens)
        self.tail = tuple(tokens[len(hashes) * BLOCK_SIZE:])
        self.payload = payload
        self.nbytes = int(payload.nbytes)
        self.created = time.monotonic()

    def extended_by(self, tokens: Sequence[int], depth: int) -> bool:
        """Whether ``tokens``, whose first ``depth`` blocks hash like ours, start with
        all of our tokens."""
        start = depth * BLOCK_SIZE
        return depth == len(self.hashes) and len(tokens) >= self.length \
            and tuple(tokens[start:self.length]) == self.tail


class PromptCache:
    def __init__(self, capacity_bytes: int, max_entries: int = 1024, ttl_s: float = 3600.0,
                 enabled: bool = True) -> None:
        self.enabled = enabled
        self.reuse = Reuse()  # what the model's caches allow (set by the engine)
        self.disabled_reason: str | None = None if enabled else "disabled (--no-cache-prompt)"
        self.capacity_bytes = capacity_bytes
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._entries: OrderedDict[int, CacheEntry] = OrderedDict()  # LRU order
        self._holders: dict[bytes, list[int]] = {}  # block hash -> live entries holding it
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self.on_reset: Callable[[], None] | None = None  # set by the engine (EngineWorker)
        self._inserting = 0  # stores the engine announced (begin_inserts) and has not ended
        self._settled = threading.Condition(self._lock)
        self.bytes = 0
        self.counters = dict.fromkeys(("hits", "lookups", "inserts", "evictions_lru",
                                       "evictions_ttl", "rejections_oversized"), 0)
        # --distributed rank 0: what changed, for the other ranks (``drain_journal``)
        self.journal: list[tuple[int, ...]] | None = None
        self._calls = 0  # insert() calls since the journal was last drained

    # -- engine thread ----------------------------------------------------------------------
    def lookup(self, tokens: Sequence[int]) -> tuple[CacheEntry, int] | None:
        """The entry and the number of prompt tokens it covers (always leaving at least one
        prompt token to compute), or None: the deepest block-aligned prefix some entry holds
        that ``reuse`` lets it be cut back to, or an entry that ``tokens`` extend exactly
        if that covers more."""
        if not self.enabled:
            return None
        limit = len(tokens) - 1
        hashes = block_hashes(tokens, limit)
        with self._lock:
            self._expire()
            self.counters["lookups"] += 1
            for depth in range(len(hashes), 0, -1):
                found = self._best(tokens[:limit], depth, hashes[depth - 1])
                if found is not None:
                    self._entries.move_to_end(found[0].id)
                    self.counters["hits"] += 1
                    return found
        return None

    def _best(self, tokens: Sequence[int], depth: int,
              block: bytes) -> tuple[CacheEntry, int] | None:
        """(lock held) Among the entries holding ``block`` (hash of ``depth`` blocks), the
        newest that ``tokens`` extend exactly, else the newest that may be cut back to
        ``depth`` blocks."""
        found = None
        holders = self._holders.get(block, ())
        for entry in (self._entries[i] for i in reversed(holders)):
            if entry.extended_by(tokens, depth):
                return entry, entry.length
            if found is None and self.reuse.covers(entry.length, depth * BLOCK_SIZE):
                found = entry, depth * BLOCK_SIZE
        return found

    def insert(self, tokens: Sequence[int], payload: Stored) -> bool:
        """Store ``payload``, the state of ``tokens`` (cut to whole blocks where any prefix
        may be reused); False when refused."""
        call, self._calls = self._calls, self._calls + 1
        if not self.enabled:
            return False
        hashes = block_hashes(tokens)
        if not hashes:
            return False
        if self.reuse.mode == "prefix" and len(tokens) % BLOCK_SIZE:
            tokens = tokens[:len(hashes) * BLOCK_SIZE]
            payload = payload.prefix(len(tokens))
        with self._lock:
            for holder in self._holders.get(hashes[-1], ()):
                if self._entries[holder].length == len(tokens) \
                        and self._entries[holder].extended_by(tokens, len(hashes)):
                    self._entries.move_to_end(holder)  # already cached
                    return True
            entry = CacheEntry(next(self._ids), tokens, hashes, payload)
            if entry.nbytes > self.capacity_bytes:
                self.counters["rejections_oversized"] += 1
                return False
            self._expire()
            self._drop_prefixes_of(tokens, hashes)
            while self._entries and (self.bytes + entry.nbytes > self.capacity_bytes
                                     or len(self._entries) >= self.max_entries):
                self._drop(next(iter(self._entries)), "evictions_lru")
            self._entries[entry.id] = entry
            self._note(0, entry.id, call, len(tokens))
            self.bytes += entry.nbytes
            for h in hashes:
                self._holders.setdefault(h, []).append(entry.id)
            self.counters["inserts"] += 1
            return True

    def begin_inserts(self) -> None:
        """The engine is about to store sequences whose finish events go out first:
        ``stats`` and ``reset`` wait for ``end_inserts``, so a client that read its finish
        event sees its request stored."""
        with self._lock:
            self._inserting += 1

    def end_inserts(self) -> None:
        with self._lock:
            self._inserting -= 1
            if not self._inserting:
                self._settled.notify_all()

    def _wait_inserts(self) -> None:
        """(lock held) until no announced store is running (at most ``INSERT_WAIT_S``)."""
        self._settled.wait_for(lambda: not self._inserting, timeout=INSERT_WAIT_S)

    def disable(self, reason: str) -> None:
        self.enabled, self.disabled_reason = False, reason
        self.reset()

    # -- any thread --------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        with self._lock:
            self._wait_inserts()
            self._expire()
            lookups, hits = self.counters["lookups"], self.counters["hits"]
            return {
                "enabled": self.enabled, "apc_enabled": False, "block_size": BLOCK_SIZE,
                "hash": "sha256", "entries": len(self._entries), "bytes": self.bytes,
                "capacity_bytes": self.capacity_bytes, "max_entries": self.max_entries,
                "hits": hits, "lookups": lookups,
                "hit_rate": round(hits / lookups, 4) if lookups else 0.0,
                "inserts": self.counters["inserts"],
                "evictions_lru": self.counters["evictions_lru"],
                "evictions_ttl": self.counters["evictions_ttl"],
                "rejections_oversized": self.counters["rejections_oversized"],
                "total_blocks_stored": sum(len(e.hashes) for e in self._entries.values()),
                "unique_block_hashes": len(self._holders), "apc_active_entries": 0,
                "reuse": self.reuse.mode, "reuse_window": self.reuse.window,
                **({"disabled_reason": self.disabled_reason}
                   if not self.enabled and self.disabled_reason else {}),
            }

    def reset(self) -> dict[str, Any]:
        """Drop every entry, then ask the engine (``on_reset``) to free the buffers they
        held: MLX's buffer cache is cleared on the engine thread only."""
        with self._lock:
            self._wait_inserts()
            freed_bytes, freed_entries = self.bytes, len(self._entries)
            self._entries.clear()
            self._holders.clear()
            self.bytes = 0
            self._note(2)
        if self.on_reset is not None:
            self.on_reset()
        return {"cleared": True, "freed_bytes": freed_bytes, "freed_entries": freed_entries}

    def drain_journal(self) -> list[tuple[int, ...]]:
        """The changes since the last drain, oldest first: ``(0, id, call, length)`` the
        ``call``-th insert since then made entry ``id`` of its first ``length`` tokens,
        ``(1, id)`` entry ``id`` left, ``(2,)`` every entry left. A distributed engine's
        rank 0 sends them, so every rank keeps and drops the same entries (their sizes
        differ per rank, so only rank 0's byte budget may decide)."""
        with self._lock:
            events, self._calls = self.journal or [], 0
            if self.journal is not None:
                self.journal = []
            return events

    # -- internals (lock held) ------------------------------------------------------------
    def _note(self, *event: int) -> None:
        if self.journal is not None:
            self.journal.append(event)

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.ttl_s
        for entry_id in [i for i, e in self._entries.items() if e.created < cutoff]:
            self._drop(entry_id, "evictions_ttl")

    def _drop_prefixes_of(self, tokens: Sequence[int], hashes: list[bytes]) -> None:
        """An entry whose tokens are a prefix of the new one adds nothing: drop it (a
        conversation then keeps one entry, not one copy of its history per turn)."""
        for depth, h in enumerate(hashes, start=1):
            for holder in list(self._holders.get(h, ())):
                if self._entries[holder].extended_by(tokens, depth):
                    self._drop(holder, None)

    def _drop(self, entry_id: int, reason: str | None) -> None:
        entry = self._entries.pop(entry_id)
        self._note(1, entry_id)
        self.bytes -= entry.nbytes
        for h in entry.hashes:
            holders = self._holders[h]
            holders.remove(entry_id)
            if not holders:
                del self._holders[h]
        if reason is not None:
            self.counters[reason] += 1

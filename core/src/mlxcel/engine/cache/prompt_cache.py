"""Prefix cache: reuse the cached state of the longest cached prefix of a new prompt.

Entries, block hashes and checkpoints are ``mlxcel.engine.cache.entries``. What a hit may
reuse depends on the model's caches (``reuse``, a ``mlxcel.engine.cache.kinds.Reuse``):
with plain KV any block-aligned prefix, and entries are cut to whole blocks; with
sliding-window or recurrent layers an entry keeps its full length, and a prompt reuses all
of it when it extends it exactly, or else the latest of the entry's checkpoints it shares
(the engine takes them at the boundaries the chat layer marks), or a shorter prefix where
``Reuse.covers`` allows.

Capacity is in bytes (checkpoints included) and entries, kept by eviction
(``mlxcel.engine.cache.eviction``). An entry larger than the capacity is refused.
Thread-safe: the engine thread looks up and inserts, HTTP handlers read stats and reset
(after any store the engine has announced, see ``begin_inserts``).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from mlxcel.engine.cache.disk import DiskTier
from mlxcel.engine.cache.entries import (
    BLOCK_SIZE,
    NO_DIGESTS,
    CacheEntry,
    Digests,
    Hit,
    Stored,
    best_in,
    block_hashes,
    prompt_hashes,
)
from mlxcel.engine.cache.eviction import Eviction
from mlxcel.engine.cache.kinds import Checkpoint, Reuse

__all__ = ["BLOCK_SIZE", "CacheEntry", "Hit", "PromptCache", "Stored", "block_hashes"]
INSERT_WAIT_S = 10.0  # stats/reset wait at most this long for the engine's inserts


class PromptCache(Eviction):
    def __init__(self, capacity_bytes: int, max_entries: int = 1024, ttl_s: float = 3600.0,
                 enabled: bool = True, max_checkpoints: int = 8) -> None:
        self.enabled = enabled
        self.reuse = Reuse()  # what the model's caches allow (set by the engine)
        self.disabled_reason: str | None = None if enabled else "disabled (--no-cache-prompt)"
        self.capacity_bytes = capacity_bytes
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self.max_checkpoints = max_checkpoints  # per entry (--ctx-checkpoints)
        self.disk: DiskTier | None = None  # --cache-disk-dir (opened by the engine)
        self._entries: OrderedDict[int, CacheEntry] = OrderedDict()  # LRU order
        self._holders: dict[bytes, list[int]] = {}  # block hash -> live entries holding it
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self.on_reset: Callable[[], None] | None = None  # set by the engine (EngineWorker)
        self._inserting = 0  # stores the engine announced (begin_inserts) and has not ended
        self._settled = threading.Condition(self._lock)
        self.bytes = 0
        self.counters = dict.fromkeys(("hits", "lookups", "inserts", "evictions_lru",
                                       "evictions_ttl", "rejections_oversized", "shrinks",
                                       "superseded"), 0)
        self.hits_by_kind: dict[str, int] = {}
        # --distributed rank 0: what changed, for the other ranks (``drain_journal``)
        self.journal: list[tuple[int, ...]] | None = None
        self._calls = 0  # insert() calls since the journal was last drained

    # -- engine thread ----------------------------------------------------------------------
    def lookup(self, tokens: Sequence[int], digests: Digests = NO_DIGESTS,
               hashes: list[bytes] | None = None) -> Hit | None:
        """The most of ``tokens`` (always leaving at least one prompt token to compute) that
        some entry gives (``entries.best_in``): the longest wins, the newest among equals.
        ``hashes``: ``entries.prompt_hashes(tokens, digests)``, when the caller has them."""
        if not self.enabled:
            return None
        limit = len(tokens) - 1
        if hashes is None:
            hashes = prompt_hashes(tokens, digests)
        with self._lock:
            self._expire()
            self.counters["lookups"] += 1
            best = self._best(tokens, hashes, limit, digests, self.disk)
            if best is not None and best.entry.payload is None:  # on disk: load it back
                best = self._from_disk(best) or self._best(tokens, hashes, limit, digests,
                                                           None)
            if best is not None:
                self._entries.move_to_end(best.entry.id)
                self.counters["hits"] += 1
                self.hits_by_kind[best.kind] = self.hits_by_kind.get(best.kind, 0) + 1
            return best

    def _best(self, tokens: Sequence[int], hashes: list[bytes], limit: int,
              digests: Digests, disk: DiskTier | None) -> Hit | None:
        """(lock held) Entries (in memory, then on ``disk``) are met at the deepest block
        they share with ``tokens``; one met at depth d shares fewer than (d + 1) blocks, so
        the walk stops there. Memory wins a tie."""
        best: Hit | None = None
        seen: set[Any] = set()
        with disk.lock if disk is not None and disk.enabled else contextlib.nullcontext():
            on_disk = disk is not None and disk.enabled
            for depth in range(len(hashes), 0, -1):
                if best is not None and (depth + 1) * BLOCK_SIZE <= best.n:
                    break
                block = hashes[depth - 1]
                found = [self._entries[i] for i in reversed(self._holders.get(block, ()))]
                if on_disk:
                    found += [disk.stub(k) for k in reversed(disk.holders.get(block, ()))]
                for entry in found:
                    key = entry.id if entry.payload is not None else entry.disk.key
                    if key in seen:
                        continue
                    seen.add(key)
                    hit = best_in(entry, entry.shared(tokens, depth, digests), limit,
                                  self.reuse.covers)
                    if hit is not None and (best is None or hit.n > best.n):
                        best = hit
        return best

    def _from_disk(self, hit: Hit) -> Hit | None:
        """(lock held) ``hit`` on a disk entry, made a memory entry's (None: the file
        failed its checks and is gone)."""
        stub = hit.entry
        loaded = self.disk.load(stub) if self.disk is not None else None
        if loaded is None:
            return None
        payload, checkpoints = loaded
        entry = CacheEntry(next(self._ids), stub.tokens, stub.hashes, payload, checkpoints)
        entry.disk = stub.disk
        same = self._same(entry)
        if same is not None:
            entry = same
        else:
            self._make_room(entry.nbytes)
            self._add(entry)
        self.disk.counters["hits"] += 1
        taken = next((c for c in entry.checkpoints if hit.checkpoint is not None
                      and c.position == hit.checkpoint.position), None)
        return Hit(entry, hit.n, taken, hit.kind) if hit.checkpoint is None or taken \
            else None

    def insert(self, tokens: Sequence[int], payload: Stored, checkpoints: Sequence[Any] = (),
               digests: Digests = NO_DIGESTS, started: Hit | None = None,
               prompt_len: int | None = None, known: Sequence[bytes] = ()) -> bool:
        """Store ``payload``, the state of ``tokens`` (cut to whole blocks where any prefix
        may be reused), with its ``checkpoints``; False when refused. ``prompt_len``: how
        many of the tokens were the prompt (the rest generated); ``started``: the hit the
        sequence was prefilled from, which the new entry may supersede (``_supersede``);
        ``known``: the first blocks' hashes (``block_hashes``' ``known``)."""
        call, self._calls = self._calls, self._calls + 1
        if not self.enabled:
            return False
        hashes = block_hashes(tokens, None, digests, known)
        if not hashes:
            return False
        if self.reuse.mode == "prefix":
            checkpoints = ()
            if len(tokens) % BLOCK_SIZE:
                tokens = tokens[:len(hashes) * BLOCK_SIZE]
                payload = payload.prefix(len(tokens))
        entry = CacheEntry(next(self._ids), tokens, hashes, payload,
                           [c for c in checkpoints if c.position < len(tokens)], digests)
        entry.prompt_len = min(entry.length, prompt_len or entry.length)
        with self._lock:
            same = self._same(entry)
            if same is not None:
                same.take_checkpoints(entry.checkpoints)
                same.keep_checkpoints(self.max_checkpoints)
                self._resize(same)
                self._entries.move_to_end(same.id)  # already cached
                return True
            if entry.nbytes > self.capacity_bytes:
                self.counters["rejections_oversized"] += 1
                return False
            self._expire()
            self._drop_prefixes_of(entry)
            self._supersede(entry, started)
            entry.keep_checkpoints(self.max_checkpoints)
            self._make_room(entry.nbytes)
            self._add(entry)
            self._note(0, entry.id, call, entry.length)
            self.counters["inserts"] += 1
            return True

    def _same(self, entry: CacheEntry) -> CacheEntry | None:
        """(lock held) A live entry of exactly ``entry``'s tokens."""
        for holder in self._holders.get(entry.hashes[-1], ()):
            other = self._entries[holder]
            if other.length == entry.length \
                    and other.shared(entry.tokens, len(entry.hashes), entry.digests) \
                    == entry.length:
                return other
        return None

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

    def persist(self, timeout: float) -> None:
        """Write every entry to the disk tier, if there is one, waiting at most
        ``timeout`` s (a shutdown: the next start finds them)."""
        if self.disk is None or not self.disk.enabled:
            return
        with self._lock:
            entries = list(self._entries.values())
        deadline = time.monotonic() + timeout
        for entry in reversed(entries):  # the most recently used first
            self.disk.put(entry, wait=max(0.0, deadline - time.monotonic()))
        self.disk.flush(max(0.0, deadline - time.monotonic()))

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
                "checkpoints": sum(len(e.checkpoints) for e in self._entries.values()),
                "checkpoint_bytes": sum(e.checkpoint_bytes for e in self._entries.values()),
                "checkpoint_kinds": dict(Counter(c.kind for e in self._entries.values()
                                                   for c in e.checkpoints)),
                "hits_by_kind": dict(self.hits_by_kind), "shrinks": self.counters["shrinks"],
                "superseded": self.counters["superseded"],
                "disk": self.disk.stats() if self.disk is not None else {"enabled": False},
                **({"disabled_reason": self.disabled_reason}
                   if not self.enabled and self.disabled_reason else {}),
            }

    def reset(self) -> dict[str, Any]:
        """Drop every entry, in memory and on disk, then ask the engine (``on_reset``) to
        free the buffers they held: MLX's buffer cache is cleared on the engine thread
        only."""
        with self._lock:
            self._wait_inserts()
            freed_bytes, freed_entries = self.bytes, len(self._entries)
            self._entries.clear()
            self._holders.clear()
            self.bytes = 0
            self._note(2)
            disk = self.disk.clear() if self.disk is not None else None
        if self.on_reset is not None:
            self.on_reset()
        return {"cleared": True, "freed_bytes": freed_bytes, "freed_entries": freed_entries,
                **({"freed_disk_files": disk[0], "freed_disk_bytes": disk[1]}
                   if disk is not None else {})}

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

    def _drop_prefixes_of(self, entry: CacheEntry) -> None:
        """An entry whose tokens are a prefix of the new one adds nothing but its
        checkpoints, which the new one adopts: drop it (a conversation then keeps one
        entry, not one copy of its history per turn). A shrunk one's own end is a
        checkpoint the new one may lack (it was prefilled from there): adopted as one."""
        for depth, h in enumerate(entry.hashes, start=1):
            for holder in list(self._holders.get(h, ())):
                older = self._entries[holder]
                if len(older.hashes) == depth \
                        and entry.shared(older.tokens, depth, older.digests) >= older.length:
                    ends = [Checkpoint.of(older.length, older.kind, older.payload.caches)] \
                        if older.shrunk and older.payload is not None else []
                    entry.take_checkpoints([*older.checkpoints, *ends])
                    self._drop(holder, None)

    def _supersede(self, entry: CacheEntry, started: Hit | None) -> None:
        """The entry a conversation's next turn was prefilled from, at the end of its
        prompt (its last checkpoint there: the prompt's end, or the end of its messages
        before the generation prompt), holds past it only what the client did not send
        back (the sampled answer, which came back re-rendered as text): the new entry
        adopts its checkpoints and it goes, so a conversation keeps one entry, not one per
        turn. A prompt that re-sends the answer exactly extends the entry instead and
        drops it the same way (``_drop_prefixes_of``); one that took less of it (a
        sub-agent at the system prompt, an edited question) leaves it."""
        if started is None or started.checkpoint is None or self.reuse.mode == "prefix":
            return
        older = self._entries.get(started.entry.id)
        n = started.n
        if older is None or older is entry or older.payload is None \
                or started.checkpoint.kind == "system" \
                or n < max((c.position for c in older.checkpoints
                            if c.position < older.prompt_len), default=older.prompt_len):
            return
        depth = 0
        for mine, theirs in zip(entry.hashes, older.hashes, strict=False):
            if mine != theirs:
                break
            depth += 1
        if entry.shared(older.tokens, depth, older.digests) < n:
            return
        entry.take_checkpoints([c for c in older.checkpoints if c.position <= n])
        self._drop(older.id, None)
        self.counters["superseded"] += 1

    def _add(self, entry: CacheEntry) -> None:
        self._entries[entry.id] = entry
        entry.counted = entry.nbytes
        self.bytes += entry.counted
        for h in entry.hashes:
            self._holders.setdefault(h, []).append(entry.id)

    def _resize(self, entry: CacheEntry) -> None:
        """``entry`` adopted checkpoints: count their bytes, and make room for them."""
        self.bytes += entry.nbytes - entry.counted
        entry.counted = entry.nbytes
        self._make_room(0, adding=0)

    def _drop(self, entry_id: int, reason: str | None) -> None:
        entry = self._entries.pop(entry_id)
        self._note(1, entry_id)
        self.bytes -= entry.counted
        for h in entry.hashes:
            holders = self._holders[h]
            holders.remove(entry_id)
            if not holders:
                del self._holders[h]
        if reason is not None:
            self.counters[reason] += 1

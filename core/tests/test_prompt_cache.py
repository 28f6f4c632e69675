"""Prefix cache data structure: block hashes, longest-prefix hits, eviction, stats."""

from __future__ import annotations

import time

import mlx.core as mx
from mlxcel.engine.cache.kvcache import KVRows
from mlxcel.engine.cache.prompt_cache import BLOCK_SIZE, PromptCache, block_hashes

LAYERS = 2


def kv(n: int, fill: float = 1.0):
    """Keys/values for n tokens as the engine stores them, layers stacked: [LAYERS, 1,
    2 heads, n, 4] float32 (32 bytes/token per layer)."""
    return KVRows(mx.full((LAYERS, 1, 2, n, 4), fill), mx.full((LAYERS, 1, 2, n, 4), -fill))


def test_block_hashes_chain_and_only_full_blocks():
    a = block_hashes(list(range(40)))
    assert len(a) == 2 and all(len(h) == 32 for h in a)
    b = block_hashes(list(range(32)) + [99] * 8)
    assert a == b  # same first 32 tokens, the partial block is ignored
    c = block_hashes([7] + list(range(1, 40)))
    assert c[0] != a[0] and c[1] != a[1]  # a change in block 0 changes every later hash


def test_block_hashes_keep_their_byte_layout():
    """The disk tier names files by these hashes: the layout (4-byte little-endian ids,
    sha256 chained from the empty string) must not change under it."""
    import hashlib
    import struct

    tokens = [0, 1, 255, 256, 65535, 2**31, 2**32 - 1, *range(7, 32)]
    first = hashlib.sha256(struct.pack("<16I", *tokens[:16])).digest()
    second = hashlib.sha256(first + struct.pack("<16I", *tokens[16:32])).digest()
    assert block_hashes(tokens) == [first, second]


def test_block_hashes_extend_the_hashes_a_prefix_already_has():
    """A finished row's store hashes only the blocks past those its prompt's lookup
    hashed (``known``): the chain is the one hashing every block gives, digests
    included, and known hashes past the tokens' full blocks are not kept."""
    import numpy as np

    tokens = [(7 * i) % 251 for i in range(100)]
    digests = {20: b"image-a", 70: b"image-b"}
    whole = block_hashes(tokens, None, digests)
    for k in (0, 15, 16, 47, 64, 99, 100):
        known = block_hashes(tokens[:k], None, digests)
        assert block_hashes(tokens, None, digests, known) == whole, k
    assert block_hashes(tokens, 40, digests, whole) == whole[:2]
    assert block_hashes(tuple(np.array(tokens, dtype=np.int64))) == block_hashes(tokens)


def test_an_insert_given_its_prompts_hashes_is_the_entry_hashing_gives():
    from mlxcel.engine.cache.entries import prompt_hashes

    cache, again = PromptCache(capacity_bytes=1 << 20), PromptCache(capacity_bytes=1 << 20)
    prompt = list(range(50))
    known = prompt_hashes(prompt)
    assert len(known) == 3 and cache.lookup(prompt, hashes=known) is None
    assert cache.insert(prompt + [7] * 20, kv(70), prompt_len=50, known=known)
    assert again.insert(prompt + [7] * 20, kv(70), prompt_len=50)
    mine, = cache._entries.values()
    theirs, = again._entries.values()
    assert mine.hashes == theirs.hashes == block_hashes(prompt + [7] * 20)
    assert cache.lookup(prompt + [7] * 20 + [1], hashes=prompt_hashes(
        prompt + [7] * 20 + [1])).n == 64


def test_longest_prefix_hit_leaves_one_token_to_compute():
    cache = PromptCache(capacity_bytes=1 << 20)
    tokens = list(range(50))
    assert cache.insert(tokens, kv(50))
    hit = cache.lookup(tokens + [1, 2, 3])
    entry, n = hit.entry, hit.n
    assert n == 48 and entry.length == 48
    keys, values = entry.payload.keys, entry.payload.values  # PrefillJob slices the part a row reuses
    assert keys[0].shape == (1, 2, 48, 4) and values[1].shape == (1, 2, 48, 4)
    assert cache.lookup(tokens[:48]).n == 32  # 48 tokens: at most 47 may come from cache
    assert cache.lookup(tokens[:20] + [999] * 30).n == 16
    assert cache.lookup([5] * 60) is None
    s = cache.stats()
    assert (s["lookups"], s["hits"], s["hit_rate"]) == (4, 3, 0.75)


def test_lru_eviction_by_bytes_and_entries():
    per_token = LAYERS * 2 * (2 * 4 * 4)  # layers * (K+V) * heads*dim*float32
    cache = PromptCache(capacity_bytes=per_token * 32 * 2, max_entries=10)
    first, second, third = ([i] * 32 for i in (1, 2, 3))
    assert cache.insert(first, kv(32)) and cache.insert(second, kv(32))
    assert cache.lookup(first + [0]) is not None  # first is now the most recently used
    assert cache.insert(third, kv(32))
    s = cache.stats()
    assert s["entries"] == 2 and s["evictions_lru"] == 1 and s["bytes"] == per_token * 64
    assert cache.lookup(second + [0]) is None and cache.lookup(first + [0]) is not None
    small = PromptCache(capacity_bytes=1 << 20, max_entries=1)
    small.insert(first, kv(32))
    small.insert(second, kv(32))
    assert small.stats()["entries"] == 1 and small.stats()["evictions_lru"] == 1


def test_oversized_entries_are_rejected_and_counted():
    cache = PromptCache(capacity_bytes=100)
    assert not cache.insert([1] * 32, kv(32))
    s = cache.stats()
    assert s["rejections_oversized"] == 1 and s["entries"] == 0 and s["bytes"] == 0


def test_ttl_eviction():
    cache = PromptCache(capacity_bytes=1 << 20, ttl_s=0.05)
    cache.insert([1] * 32, kv(32))
    time.sleep(0.1)
    assert cache.lookup([1] * 40) is None
    assert cache.stats()["evictions_ttl"] == 1 and cache.stats()["entries"] == 0


def test_stats_keys_reset_and_disabled():
    cache = PromptCache(capacity_bytes=1 << 20)
    cache.insert(list(range(64)), kv(64))
    s = cache.stats()
    assert set(s) == {"enabled", "apc_enabled", "block_size", "hash", "entries", "bytes",
                      "capacity_bytes", "max_entries", "hits", "lookups", "hit_rate", "inserts",
                      "evictions_lru", "evictions_ttl", "rejections_oversized",
                      "total_blocks_stored", "unique_block_hashes", "apc_active_entries",
                      "reuse", "reuse_window", "checkpoints", "checkpoint_bytes",
                      "checkpoint_kinds", "hits_by_kind", "shrinks", "disk", "superseded"}
    assert (s["total_blocks_stored"], s["unique_block_hashes"], s["block_size"]) == (
        4, 4, BLOCK_SIZE)
    freed = cache.reset()
    assert freed == {"cleared": True, "freed_bytes": s["bytes"], "freed_entries": 1}
    assert cache.reset() == {"cleared": True, "freed_bytes": 0, "freed_entries": 0}
    off = PromptCache(capacity_bytes=1 << 20, enabled=False)
    assert not off.insert([1] * 32, kv(32)) and off.lookup([1] * 40) is None
    assert off.stats()["enabled"] is False and off.stats()["lookups"] == 0


def test_evicting_one_entry_keeps_the_shared_prefix_of_another():
    cache = PromptCache(capacity_bytes=1 << 20, max_entries=2)
    shared = list(range(32))
    cache.insert(shared + [1] * 16, kv(48))
    cache.insert(shared + [2] * 16, kv(48))
    cache.insert([9] * 32, kv(32))  # evicts the least recently used (the first)
    found = cache.lookup(shared + [3] * 16)
    assert found is not None and found.n == 32
    assert cache.stats()["unique_block_hashes"] == 3 + 2  # shared x2, [2]-block, [9] x2


def test_an_entry_extending_an_older_one_replaces_it():
    cache = PromptCache(capacity_bytes=1 << 20)
    turn1 = list(range(40))
    cache.insert(turn1, kv(40))
    cache.insert(turn1 + list(range(100, 140)), kv(80))
    s = cache.stats()
    assert s["entries"] == 1 and s["total_blocks_stored"] == s["unique_block_hashes"] == 5
    assert s["evictions_lru"] == 0
    assert cache.lookup(turn1 + [7]).n == 32


def test_stats_and_reset_wait_for_an_announced_insert():
    """The engine sends finish events before it stores their rows (``begin_inserts``):
    a reader of the stats waits for that store."""
    import threading

    cache = PromptCache(capacity_bytes=1 << 20)
    cache.begin_inserts()
    seen = []
    reader = threading.Thread(target=lambda: seen.append(cache.stats()["entries"]))
    reader.start()
    reader.join(0.3)
    assert reader.is_alive() and not seen  # still waiting for the store
    cache.insert(list(range(32)), kv(32))
    cache.end_inserts()
    reader.join(5)
    assert seen == [1]
    cache.begin_inserts()
    resetter = threading.Thread(target=lambda: seen.append(cache.reset()["freed_entries"]))
    resetter.start()
    resetter.join(0.3)
    assert resetter.is_alive()
    cache.insert(list(range(100, 132)), kv(32))
    cache.end_inserts()
    resetter.join(5)
    assert seen == [1, 2] and cache.stats()["entries"] == 0


def test_finish_events_go_out_before_the_store(path):
    from apphelpers import BASE
    from mlxcel.testing.engine import run_until_done, submit, worker_for

    worker = worker_for(path, cache=True)
    sinks = [submit(worker, BASE), submit(worker, BASE[:20] + [3, 4])]
    at_store = []
    store = worker._store

    def spy(keep):
        at_store.append(([s.done for s in sinks], worker.prompt_cache._inserting))
        store(keep)

    worker._store = spy
    run_until_done(worker, sinks)
    assert at_store == [([True, True], 1)]  # both finished in one step, events already out
    assert worker.prompt_cache._inserting == 0
    assert worker.prompt_cache.stats()["entries"] == 2


def test_a_content_digest_keeps_prompts_that_differ_in_an_image_apart():
    """Non-token inputs hash with their block: the same tokens with another image at
    position 20 share only the block before it, and nothing past it."""
    cache = PromptCache(capacity_bytes=1 << 20)
    tokens = list(range(64))
    assert cache.insert(tokens, kv(64), digests={20: b"image-a"})
    assert cache.lookup(tokens + [1], {20: b"image-a"}).n == 64
    assert cache.lookup(tokens + [1], {20: b"image-b"}).n == 16
    assert cache.lookup(tokens + [1]).n == 16  # the same tokens without the image
    assert block_hashes(tokens, None, {20: b"x"})[0] == block_hashes(tokens)[0]
    assert block_hashes(tokens, None, {20: b"x"})[1] != block_hashes(tokens)[1]


def test_token_positions_of_character_boundaries():
    from mlxcel.chat.cache_marks import token_positions

    spans = [(0, 5), (5, 6), (6, 12), (12, 13), (13, 20)]
    marks = [(6, "system"), (9, "turn"), (13, "turn"), (20, "turn")]
    # 9 falls inside a token; 20 is the text's end (no token after it)
    assert token_positions(spans, marks) == ((2, "system"), (4, "turn"))

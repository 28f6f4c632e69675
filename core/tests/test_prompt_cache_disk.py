"""The prompt cache's disk tier: entries evicted from memory (and every entry at shutdown)
go to disk and come back on a later hit, across restarts, with a cold prefill's logits;
files that are torn, corrupt or another model's are refused and deleted, and a directory
that cannot be written leaves the server serving from memory."""

from __future__ import annotations

import os
import threading

import pytest
from mlxcel.engine.cache.disk import DiskTier
from mlxcel.engine.cache.prompt_cache import PromptCache
from mlxcel.testing.checkpoint import cached_checkpoint
from mlxcel.testing.engine import engine_for
from test_prompt_checkpoints import LATER, PROMPT, generate, same_logits, tokens

SHAPES = {"recurrent": "qwen3_next", "kv-shared": "gemma4_text", "plain": "qwen3"}


def checkpoint(kind, cache_dir, **kw):
    return cached_checkpoint(SHAPES[kind], cache_dir=cache_dir, dtype="float32", **kw)


def engine(path, directory, memory=1 << 28, disk=1 << 30, parallel=2):
    cache = PromptCache(memory)
    cache.disk = DiskTier(directory, disk)
    return engine_for(path, parallel, cache=cache, chunk=32)


def settle(eng):
    """Wait for the stores of requests that finished (``stats`` does) and then for the
    disk writes their evictions queued."""
    eng.prompt_cache.stats()
    eng.prompt_cache.disk.flush()


def entry_files(directory):
    return sorted(p for p in os.listdir(directory) if p.endswith((".safetensors", ".json")))


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_a_restart_keeps_hits(kind, mlxcel_checkpoint_cache, tmp_path):
    path = checkpoint(kind, mlxcel_checkpoint_cache)
    later, reused, _ = LATER["next-turn"]
    cold = engine_for(path, 1, chunk=32)
    try:
        expected = generate(cold, later)[0]
    finally:
        cold.shutdown()
    first = engine(path, tmp_path)
    try:
        generate(first, PROMPT)
        assert first.prompt_cache.stats()["disk"]["enabled"]
    finally:
        first.shutdown()  # its entries go to disk
    assert entry_files(tmp_path)
    second = engine(path, tmp_path)
    try:
        assert second.prompt_cache.stats()["disk"]["entries"] >= 1
        ids, cached, tops = generate(second, later)[0]
        assert cached == (reused - reused % 16 if kind == "plain" else reused)
        assert ids == expected[0]
        same_logits(tops, expected[2])
        disk = second.prompt_cache.stats()["disk"]
        assert disk["hits"] == 1 and disk["loads"] == 1
    finally:
        second.shutdown()


def test_evicted_entries_come_back_from_disk(mlxcel_checkpoint_cache, tmp_path):
    """A memory budget of about one conversation: the others are written to disk as they
    are evicted, and each one's next turn still reuses its prefix."""
    path = checkpoint("recurrent", mlxcel_checkpoint_cache)
    convs = [tokens(60) + tokens(3) for _ in range(4)]
    probe = engine(path, tmp_path / "probe")
    try:
        generate(probe, convs[0], marks=())
        one = probe.prompt_cache.stats()["bytes"]
    finally:
        probe.shutdown()
    eng = engine(path, tmp_path / "tier", memory=int(one * 1.5))
    try:
        for conv in convs:
            generate(eng, conv, marks=())
        settle(eng)
        stats = eng.prompt_cache.stats()
        assert stats["evictions_lru"] >= 2 and stats["disk"]["writes"] >= 2
        _, cached, _ = generate(eng, convs[0] + tokens(10), marks=())[0]
        assert cached == len(convs[0]) - 1
        assert eng.prompt_cache.stats()["disk"]["hits"] == 1
    finally:
        eng.shutdown()


def _one_entry_on_disk(path, directory):
    eng = engine(path, directory)
    try:
        generate(eng, PROMPT)
    finally:
        eng.shutdown()
    data = [p for p in entry_files(directory) if p.endswith(".safetensors")]
    assert data
    return [directory / p for p in data]


@pytest.mark.parametrize("damage", ["truncated", "flipped", "other-model"])
def test_a_bad_file_is_refused_and_the_server_serves(damage, mlxcel_checkpoint_cache,
                                                     tmp_path):
    path = checkpoint("recurrent", mlxcel_checkpoint_cache)
    data = _one_entry_on_disk(path, tmp_path)
    if damage == "other-model":  # the same shapes, other weights: another fingerprint
        path = checkpoint("recurrent", mlxcel_checkpoint_cache, seed=7)
    for file in data:
        raw = bytearray(file.read_bytes())
        if damage == "truncated":
            file.write_bytes(raw[:len(raw) // 2])
        elif damage == "flipped":
            raw[-10] ^= 0xFF
            file.write_bytes(raw)
    eng = engine(path, tmp_path)
    try:
        ids, cached, _ = generate(eng, LATER["next-turn"][0])[0]
        assert cached == 0 and len(ids) == 3
        disk = eng.prompt_cache.stats()["disk"]
        assert disk["enabled"] and disk["hits"] == 0
        assert not any(f.exists() for f in data)  # deleted, never served
    finally:
        eng.shutdown()


def test_an_unwritable_dir_leaves_the_memory_tier(mlxcel_checkpoint_cache, tmp_path):
    """A directory that cannot be made (a file stands in its path, which stops root too)
    turns the tier off at start; the memory tier serves."""
    path = checkpoint("recurrent", mlxcel_checkpoint_cache)
    (tmp_path / "file").write_text("not a directory")
    eng = engine(path, tmp_path / "file" / "cache")
    try:
        stats = eng.prompt_cache.stats()["disk"]
        assert not stats["enabled"] and "not a writable directory" in stats["disabled_reason"]
        generate(eng, PROMPT)
        assert generate(eng, LATER["next-turn"][0])[0][1] == 90
    finally:
        eng.shutdown()


def test_a_failing_write_turns_the_tier_off_and_serving_goes_on(mlxcel_checkpoint_cache,
                                                                tmp_path):
    """The directory goes away after start (a full or lost disk): the first write fails,
    the tier turns off, and requests go on being served and cached in memory."""
    path = checkpoint("recurrent", mlxcel_checkpoint_cache)
    directory = tmp_path / "tier"
    eng = engine(path, directory, memory=40_000)  # about one entry: the next evicts it
    try:
        directory.rmdir()
        directory.write_text("now a file")
        generate(eng, PROMPT, marks=())
        generate(eng, tokens(40), marks=())
        settle(eng)
        stats = eng.prompt_cache.stats()["disk"]
        assert not stats["enabled"] and "failed" in stats["disabled_reason"]
        assert len(generate(eng, tokens(30), marks=())[0][0]) == 3
    finally:
        eng.shutdown()


def test_concurrent_stores_and_lookups(mlxcel_checkpoint_cache, tmp_path):
    """Rows finish, are evicted to disk and looked up while the writer thread writes:
    every request is served, and hits give what cold runs give."""
    path = checkpoint("kv-shared", mlxcel_checkpoint_cache)
    convs = [tokens(50) + tokens(3) for _ in range(6)]
    cold = engine_for(path, 1, cache=True, chunk=32)
    try:
        expected = [generate(cold, c + [9, 9, 9], marks=(), max_tokens=3)[0][0]
                    for c in convs]
        cold.prompt_cache.reset()
        generate(cold, convs[0], marks=())
        one = cold.prompt_cache.stats()["bytes"]
    finally:
        cold.shutdown()
    eng = engine(path, tmp_path, memory=int(one * 2.5), parallel=4)
    try:
        errors = []

        def client(i):
            try:
                generate(eng, convs[i], marks=())
                ids, _, _ = generate(eng, convs[i] + [9, 9, 9], marks=())[0]
                assert ids == expected[i]
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(convs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        settle(eng)
        stats = eng.prompt_cache.stats()
        assert stats["disk"]["writes"] >= 1 and stats["hits"] >= len(convs) // 2, stats
    finally:
        eng.shutdown()


def test_reset_clears_both_tiers(mlxcel_checkpoint_cache, tmp_path):
    path = checkpoint("recurrent", mlxcel_checkpoint_cache)
    _one_entry_on_disk(path, tmp_path)
    eng = engine(path, tmp_path)
    try:
        generate(eng, tokens(40))
        out = eng.prompt_cache.reset()
        assert out["freed_disk_files"] >= 2 and out["freed_entries"] == 1
        assert entry_files(tmp_path) == []
        assert eng.prompt_cache.stats()["disk"]["entries"] == 0
        assert generate(eng, LATER["next-turn"][0])[0][1] == 0
    finally:
        eng.shutdown()

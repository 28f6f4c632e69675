"""The prompt cache's entry files: real row caches of tiny models written, read back and
decoded on; every kind of damaged, stale or foreign file deleted; the model fingerprint."""

from __future__ import annotations

import copy
import json
import os
import sys
import time

import mlx.core as mx
import msgspec
import pytest
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    KVCache,
    RotatingKVCache,
    make_prompt_cache,
)
from mlxcel.engine.cache import files
from mlxcel.engine.cache.files import FileRefused
from mlxcel.engine.cache.kinds import Checkpoint, RowCaches, owned
from mlxcel.engine.cache.kvcache import KVRows

FP = "fingerprint-a"
TOKENS = [3 + (37 * i) % 400 for i in range(60)]  # within every test checkpoint's vocabulary
PROMPT, NEXT = TOKENS[:40], TOKENS[40:43]


@pytest.fixture(scope="module")
def models(mlxcel_checkpoint_cache):
    from mlx_lm.utils import load
    from mlxcel.testing.checkpoint import cached_checkpoint

    loaded = {}

    def get(shape: str, dtype: str = "float32"):
        if (shape, dtype) not in loaded:
            path = cached_checkpoint(shape, cache_dir=mlxcel_checkpoint_cache, dtype=dtype)
            loaded[shape, dtype] = load(str(path))[0]
        return loaded[shape, dtype]

    return get


def feed(model, caches, tokens, one_by_one=False):
    """Run ``tokens`` through ``model`` on ``caches``; the logits of each call's last one."""
    steps = [[t] for t in tokens] if one_by_one else [list(tokens)]
    out = []
    for step in steps:
        logits = model(mx.array([step]), cache=caches)[:, -1]
        mx.eval(logits, [c.state for c in caches])
        out.append(logits)
    return out


def same(a, b):
    return len(a) == len(b) and all(mx.array_equal(x, y).item() for x, y in zip(a, b, strict=True))


def kv(n, fill=1.0, dtype=mx.float32):
    return KVRows(mx.full((2, 1, 2, n, 4), fill, dtype), mx.full((2, 1, 2, n, 4), -fill, dtype))


def names(directory):
    return sorted(os.listdir(directory))


def scalars(cache):
    """A cache's state with its arrays left out (offsets, _idx, keep, max_size, ...)."""
    return [s for s in cache.state if not isinstance(s, (mx.array, list))]


@pytest.mark.parametrize("shape", ["qwen3", "gemma4_text", "qwen3_next"])
def test_row_caches_round_trip_to_the_same_logits(shape, models, tmp_path):
    model = models(shape)
    caches = make_prompt_cache(model)
    feed(model, caches, PROMPT[:37])
    feed(model, caches, PROMPT[37:], one_by_one=True)  # gemma4's window (16) wraps
    kinds_before = [(type(c), scalars(c)) for c in caches]
    assert shape != "gemma4_text" or any(type(c) is RotatingKVCache and c._idx < c.offset
                                         for c in caches)  # rotated: slots out of order
    header = files.write_entry(tmp_path, PROMPT, RowCaches(caches), [], FP)
    assert header.kind == "rows" and header.tokens == tuple(PROMPT)
    assert header.nbytes == (tmp_path / f"{header.key}.safetensors").stat().st_size

    original = feed(model, caches, NEXT, one_by_one=True)
    payload, checkpoints = files.read_entry(tmp_path, header, FP)
    assert checkpoints == [] and isinstance(payload, RowCaches)
    assert [(type(c), scalars(c)) for c in payload.caches] == kinds_before
    assert same(feed(model, payload.caches, NEXT, one_by_one=True), original)
    fresh = feed(model, make_prompt_cache(model), NEXT[:1])
    assert not same(fresh, original[:1])  # the cache is what the logits depend on


def test_checkpoint_with_none_layers_round_trips(models, tmp_path):
    model = models("qwen3_next")
    caches = make_prompt_cache(model)
    feed(model, caches, PROMPT[:20])
    point = Checkpoint.of(20, "turn", [owned(copy.copy(c)) for c in caches])
    assert type(point.caches[0]) is ArraysCache and point.caches[1] is None
    feed(model, caches, PROMPT[20:])
    row = RowCaches(caches)
    header = files.write_entry(tmp_path, PROMPT, row, [point], FP)
    assert header.checkpoints == ((20, "turn"),)

    payload, (loaded,) = files.read_entry(tmp_path, header, FP)
    assert (loaded.position, loaded.kind, loaded.caches[1]) == (20, "turn", None)
    assert loaded.nbytes == point.nbytes
    original = feed(model, row.at(point).caches, PROMPT[20:23], one_by_one=True)
    assert same(feed(model, payload.at(loaded).caches, PROMPT[20:23], one_by_one=True),
                original)


def test_kv_rows_round_trip_in_bfloat16(models, tmp_path):
    model = models("qwen3", "bfloat16")
    caches = make_prompt_cache(model)
    feed(model, caches, PROMPT)
    n = len(PROMPT)
    rows = KVRows(mx.stack([c.keys[..., :n, :] for c in caches]),
                  mx.stack([c.values[..., :n, :] for c in caches]))
    header = files.write_entry(tmp_path, PROMPT, rows, [], FP)
    loaded, _ = files.read_entry(tmp_path, header, FP)
    assert header.kind == "kv" and isinstance(loaded, KVRows)
    assert loaded.keys.dtype == mx.bfloat16 and loaded.keys.shape == rows.keys.shape

    def layers(r):
        out = []
        for keys, values in zip(r.keys, r.values, strict=True):
            c = KVCache()
            c.keys, c.values, c.offset = keys, values, n
            out.append(c)
        return out

    original = feed(model, layers(rows), NEXT, one_by_one=True)
    assert same(feed(model, layers(loaded), NEXT, one_by_one=True), original)


def test_nested_and_partial_states_round_trip_exactly(tmp_path):
    a = mx.arange(24, dtype=mx.bfloat16).reshape(1, 2, 3, 4)
    arrays = ArraysCache(3)
    arrays.cache = [a, None, a * 2]
    rotating = RotatingKVCache(max_size=8, keep=2)
    rotating.state = (a, a + 1, 11, 2, 8, 3)
    plain = KVCache()
    plain.state = (a, -a, 3)
    row = RowCaches([CacheList(plain, arrays), rotating, KVCache()])
    header = files.write_entry(tmp_path, TOKENS[:5], row, [], FP)
    payload, _ = files.read_entry(tmp_path, header, FP)
    nested, rot, empty = payload.caches

    assert type(nested) is CacheList and [type(c) for c in nested.caches] == [KVCache, ArraysCache]
    got_arrays = nested.caches[1]
    assert got_arrays.cache[1] is None and got_arrays.left_padding is None
    assert got_arrays.lengths is None
    assert mx.array_equal(got_arrays.cache[2], a * 2).item()
    assert got_arrays.cache[0].dtype == mx.bfloat16
    assert nested.caches[0].offset == 3 and mx.array_equal(nested.caches[0].values, -a).item()
    assert (rot.offset, rot.keep, rot.max_size, rot._idx) == (11, 2, 8, 3)
    assert mx.array_equal(rot.values, a + 1).item()
    assert type(empty) is KVCache and empty.keys is None and empty.offset == 0


def test_a_family_cache_class_is_not_written(tmp_path):
    class FamilyCache(KVCache):
        pass

    own = FamilyCache()
    own.state = (mx.zeros((1, 1, 2, 2)), mx.zeros((1, 1, 2, 2)), 2)
    with pytest.raises(FileRefused, match="FamilyCache"):
        files.write_entry(tmp_path, TOKENS[:2], RowCaches([own]), [], FP)
    assert names(tmp_path) == []


def test_entry_key_names_the_token_sequence():
    keys = {files.entry_key(t) for t in (TOKENS[:32], TOKENS[:33], TOKENS[:31], TOKENS[1:33],
                                         [], [0], TOKENS[:32] + [0])}
    assert len(keys) == 7 and all(len(k) == 64 for k in keys)
    assert files.entry_key(TOKENS[:33]) == files.entry_key(list(TOKENS[:33]))
    assert files.entry_key(tuple(TOKENS[:20])) == files.entry_key(TOKENS[:20])


def test_scan_keeps_valid_entries_and_deletes_the_rest(tmp_path):
    good = files.write_entry(tmp_path, TOKENS[:20], kv(20), [], FP)
    other = files.write_entry(tmp_path, TOKENS[:21], kv(21), [], "fingerprint-b")
    truncated = files.write_entry(tmp_path, TOKENS[:22], kv(22), [], FP)
    with open(tmp_path / f"{truncated.key}.safetensors", "r+b") as f:
        f.truncate(truncated.nbytes - 7)
    missing = files.write_entry(tmp_path, TOKENS[:23], kv(23), [], FP)
    (tmp_path / f"{missing.key}.safetensors").unlink()
    garbage = files.write_entry(tmp_path, TOKENS[:24], kv(24), [], FP)
    (tmp_path / f"{garbage.key}.json").write_text("{not json")
    moved = files.write_entry(tmp_path, TOKENS[:25], kv(25), [], FP)
    stranger = files.entry_key(TOKENS[:26])  # a header under another entry's name
    os.replace(tmp_path / f"{moved.key}.json", tmp_path / f"{stranger}.json")
    os.replace(tmp_path / f"{moved.key}.safetensors", tmp_path / f"{stranger}.safetensors")
    edited = files.write_entry(tmp_path, TOKENS[:28], kv(28), [], FP)  # tokens changed
    changed = msgspec.structs.replace(edited, tokens=(9, *edited.tokens[1:]))
    (tmp_path / f"{edited.key}.json").write_bytes(msgspec.json.encode(changed))
    orphan = files.entry_key(TOKENS[:27])
    mx.save_safetensors(str(tmp_path / f"{orphan}.safetensors"), {"x": mx.zeros(3)})
    theirs = f"{orphan}.{os.getpid() + 1}.00ff.tmp"
    (tmp_path / f"{theirs}.safetensors").write_bytes(b"half a file")
    (tmp_path / f"{theirs}.json").write_bytes(b"{")
    ours = f"{orphan}.{os.getpid()}.00ff.tmp.safetensors"  # a write of ours in flight
    (tmp_path / ours).write_bytes(b"x")
    (tmp_path / "notes.txt").write_text("not ours")
    for name in (f"{orphan}.safetensors", f"{theirs}.safetensors", f"{theirs}.json"):
        age(tmp_path / name)

    found = files.scan(tmp_path, FP)
    assert found == [good]
    assert other.key not in {h.key for h in found}
    assert names(tmp_path) == sorted([f"{good.key}.json", f"{good.key}.safetensors", ours,
                                      "notes.txt"])
    assert files.read_entry(tmp_path, found[0], FP)[0].keys.shape == (2, 1, 2, 20, 4)


def test_a_flipped_byte_is_refused_and_deleted(tmp_path):
    header = files.write_entry(tmp_path, TOKENS[:20], kv(20), [], FP)
    data = tmp_path / f"{header.key}.safetensors"
    raw = bytearray(data.read_bytes())
    raw[-3] ^= 0x10  # in the arrays, past the safetensors header: the size still matches
    data.write_bytes(bytes(raw))
    (found,) = files.scan(tmp_path, FP)
    with pytest.raises(FileRefused):
        files.read_entry(tmp_path, found, FP)
    assert names(tmp_path) == []


def test_read_refuses_another_fingerprint_and_a_missing_file(tmp_path):
    header = files.write_entry(tmp_path, TOKENS[:20], kv(20), [], FP)
    with pytest.raises(FileRefused):
        files.read_entry(tmp_path, header, "fingerprint-b")
    assert names(tmp_path) == []
    header = files.write_entry(tmp_path, TOKENS[:20], kv(20), [], FP)
    (tmp_path / f"{header.key}.safetensors").unlink()
    with pytest.raises(FileRefused):
        files.read_entry(tmp_path, header, FP)
    assert names(tmp_path) == []


def test_the_header_is_written_last(tmp_path, monkeypatch):
    """A crash between the data and the header leaves nothing ``scan`` returns, also where
    it replaced an entry whose old header would have named the new data."""
    files.write_entry(tmp_path, TOKENS[:30], kv(30, 1.0), [], FP)
    real = os.replace

    def crash_at_header(src, dst):
        if str(dst).endswith(".json"):
            raise OSError("disk full")
        real(src, dst)

    monkeypatch.setattr(os, "replace", crash_at_header)
    with pytest.raises(OSError):
        files.write_entry(tmp_path, TOKENS[:20], kv(20), [], FP)
    with pytest.raises(OSError):
        files.write_entry(tmp_path, TOKENS[:30], kv(30, 5.0), [], FP)
    monkeypatch.undo()
    keys = [files.entry_key(TOKENS[:n]) for n in (20, 30)]
    # data in place, no header, no tmp
    assert names(tmp_path) == sorted(f"{k}.safetensors" for k in keys)
    assert files.scan(tmp_path, FP) == []
    # another server on this directory may be between its data and its header: a young
    # header-less data file stays; a stale one is a crashed write
    assert names(tmp_path) == sorted(f"{k}.safetensors" for k in keys)
    for k in keys:
        age(tmp_path / f"{k}.safetensors")
    assert files.scan(tmp_path, FP) == []
    assert names(tmp_path) == []


def test_a_young_temporary_file_of_another_process_stays(tmp_path):
    theirs = tmp_path / f"{files.entry_key(TOKENS[:20])}.{os.getpid() + 1}.00ff.tmp.json"
    theirs.write_bytes(b"{")
    files.scan(tmp_path, FP)
    assert theirs.exists()
    age(theirs)
    files.scan(tmp_path, FP)
    assert not theirs.exists()


def age(path):
    """Make ``path`` look written longer ago than ``files.STALE_S``."""
    old = time.time() - files.STALE_S - 60
    os.utime(path, (old, old))


def test_rewriting_an_entry_replaces_it(tmp_path):
    files.write_entry(tmp_path, TOKENS[:20], kv(20, 1.0), [], FP)
    files.write_entry(tmp_path, TOKENS[:20], kv(20, 5.0), [], FP)
    (header,) = files.scan(tmp_path, FP)
    payload, _ = files.read_entry(tmp_path, header, FP)
    assert payload.keys[0, 0, 0, 0, 0].item() == 5.0 and len(names(tmp_path)) == 2


def _rewrite_metadata(directory, header, edit):
    """Rewrite an entry's data file with ``edit``-ed metadata and a header that matches it:
    a file that passes every check but the one under test."""
    path = directory / f"{header.key}.safetensors"
    arrays, metadata = mx.load(str(path), return_metadata=True)
    meta = json.loads(metadata[files.META_KEY])
    edit(meta)
    mx.save_safetensors(str(path), arrays, {files.META_KEY: json.dumps(meta)})
    raw = path.read_bytes()
    header = msgspec.structs.replace(header, nbytes=len(raw),
                                     checksum=files.checksum(raw))
    (directory / f"{header.key}.json").write_bytes(msgspec.json.encode(header))
    return header


@pytest.mark.parametrize("name", ["antigravity", "os.system", "TokenBuffer", "_BaseCache",
                                  "__builtins__", "mlx_lm.models.cache.KVCache", 7])
def test_an_unknown_class_is_refused_and_nothing_imported(name, tmp_path):
    plain = KVCache()
    plain.state = (mx.ones((1, 1, 2, 2)), mx.ones((1, 1, 2, 2)), 2)
    header = files.write_entry(tmp_path, TOKENS[:2], RowCaches([plain]), [], FP)
    header = _rewrite_metadata(tmp_path, header,
                               lambda meta: meta["payload"][0].update(cls=name))
    modules = set(sys.modules)
    with pytest.raises(FileRefused):
        files.read_entry(tmp_path, header, FP)
    assert set(sys.modules) == modules and "antigravity" not in sys.modules
    assert names(tmp_path) == []


def test_metadata_that_disagrees_with_the_header_is_refused(tmp_path):
    header = files.write_entry(tmp_path, TOKENS[:20], kv(20), [], FP)
    header = _rewrite_metadata(tmp_path, header, lambda meta: meta.update(kind="rows"))
    with pytest.raises(FileRefused):
        files.read_entry(tmp_path, header, FP)
    assert names(tmp_path) == []


def test_model_fingerprint(mlxcel_checkpoint_cache):
    from mlxcel.testing.checkpoint import cached_checkpoint

    first = cached_checkpoint("qwen3", cache_dir=mlxcel_checkpoint_cache, dtype="float32")
    second = cached_checkpoint("qwen3", cache_dir=mlxcel_checkpoint_cache, dtype="float32",
                               seed=1)
    parts = {"dtype": "float32", "family": "core 1", "layout": "rows"}
    fp = files.model_fingerprint(first, parts)
    assert len(fp) == 64 and fp == files.model_fingerprint(first, dict(parts))
    assert files.model_fingerprint(second, parts) != fp
    assert files.model_fingerprint(first, {**parts, "dtype": "bfloat16"}) != fp
    assert files.model_fingerprint(first, {}) != fp


def test_clear_removes_every_entry_file_and_reports_bytes(tmp_path):
    files.write_entry(tmp_path, TOKENS[:20], kv(20), [], FP)
    files.write_entry(tmp_path, TOKENS[:30], kv(30), [], FP)
    key = files.entry_key(TOKENS[:40])
    (tmp_path / f"{key}.{os.getpid()}.ab12.tmp.safetensors").write_bytes(b"12345")
    (tmp_path / "notes.txt").write_text("not ours")
    ours = [p for p in tmp_path.iterdir() if p.name != "notes.txt"]
    expected = (len(ours), sum(p.stat().st_size for p in ours))
    assert expected[0] == 5 and files.clear(tmp_path) == expected
    assert names(tmp_path) == ["notes.txt"]
    assert files.clear(tmp_path) == (0, 0) and files.clear(tmp_path / "absent") == (0, 0)


def test_scan_lists_the_oldest_first(tmp_path):
    prompts = sorted((TOKENS[:n] for n in (17, 18, 19)), key=files.entry_key, reverse=True)
    written = [files.write_entry(tmp_path, p, kv(len(p)), [], FP).key for p in prompts]
    assert written != sorted(written)  # the files' names alone would list them otherwise
    assert [h.key for h in files.scan(tmp_path, FP)] == written

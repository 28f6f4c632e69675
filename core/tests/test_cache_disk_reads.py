"""How a disk-tier hit is read: its file's checksum (a CRC-32 per chunk, checked by several
threads) still refuses a byte flipped anywhere, the tensors' data included; the threaded
read (the CUDA path) gives the arrays MLX's own load gives; the tier asks for threads
where the backend says so."""

from __future__ import annotations

import json
import os
import struct
import zlib

import mlx.core as mx
import msgspec
import pytest
from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, RotatingKVCache
from mlxcel.engine.cache import checksums, files
from mlxcel.engine.cache.disk import DiskTier
from mlxcel.engine.cache.files import FileRefused
from mlxcel.engine.cache.kinds import Checkpoint, RowCaches
from mlxcel.engine.cache.kvcache import KVRows

FP = "fingerprint-a"
TOKENS = [3 + (37 * i) % 400 for i in range(300)]


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 4 KiB, so that a test's file spans many of them and several threads."""
    monkeypatch.setattr(checksums, "CHUNK", 4096)
    monkeypatch.setattr(checksums, "PIECE", 1000)  # a chunk is read in several pieces


def rows(n: int = 96) -> RowCaches:
    """A row of every cache class a file stores, in two dtypes, with distinct values."""
    def ramp(*shape, dtype=mx.float32, at=0.0):
        size = 1
        for d in shape:
            size *= d
        return (mx.arange(size, dtype=mx.float32).reshape(shape) / 7 + at).astype(dtype)

    plain = KVCache()
    plain.state = (ramp(1, 2, n, 8, dtype=mx.bfloat16), ramp(1, 2, n, 8, at=-3.0), n)
    rotating = RotatingKVCache(max_size=32, keep=2)
    rotating.state = (ramp(1, 2, 32, 8, at=1.0), ramp(1, 2, 32, 8, at=2.0), n, 2, 32, 7)
    arrays = ArraysCache(2)
    arrays.cache = [ramp(1, 3, 5, dtype=mx.float16), None]
    return RowCaches([plain, CacheList(rotating, arrays)])


def leaves(row: RowCaches) -> list[mx.array]:
    out = []
    for cache in row.caches:
        for inner in getattr(cache, "caches", [cache]):
            out += [a for a in inner.state if isinstance(a, mx.array)]
    return out


def tensor_offsets(path) -> dict[str, tuple[int, int]]:
    """Each tensor's (start, end) in the file, from its safetensors header."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    return {name: (8 + length + a, 8 + length + b) for name, (a, b) in
            ((k, v["data_offsets"]) for k, v in header.items() if k != "__metadata__")}


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("chunked", [False, True])
def test_a_byte_flipped_inside_a_tensor_is_refused(threads, chunked, request, tmp_path):
    """A byte in the middle of the largest tensor's data, far from the file's ends and in
    a chunk of its own when chunks are small: scan keeps the file (same size, valid
    header), the read refuses and deletes it."""
    if chunked:
        request.getfixturevalue("small_chunks")
    header = files.write_entry(tmp_path, TOKENS[:200], rows(200), [], FP)
    path = tmp_path / f"{header.key}.safetensors"
    start, end = max(tensor_offsets(path).values(), key=lambda se: se[1] - se[0])
    middle = (start + end) // 2
    assert not chunked or (middle // checksums.CHUNK not in (0, (header.nbytes - 1)
                                                            // checksums.CHUNK))
    raw = bytearray(path.read_bytes())
    raw[middle] ^= 0x01
    path.write_bytes(bytes(raw))
    (found,) = files.scan(tmp_path, FP)
    with pytest.raises(FileRefused):
        files.read_entry(tmp_path, found, FP, threads)
    assert os.listdir(tmp_path) == []


def test_a_checksum_of_the_older_whole_file_scheme_is_deleted_by_scan(tmp_path):
    header = files.write_entry(tmp_path, TOKENS[:20], rows(20), [], FP)
    data = (tmp_path / f"{header.key}.safetensors").read_bytes()
    old = msgspec.structs.replace(header, checksum=f"crc32:{zlib.crc32(data):08x}")
    (tmp_path / f"{header.key}.json").write_bytes(msgspec.json.encode(old))
    assert files.scan(tmp_path, FP) == [] and os.listdir(tmp_path) == []


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 3 * 4096 + 5])
@pytest.mark.parametrize("threads", [1, 3])
def test_a_file_checksum_is_its_bytes_checksum_per_chunk(size, threads, small_chunks, tmp_path):
    data = os.urandom(size)
    path = tmp_path / "f"
    path.write_bytes(data)
    got_size, value = checksums.file_checksum(path, threads)
    expected = [zlib.crc32(data[i:i + 4096]) for i in range(0, max(size, 1), 4096)]
    assert got_size == size
    assert value == "crc32/4096:" + "".join(f"{c:08x}" for c in expected)
    assert value == checksums.data_checksum(data)
    flipped = bytearray(data or b"\0")
    flipped[-1] ^= 0x80
    path.write_bytes(bytes(flipped))
    assert checksums.file_checksum(path, threads)[1] != checksums.data_checksum(data or b"\0")


def test_a_file_cut_short_while_read_gives_the_size_it_had(small_chunks, tmp_path):
    path = tmp_path / "f"
    path.write_bytes(os.urandom(3000))
    fd = os.open(path, os.O_RDONLY)
    try:
        crc, got = checksums._chunk(fd, bytearray(1000), 0, 4096)
    finally:
        os.close(fd)
    assert got == 3000 and crc == zlib.crc32(path.read_bytes())


@pytest.mark.parametrize("threads", [2, 5])
def test_the_threaded_read_gives_the_arrays_of_mlx_load(threads, small_chunks, tmp_path):
    row = rows()
    point = Checkpoint(64, "turn", [None, CacheList(*row.caches[1].caches)])
    header = files.write_entry(tmp_path, TOKENS[:96], row, [point], FP)
    plain, (plain_point,) = files.read_entry(tmp_path, header, FP, threads=1)
    threaded, (threaded_point,) = files.read_entry(tmp_path, header, FP, threads=threads)
    written = leaves(row)
    for got in (leaves(plain), leaves(threaded)):
        assert [(a.dtype, a.shape) for a in got] == [(a.dtype, a.shape) for a in written]
        assert all(mx.array_equal(a, b).item() for a, b in zip(got, written, strict=True))
    assert [type(c) for c in threaded.caches] == [type(c) for c in plain.caches]
    assert threaded.caches[1].caches[0].state[2:] == plain.caches[1].caches[0].state[2:]
    assert (threaded_point.position, threaded_point.caches[0]) == (64, None)
    assert mx.array_equal(threaded_point.caches[1].caches[1].cache[0],
                          plain_point.caches[1].caches[1].cache[0]).item()


def test_a_threaded_read_of_a_damaged_file_is_refused(small_chunks, tmp_path):
    header = files.write_entry(tmp_path, TOKENS[:20], KVRows(mx.ones((2, 1, 2, 20, 4)),
                                                            mx.zeros((2, 1, 2, 20, 4))), [], FP)
    path = tmp_path / f"{header.key}.safetensors"
    with open(path, "r+b") as f:
        f.truncate(header.nbytes - 100)
    with pytest.raises(FileRefused):
        files.read_entry(tmp_path, header, FP, threads=3)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("backend_threads", [1, 8])
def test_the_tier_reads_with_the_backends_threads(backend_threads, monkeypatch, tmp_path):
    """The tier takes the weights' read threads (8 on CUDA, 1 elsewhere) unless set, and a
    hit goes through the threaded reader exactly when they are above 1."""
    from mlxcel import backend

    monkeypatch.setattr(backend, "weight_read_threads", lambda: backend_threads)
    calls = []
    real = files.read_weights
    monkeypatch.setattr(files, "read_weights",
                        lambda *a, **kw: calls.append(a[1]) or real(*a, **kw))
    tier = DiskTier(tmp_path, 1 << 30)
    tier.open(FP)
    try:
        assert tier.read_threads == backend_threads
        header = files.write_entry(tmp_path, TOKENS[:20], rows(20), [], FP)
        with tier.lock:
            tier._index(header)
            stub = tier.stub(header.key)
        payload, _ = tier.load(stub)
        assert all(mx.array_equal(a, b).item()
                   for a, b in zip(leaves(payload), leaves(rows(20)), strict=True))
        assert calls == ([backend_threads] if backend_threads > 1 else [])
    finally:
        tier.clear()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_repeated_threaded_reads_make_no_new_threads(tmp_path):
    """A hit reads on kept reader threads: after the first read, more reads start no
    thread (an MLX stream made per read would keep threads of its own for good)."""
    header = files.write_entry(tmp_path, TOKENS[:20], rows(20), [], FP)
    files.read_entry(tmp_path, header, FP, threads=3)
    before = len(os.listdir(f"/proc/{os.getpid()}/task"))
    for _ in range(5):
        files.read_entry(tmp_path, header, FP, threads=3)
    assert len(os.listdir(f"/proc/{os.getpid()}/task")) == before


def _file(tmp_path, size=5 * 4096 + 17):
    data = bytearray(os.urandom(size))
    path = tmp_path / "f"
    path.write_bytes(bytes(data))
    return path, data, checksums.data_checksum(bytes(data))


@pytest.mark.parametrize("flip", [10, 4096 + 7, 5 * 4096 + 16])
def test_verify_while_checks_the_head_before_work_and_the_rest_before_returning(
        flip, small_chunks, tmp_path):
    """The head (the first 100 bytes: chunk 0) is checked before ``work`` runs; any other
    chunk while it runs, and its result is never returned from a file that differs."""
    path, data, value = _file(tmp_path)
    calls = []
    assert checksums.verify_while(path, value, len(data), 100, lambda: calls.append(1) or 7,
                                  threads=3) == 7
    data[flip] ^= 0x04
    path.write_bytes(bytes(data))
    with pytest.raises(checksums.Mismatch):
        checksums.verify_while(path, value, len(data), 100, lambda: calls.append(2), threads=3)
    assert calls == ([1] if flip < 4096 else [1, 2])


def test_verify_while_checks_everything_first_for_a_head_past_the_end(small_chunks, tmp_path):
    """A damaged length field (a head as long as the file or longer) is checked whole
    before anything parses it."""
    path, data, value = _file(tmp_path)
    data[-1] ^= 0x04
    path.write_bytes(bytes(data))
    calls = []
    with pytest.raises(checksums.Mismatch):
        checksums.verify_while(path, value, len(data), 1 << 60, lambda: calls.append(1))
    assert calls == []


def test_verify_while_refuses_another_size_or_scheme_and_keeps_works_error(small_chunks,
                                                                          tmp_path):
    path, data, value = _file(tmp_path)
    for size, other in ((len(data) - 1, value), (len(data), "crc32:00000000"),
                        (len(data), value[:-8])):
        with pytest.raises(checksums.Mismatch):
            checksums.verify_while(path, other, size, 8, lambda: None)

    def fails():
        raise RuntimeError("cannot parse")

    with pytest.raises(RuntimeError, match="cannot parse"):
        checksums.verify_while(path, value, len(data), 8, fails)
    data[-1] ^= 0x04
    path.write_bytes(bytes(data))
    with pytest.raises(checksums.Mismatch):  # a damaged file's error is the damage
        checksums.verify_while(path, value, len(data), 8, fails)

"""Where does a prompt-cache disk hit's time go, phase by phase, for a large entry? (issue #29:
a 0.8 GB entry loaded back after a restart took most of a warm turn on the H100.)

Builds one entry of ``--layers`` mlx-lm ``KVCache`` layers, each keys and values of
(1, 2, ``--tokens``, 256) bfloat16 (the KV shape of Gemma-4-E4B's full-attention layers),
writes it with ``mlxcel.engine.cache.files.write_entry`` into a temporary directory and
times, ``--repeats`` times each, with the file in the page cache (``warm``: a restart on
the same machine) and dropped from it (``cold``: ``posix_fadvise(DONTNEED)``):

- ``checks``: the header's checks before the file is touched (its key from its tokens);
- ``checksum``: ``checksums.file_checksum``, the tier's check, threaded;
- ``checksum_1t``: the same on one thread;
- ``whole_crc``: one CRC-32 over the whole file read in 1 MiB pieces on one thread (the
  check the tier ran before the per-chunk checksums, for comparison);
- ``parse``: ``mx.load`` of the file, lazy (its safetensors header);
- ``load``: evaluating those arrays: MLX's own load;
- ``load_threads``: ``safetensors_reads.read_weights`` with ``--threads`` threads (the CUDA
  path);
- ``rebuild``: the cache objects around the arrays (``from_state``);
- ``read_entry``: the whole ``files.read_entry`` with MLX's own load (Metal, CPU): the
  header checked, then the checksum of the tensors' chunks while they load;
- ``read_entry_threads``: the same with ``--threads`` threads (CUDA).

Before the per-chunk checksums, a hit cost about ``checks + whole_crc + parse + load +
rebuild`` (the checksum, then the load); ``read_entry`` is what it costs now.

It checks that the threaded read gave the arrays MLX's load gave (``same_arrays``), and
times stdlib hashes over 64 MiB in memory, on one thread and on every core.
Prints medians in ms (``--json OUT`` writes every sample).

    .venv/bin/python bench/probes/disk_load.py --layers 12 --tokens 32768 --repeats 5
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
import zlib
from pathlib import Path

import mlx.core as mx
import msgspec
from mlx_lm.models.cache import KVCache
from mlxcel.engine.cache import checksums, files
from mlxcel.engine.cache.kinds import RowCaches
from mlxcel.model.safetensors_reads import read_weights

HASHES = {"crc32": zlib.crc32, "adler32": zlib.adler32,
          "sha256": lambda b: hashlib.sha256(b).digest(),
          "sha1": lambda b: hashlib.sha1(b).digest(),
          "blake2b": lambda b: hashlib.blake2b(b).digest(),
          "md5": lambda b: hashlib.md5(b).digest()}


def timed(samples: dict, name: str, fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    samples.setdefault(name, []).append((time.perf_counter() - start) * 1000)
    return out


def whole_crc(path: Path) -> int:
    crc, piece = 0, bytearray(1 << 20)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(piece):
            crc = zlib.crc32(memoryview(piece)[:n], crc)
    return crc


def page_cache(path: Path, warm: bool) -> None:
    if warm:
        whole_crc(path)
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def build(directory: Path, layers: int, tokens: int) -> files.FileHeader:
    caches = []
    for _ in range(layers):
        cache = KVCache()
        keys = mx.random.normal((1, 2, tokens, 256)).astype(mx.bfloat16)
        cache.state = (keys, keys + 1, tokens)
        caches.append(cache)
    mx.eval([c.state for c in caches])
    ids = [3 + (37 * i) % 400 for i in range(tokens)]
    return files.write_entry(directory, ids, RowCaches(caches), [], "probe")


def phases(directory: Path, header: files.FileHeader, threads: int, warm: bool,
           samples: dict) -> None:
    path = directory / f"{header.key}.safetensors"
    for name, fn in (("checksum", checksums.file_checksum),
                     ("checksum_1t", lambda p: checksums.file_checksum(p, 1)),
                     ("whole_crc", whole_crc)):
        page_cache(path, warm)
        timed(samples, name, fn, path)
    timed(samples, "checks", files.entry_key, header.tokens)
    page_cache(path, warm)
    arrays, meta = timed(samples, "parse", lambda: mx.load(str(path), return_metadata=True))
    timed(samples, "load", mx.eval, list(arrays.values()))
    timed(samples, "rebuild", files._rebuild, header, arrays,
          msgspec.json.decode(meta[files.META_KEY]))
    del arrays
    page_cache(path, warm)
    timed(samples, "load_threads", read_weights, [path], threads)
    for name, n in (("read_entry", 1), ("read_entry_threads", threads)):
        page_cache(path, warm)
        timed(samples, name, files.read_entry, directory, header, "probe", n)


def same_arrays(directory: Path, header: files.FileHeader, threads: int) -> bool:
    plain = files.read_entry(directory, header, "probe", 1)[0].caches
    threaded = files.read_entry(directory, header, "probe", threads)[0].caches
    return all(mx.array_equal(a, b).item() for p, t in zip(plain, threaded, strict=True)
               for a, b in zip(p.state[:2], t.state[:2], strict=True))


def hash_speeds() -> dict[str, float]:
    """GB/s of each stdlib hash over 64 MiB in memory: one thread, then one per core."""
    data = os.urandom(64 << 20)
    view, cores, out = memoryview(data), os.cpu_count() or 1, {}
    for name, fn in HASHES.items():
        for n in sorted({1, cores}):
            part = len(data) // n
            runs = []
            for _ in range(3):
                pool = [threading.Thread(target=fn, args=(view[i * part:(i + 1) * part],))
                        for i in range(n)]
                start = time.perf_counter()
                for t in pool:
                    t.start()
                for t in pool:
                    t.join()
                runs.append(time.perf_counter() - start)
            out[f"{name} x{n}"] = round(len(data) / statistics.median(runs) / 1e9, 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="disk_load."))
    try:
        start = time.perf_counter()
        header = build(directory, args.layers, args.tokens)
        result = {"device": str(mx.default_device()), "cores": os.cpu_count(),
                  "nbytes": header.nbytes, "threads": args.threads,
                  "write_entry_ms": round((time.perf_counter() - start) * 1000, 1),
                  "samples": {}}
        for warm in (True, False):
            samples = result["samples"]["warm" if warm else "cold"] = {}
            for _ in range(args.repeats):
                phases(directory, header, args.threads, warm, samples)
        result["same_arrays"] = same_arrays(directory, header, args.threads)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    result["hash_gbps"] = hash_speeds()
    print(f"{result['device']}, {result['cores']} cores, entry {header.nbytes / 1e6:.0f} MB, "
          f"threads {args.threads}; medians of {args.repeats} (ms)")
    for state, samples in result["samples"].items():
        for name, values in samples.items():
            print(f"  {state:4s} {name:12s} {statistics.median(values):9.1f}")
    print("same arrays:", result["same_arrays"])
    print("hash GB/s:", json.dumps(result["hash_gbps"]))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

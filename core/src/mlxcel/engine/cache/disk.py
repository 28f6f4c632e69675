"""The prompt cache's disk tier (``--cache-disk-dir``, ``--cache-disk-bytes``): entries
evicted from memory are written there (``mlxcel.engine.cache.files``), and a later lookup
that finds its best match on disk loads it back, across server restarts.

* The index (headers: tokens, block hashes, checkpoint positions) lives in memory; it is
  read from the directory when the model is loaded, so only files written for this model
  (its fingerprint) are ever found, and any other, torn or corrupt file is deleted.
* Writes run on a thread of their own, off the engine's loop; the arrays they write are
  computed before they are queued. A write queue that is full drops the entry (the memory
  tier already let it go).
* The tier holds at most ``capacity_bytes``; the least recently used files go first.
* A hit's arrays are read with ``read_threads`` threads: the backend's choice for weights
  (``mlxcel.backend.weight_read_threads``: several on CUDA, MLX's own load elsewhere),
  unless set before the tier is opened.
* Any failure to write (a full disk, a directory that is not writable) logs one warning
  and turns the tier off; the server goes on with the memory tier. A file that fails its
  checks when read is deleted and counted as ``refused``: the lookup is a miss.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import structlog

from mlxcel.engine.cache.entries import CacheEntry, block_hashes
from mlxcel.engine.cache.kinds import stored_arrays

log = structlog.get_logger("mlxcel.engine")
QUEUE = 64  # entries waiting to be written


def _files() -> Any:
    """The entry file format (imported with MLX, once a tier is opened)."""
    from mlxcel.engine.cache import files

    return files


class Mark:
    """A checkpoint as the index knows it: where, and of which kind (its state is on disk)."""

    nbytes = 0

    def __init__(self, position: int, kind: str) -> None:
        self.position, self.kind = position, kind


class DiskTier:
    def __init__(self, directory: str | Path, capacity_bytes: int) -> None:
        self.directory = Path(directory).expanduser()
        self.capacity_bytes = capacity_bytes
        self.enabled = False
        self.disabled_reason: str | None = "not opened (no model loaded yet)"
        self.fingerprint = ""
        self._entries: OrderedDict[str, CacheEntry] = OrderedDict()  # key -> stub, LRU
        self.holders: dict[bytes, list[str]] = {}  # block hash -> keys
        self.bytes = 0
        self.counters = dict.fromkeys(("hits", "writes", "loads", "refused", "evictions",
                                       "dropped"), 0)
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue(QUEUE)
        self._generation = 0  # bumped by clear(): a write queued before it is discarded
        self._writer: threading.Thread | None = None
        self.read_threads: int | None = None  # None: the backend's choice, when opened

    # -- set-up (engine thread) -----------------------------------------------------------------
    def open(self, fingerprint: str) -> None:
        """Index the directory's files of this model; on any error the tier stays off."""
        self.fingerprint = fingerprint
        if self.read_threads is None:
            from mlxcel.backend import weight_read_threads

            self.read_threads = weight_read_threads()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            probe = self.directory / f".probe.{id(self)}"
            probe.write_bytes(b"")
            probe.unlink()
            headers = _files().scan(self.directory, fingerprint)
        except OSError as exc:
            self._off(f"{self.directory} is not a writable directory: {exc}")
            return
        with self._lock:
            for header in headers:
                self._index(header)
            self._trim()
        self.enabled, self.disabled_reason = True, None
        self._writer = threading.Thread(target=self._write_loop, name="mlxcel-cache-disk",
                                        daemon=True)
        self._writer.start()
        log.info("prompt_cache_disk", dir=str(self.directory), entries=len(self._entries),
                 bytes=self.bytes)

    def _off(self, reason: str) -> None:
        if self.enabled or self.disabled_reason != reason:
            log.warning("prompt_cache_disk_off", reason=reason)
        self.enabled, self.disabled_reason = False, reason

    # -- index (lock held) ------------------------------------------------------------------
    def _index(self, header: Any) -> None:
        stub = CacheEntry(-1, header.tokens, block_hashes(header.tokens), None,
                          [Mark(p, k) for p, k in header.checkpoints])
        stub.disk = header
        old = self._entries.pop(header.key, None)
        if old is not None:
            self.bytes -= old.disk.nbytes
            self._unhold(old)
        self._entries[header.key] = stub
        self.bytes += header.nbytes
        for h in stub.hashes:
            self.holders.setdefault(h, []).append(header.key)

    def _unhold(self, stub: CacheEntry) -> None:
        for h in stub.hashes:
            keys = self.holders.get(h)
            if keys and stub.disk.key in keys:
                keys.remove(stub.disk.key)
                if not keys:
                    del self.holders[h]

    def _trim(self) -> None:
        while self._entries and self.bytes > self.capacity_bytes:
            _, stub = self._entries.popitem(last=False)
            self.bytes -= stub.disk.nbytes
            self._unhold(stub)
            _files().delete(self.directory, stub.disk)
            self.counters["evictions"] += 1

    def stub(self, key: str) -> CacheEntry:
        """(the caller holds ``lock``) The indexed entry of ``key``."""
        return self._entries[key]

    @property
    def lock(self) -> threading.Lock:
        return self._lock

    # -- the engine thread -----------------------------------------------------------------
    def put(self, entry: CacheEntry, wait: float = 0.0) -> None:
        """Queue ``entry`` (evicted from memory) to be written, waiting at most ``wait`` s
        for room in the queue; its arrays are computed first, here."""
        if not self.enabled or entry.payload is None or entry.digests:
            return  # non-token inputs: a file's key holds tokens only
        import mlx.core as mx

        mx.eval(stored_arrays(entry.payload, entry.checkpoints))  # the writer only reads
        with self._lock:
            known = self._entries.get(_files().entry_key(entry.tokens))
            if known is not None and len(known.checkpoints) >= len(entry.checkpoints):
                self._entries.move_to_end(known.disk.key)
                return
            generation = self._generation
        try:
            self._queue.put((generation, entry.tokens, entry.payload,
                             list(entry.checkpoints)), block=wait > 0, timeout=wait or None)
        except queue.Full:
            self.counters["dropped"] += 1

    def load(self, stub: CacheEntry) -> tuple[Any, list[Any]] | None:
        """The payload and checkpoints of an indexed entry; None (and the file gone) when
        it fails its checks."""
        header = stub.disk
        try:
            payload, checkpoints = _files().read_entry(self.directory, header, self.fingerprint,
                                                       self.read_threads or 1)
        except (_files().FileRefused, OSError) as exc:
            log.warning("prompt_cache_disk_refused", key=header.key,
                        reason=getattr(exc, "reason", str(exc)))
            with self._lock:
                if self._entries.get(header.key) is stub:
                    del self._entries[header.key]
                    self.bytes -= header.nbytes
                    self._unhold(stub)
                self.counters["refused"] += 1
            _files().delete(self.directory, header)
            return None
        with self._lock:
            if header.key in self._entries:
                self._entries.move_to_end(header.key)
            self.counters["loads"] += 1
        return payload, checkpoints

    # -- the writer thread ------------------------------------------------------------------
    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                self._write(*item)
            finally:
                self._queue.task_done()

    def _write(self, generation: int, tokens: Any, payload: Any, checkpoints: Any) -> None:
        if not self.enabled or generation != self._generation:
            return
        try:
            header = _files().write_entry(self.directory, tokens, payload, checkpoints,
                                       self.fingerprint)
        except _files().FileRefused:
            self.counters["dropped"] += 1  # a cache kind this format does not store
            return
        except OSError as exc:
            self._off(f"writing to {self.directory} failed: {exc}")
            return
        with self._lock:
            if generation != self._generation:  # cleared while it was written
                _files().delete(self.directory, header)
                return
            self._index(header)
            self.counters["writes"] += 1
            self._trim()

    def flush(self, timeout: float = 30.0) -> None:
        """Wait (at most ``timeout`` s) until every queued write is on disk."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    # -- any thread --------------------------------------------------------------------------
    def clear(self) -> tuple[int, int]:
        """Delete every entry file (and any write queued before now)."""
        with self._lock:
            self._generation += 1
            self._entries.clear()
            self.holders.clear()
            self.bytes = 0
        try:
            return _files().clear(self.directory)
        except OSError:
            return 0, 0

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"enabled": self.enabled, "dir": str(self.directory),
                    "entries": len(self._entries), "bytes": self.bytes,
                    "capacity_bytes": self.capacity_bytes, **self.counters,
                    **({"disabled_reason": self.disabled_reason}
                       if not self.enabled and self.disabled_reason else {})}

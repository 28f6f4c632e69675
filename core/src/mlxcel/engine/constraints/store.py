"""Where compiled indexes are kept: a memory LRU and a directory, both bounded in bytes.

An index grows with the schema times the vocabulary (every position of a bounded string
is a state that allows most tokens), so one schema can take hundreds of MiB; a count of
entries would bound nothing. Both stores count the serialized size of each index, which
is what the disk holds and close to what memory holds.

A file starts with its own key (``MAGIC``, then one line of JSON: the backend's tag, a hash
of the constraint and the vocabulary's fingerprint) and is served only when that key is the
one asked for: a file copied or renamed over another schema's is a miss, never its index.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

MAGIC = b"mlxcel-constraint-index 1\n"


def file_key(backend_tag: str, cache_text: str, fingerprint: str) -> bytes:
    """The header line a file of this constraint and vocabulary starts with."""
    digest = hashlib.sha256(cache_text.encode()).hexdigest()
    return MAGIC + json.dumps({"backend": backend_tag, "constraint": digest,
                               "vocabulary": fingerprint}, sort_keys=True).encode() + b"\n"


def unpack(blob: bytes, key: bytes) -> bytes | None:
    """The index in ``blob`` when its header is ``key``, else None."""
    return blob[len(key):] if blob.startswith(key) else None


class MemoryStore:
    """Least-recently-used entries within ``max_bytes``; callers hold their own lock."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._bytes = 0

    def get(self, key: str) -> Any | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: str, value: Any, size: int) -> None:
        """Keep ``value``, dropping the least recently used beyond the budget (an entry
        larger than the whole budget is not kept)."""
        if key in self._entries:
            self._bytes -= self._entries.pop(key)[1]
        if size > self.max_bytes:
            return
        self._entries[key] = (value, size)
        self._bytes += size
        while self._bytes > self.max_bytes:
            _key, (_value, dropped) = self._entries.popitem(last=False)
            self._bytes -= dropped


class DiskStore:
    """One file per key under ``directory``, the least recently used pruned beyond
    ``max_bytes``. Every failure to read or write is a miss: a read-only or full disk
    costs a compile, nothing more."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.idx"

    def read(self, name: str) -> bytes | None:
        path = self.path(name)
        try:
            data = path.read_bytes()
            os.utime(path)  # recently used: pruned last
        except OSError:
            return None
        return data

    def write(self, name: str, *parts: bytes) -> None:
        """``parts`` one after the other, atomically (a crash leaves no torn file), then
        prune."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                for part in parts:
                    f.write(part)
            os.replace(tmp, self.path(name))
            self._prune()
        except OSError:
            return

    def _prune(self) -> None:
        files = [(p.stat(), p) for p in self.directory.glob("*.idx")]
        total = sum(st.st_size for st, _p in files)
        for st, path in sorted(files, key=lambda f: f[0].st_mtime):
            if total <= self.max_bytes:
                break
            path.unlink(missing_ok=True)
            total -= st.st_size

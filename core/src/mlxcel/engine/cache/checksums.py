"""Checksums of the disk tier's entry files: one CRC-32 per ``CHUNK`` bytes of a file, so
that a large file is checked by several threads at once, and while it loads.

A loaded entry is checked on the hit's critical path: one CRC over the whole file runs on
one core, while CRCs of fixed chunks run on as many as there are (``zlib.crc32`` releases
the GIL on large buffers). Each thread reads its chunks with ``pread`` into a buffer of its
own, a ``PIECE`` at a time, and checksums each piece while it is still in the CPU's cache;
a memory map would skip that copy but turns a file truncated under it into a SIGBUS that
kills the server, where ``pread`` just comes up short.

``verify_while`` checks the chunks of a file's first bytes (where the caller's parser
reads) before the caller's work starts, and the other chunks while it runs: whatever the
work made of unchecked bytes is only returned once every chunk matched.

The value names its scheme and chunk size (``scheme()``, then 8 hex digits a chunk), so a
value of another scheme never matches: a file from before is refused, not misread.
"""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

CHUNK = 16 << 20  # bytes under one CRC: a few dozen for an entry of a long prompt
PIECE = 1 << 20  # bytes read at once, small enough to be checksummed from the cache
THREADS = 8  # at most; never more than the machine's cores
T = TypeVar("T")


class Mismatch(ValueError):
    """A file that differs from its checksum (its size, or a chunk's bytes)."""


def scheme() -> str:
    """What every checksum of this scheme and chunk size starts with."""
    return f"crc32/{CHUNK}:"


def _named(crcs: list[int]) -> str:
    return scheme() + "".join(f"{c:08x}" for c in crcs)


def _chunks(size: int) -> int:
    return max(1, -(-size // CHUNK))


def data_checksum(data: bytes) -> str:
    """The checksum of ``data`` (a whole file's bytes)."""
    view = memoryview(data)
    return _named([zlib.crc32(view[i * CHUNK:(i + 1) * CHUNK]) for i in range(_chunks(len(data)))])


def file_checksum(path: Path, threads: int = THREADS) -> tuple[int, str]:
    """Size and checksum of the file at ``path``, its chunks read and checksummed by up to
    ``threads`` threads (no more than the cores). A file cut short while it is read gives
    the size it was read at; ``OSError`` (the file missing, unreadable) propagates."""
    size = path.stat().st_size
    done = _start(path, size, range(_chunks(size)), threads, background=False)()
    return sum(n for _, n in done), _named([crc for crc, _ in done])


def verify_while(path: Path, value: str, size: int, head: int, work: Callable[[], T],
                 threads: int = THREADS) -> T:
    """``work()``'s result, once the file at ``path`` was found to be ``size`` bytes whose
    checksum is ``value``. The chunks that hold its first ``head`` bytes are checked before
    ``work`` starts, the others on up to ``threads`` threads while it runs. ``Mismatch``
    where the file differs (raised once ``work`` ended, in place of whatever it raised);
    else ``work``'s own exception; ``OSError`` reading the file propagates."""
    expected = _parse(value)
    if expected is None or len(expected) != _chunks(size) or path.stat().st_size != size:
        raise Mismatch("size or scheme")
    first = min(len(expected), _chunks(max(head, 1)))
    if _start(path, size, range(first), threads, background=False)() != [(c, _length(size, i))
                                                      for i, c in enumerate(expected[:first])]:
        raise Mismatch("the chunks of the head")
    rest = _start(path, size, range(first, len(expected)), threads)
    try:
        result = work()
    finally:
        done = rest()  # raises the check's OSError, before any of work's
        if done != [(expected[i], _length(size, i)) for i in range(first, len(expected))]:
            raise Mismatch("a chunk's bytes")
    return result


def _parse(value: str) -> list[int] | None:
    """The CRCs of a checksum of this scheme, None for any other value."""
    digits = value[len(scheme()):]
    if not value.startswith(scheme()) or not digits or len(digits) % 8:
        return None
    try:
        return [int(digits[i:i + 8], 16) for i in range(0, len(digits), 8)]
    except ValueError:
        return None


def _length(size: int, index: int) -> int:
    return max(0, min(CHUNK, size - index * CHUNK))


def _start(path: Path, size: int, indices: Sequence[int], threads: int,
           background: bool = True) -> Callable[[], list[tuple[int, int]]]:
    """Start checksumming the chunks ``indices`` of ``path`` (``size`` bytes) on up to
    ``threads`` threads; the returned call waits for them and gives each chunk's (CRC,
    bytes read), or raises a thread's error. Work for one thread that the caller waits for
    at once (not ``background``) runs on the caller's thread: a thread started from a busy
    process waits for the GIL before it runs, which a small file's check would pay twice."""
    indices = list(indices)
    out: list[tuple[int, int]] = [(0, 0)] * len(indices)
    errors: list[BaseException] = []
    workers = max(1, min(threads, _cores(), len(indices)))

    def work(first: int) -> None:
        try:
            buffer = bytearray(max(1, min(PIECE, CHUNK, size)))
            with open(path, "rb", buffering=0) as f:
                for k in range(first, len(indices), workers):
                    i = indices[k]
                    out[k] = _chunk(f.fileno(), buffer, i * CHUNK, _length(size, i))
        except BaseException as exc:  # re-raised on the waiting thread
            errors.append(exc)

    inline = workers == 1 and not background
    if inline:
        work(0)
    pool = [threading.Thread(target=work, args=(k,), name=f"mlxcel-checksum-{k}", daemon=True)
            for k in range(0 if inline or not indices else workers)]
    for t in pool:
        t.start()

    def wait() -> list[tuple[int, int]]:
        for t in pool:
            t.join()
        if errors:
            raise errors[0]
        return out

    return wait


def _cores() -> int:
    """The cores this process may run on (a container's share, where it has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def _chunk(fd: int, buffer: bytearray, start: int, length: int) -> tuple[int, int]:
    """The CRC-32 of ``length`` bytes of ``fd`` from ``start``, read a ``PIECE`` at a time,
    and how many bytes there were (fewer where the file ends early)."""
    crc, view, done = 0, memoryview(buffer), 0
    while done < length:
        got = os.preadv(fd, [view[:min(len(buffer), length - done)]], start + done)
        if got <= 0:
            break
        crc = zlib.crc32(view[:got], crc)
        done += got
    return crc, done

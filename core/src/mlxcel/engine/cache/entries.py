"""What the prompt cache stores and finds: block hashes, entries and their checkpoints, hits.

A prompt is cut into blocks of 16 tokens; block ``i``'s hash is ``sha256(hash[i-1] +
block i)``, so one hash names a whole prefix. A block's bytes are its tokens and, for a
prompt with non-token inputs (an image in a vision prompt), the content digest of each input
that sits in the block (``Digests``: prompt position -> digest): two prompts that differ
only in an image never share the block that holds it, nor any block after.

An entry holds one sequence's cached state (a ``Stored``) for its first ``length`` tokens,
indexes every full block hash of them, and keeps its tokens, so that a later prompt's
exact shared length can be told past its last shared block. It may hold checkpoints
(``mlxcel.engine.cache.kinds.Checkpoint``): the state of the layers that cannot be cut
back, at positions a later prompt is likely to share (``CHECKPOINT_VALUE``).
"""

from __future__ import annotations

import hashlib
import sys
import time
from array import array
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

BLOCK_SIZE = 16
Digests = Mapping[int, bytes]  # prompt position -> content digest of a non-token input
NO_DIGESTS: Digests = {}

# Boundary kinds, most valuable first: what eviction keeps longest (the system + tools
# prefix every conversation and sub-agent of an agent shares outlives a one-off prompt's
# end). Larger is kept longer.
CHECKPOINT_VALUE = {"system": 4, "turn": 3, "prompt": 2, "interval": 1}


def block_hashes(tokens: Sequence[int], limit: int | None = None,
                 digests: Digests = NO_DIGESTS, known: Sequence[bytes] = ()) -> list[bytes]:
    """Chained sha256 of each full 16-token block (of the first ``limit`` tokens), each
    block's digests (``Digests``) included. ``known``: the hashes of the first blocks,
    already computed for these tokens (a finished row's prompt, hashed when it was looked
    up): only the blocks past them are hashed. A token is 4 bytes, unsigned
    little-endian; the tokens to hash are packed once and sliced, since an agent's prompt
    is tens of thousands of tokens and this runs on every lookup and store."""
    n = len(tokens) if limit is None else min(limit, len(tokens))
    full = n - n % BLOCK_SIZE
    out = list(known[:full // BLOCK_SIZE])
    first = len(out) * BLOCK_SIZE
    data, width = _pack(tokens[first:full]), 4 * BLOCK_SIZE
    prev = out[-1] if out else b""
    for start in range(first, full, BLOCK_SIZE):
        at = 4 * (start - first)
        block = data[at:at + width]
        if digests:
            block += b"".join(p.to_bytes(4, "little") + digests[p]
                              for p in sorted(digests) if start <= p < start + BLOCK_SIZE)
        prev = hashlib.sha256(prev + block).digest()
        out.append(prev)
    return out


def prompt_hashes(tokens: Sequence[int], digests: Digests = NO_DIGESTS) -> list[bytes]:
    """The block hashes a lookup of the prompt ``tokens`` reads: its full blocks before its
    last token, which is always computed. The engine keeps them with the sequence for its
    lookup and, once it ends, its store (``known``), so a turn hashes its prompt once."""
    return block_hashes(tokens, len(tokens) - 1, digests)


def _pack(tokens: Sequence[int]) -> bytes:
    """Token ids as 4-byte unsigned little-endian integers; ids of another integer type
    (NumPy's) are converted first where ``array`` refuses them."""
    try:
        packed = array("I", tokens)
    except TypeError:
        packed = array("I", [int(t) for t in tokens])
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


class Stored(Protocol):
    """One sequence's cached state for some tokens, in the form its engine path reuses."""

    nbytes: int

    def prefix(self, n: int) -> Stored:
        """The state of the first ``n`` tokens (only asked where the entry's rule allows)."""
        ...


class CacheEntry:
    """``payload`` for ``tokens`` (with their ``digests``), ``hashes`` of its full blocks,
    and its checkpoints, by position."""

    def __init__(self, entry_id: int, tokens: Sequence[int], hashes: list[bytes],
                 payload: Stored | None, checkpoints: Sequence[Any] = (),
                 digests: Digests = NO_DIGESTS) -> None:
        self.id = entry_id
        self.hashes = hashes
        self.tokens = tuple(tokens)
        self.length = len(self.tokens)
        self.digests = {p: d for p, d in digests.items() if p < self.length}
        self.payload = payload  # None: on disk only (``disk``)
        self.checkpoints = sorted(checkpoints, key=lambda c: c.position)
        self.disk: Any = None  # the disk tier's header, when a copy is on disk
        self.created = time.monotonic()
        self.shrunk = False  # made by eviction from a longer entry (``PromptCache._shrink``)
        self.kind = "entry"  # a shrunk one: the kind of the checkpoint it was shrunk to
        self.prompt_len = self.length  # how many of the tokens were a prompt
        self.nbytes = self._nbytes()
        self.counted = self.nbytes  # what the cache's byte total holds for it

    def _nbytes(self) -> int:
        if self.payload is None:
            return 0
        return int(self.payload.nbytes) + sum(int(c.nbytes) for c in self.checkpoints)

    @property
    def checkpoint_bytes(self) -> int:
        return 0 if self.payload is None else sum(int(c.nbytes) for c in self.checkpoints)

    @property
    def value(self) -> int:
        """What eviction keeps longest: the best boundary a checkpoint marks."""
        return max((CHECKPOINT_VALUE.get(c.kind, 0) for c in self.checkpoints), default=0)

    def shared(self, tokens: Sequence[int], depth: int, digests: Digests) -> int:
        """How many of ``tokens`` (whose first ``depth`` blocks hash like ours) equal our
        first tokens (their digests included)."""
        start = depth * BLOCK_SIZE
        n = start
        end = min(len(tokens), self.length)
        while n < end and tokens[n] == self.tokens[n] \
                and digests.get(n) == self.digests.get(n):
            n += 1
        return n

    def take_checkpoints(self, others: Sequence[Any]) -> None:
        """Adopt ``others`` (an entry this one extends) where we have none at their
        position."""
        have = {c.position for c in self.checkpoints}
        extra = [c for c in others if c.position < self.length and c.position not in have]
        if extra:
            self.checkpoints = sorted([*self.checkpoints, *extra], key=lambda c: c.position)
            self.nbytes = self._nbytes()

    def keep_checkpoints(self, most: int) -> None:
        """At most ``most`` checkpoints: the least valuable go first (``CHECKPOINT_VALUE``),
        the earliest among equals (a later one saves more of a prompt's prefill)."""
        if len(self.checkpoints) > most:
            ranked = sorted(self.checkpoints,
                            key=lambda c: (CHECKPOINT_VALUE.get(c.kind, 0), c.position))
            self.checkpoints = sorted(ranked[len(ranked) - most:], key=lambda c: c.position)
            self.nbytes = self._nbytes()


class Hit:
    """A lookup's find: the first ``n`` prompt tokens come from ``entry``: its whole state
    (``n == entry.length``), its state cut back to ``n``, or ``checkpoint``'s at ``n``.
    ``kind``: ``entry``, ``prefix`` or the checkpoint's boundary kind (``hits_by_kind``)."""

    __slots__ = ("entry", "n", "checkpoint", "kind")

    def __init__(self, entry: Any, n: int, checkpoint: Any = None, kind: str = "entry") -> None:
        self.entry, self.n, self.checkpoint, self.kind = entry, n, checkpoint, kind

    @property
    def payload(self) -> Any:
        return self.entry.payload

    def state(self) -> Any:
        """The reused state of the first ``n`` tokens, as the row starts from it."""
        if self.checkpoint is not None:
            return self.entry.payload.at(self.checkpoint)
        return self.entry.payload.prefix(self.n) if self.n != self.entry.length \
            else self.entry.payload


def best_in(entry: CacheEntry, shared: int, limit: int, covers: Any) -> Hit | None:
    """The most of ``entry`` a prompt that shares its first ``shared`` tokens may reuse
    (at most ``limit``): all of it if the prompt extends it, else its latest checkpoint
    within the shared part, or a cut where ``covers(length, n)`` allows (``n`` whole
    blocks)."""
    if shared >= entry.length and entry.length <= limit:
        return Hit(entry, entry.length)
    reach = min(shared, limit)
    found = None
    for c in entry.checkpoints:
        if c.position > reach:
            break
        found = c
    cut = reach - reach % BLOCK_SIZE
    if cut and covers(entry.length, cut) and (found is None or cut > found.position):
        return Hit(entry, cut, None, "prefix")
    if found is not None:
        return Hit(entry, found.position, found, found.kind)
    return None

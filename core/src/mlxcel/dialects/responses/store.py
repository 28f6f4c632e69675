"""The stored responses (for GET, DELETE, cancel and ``previous_response_id``) and the
conversations (a ``conversation`` id's items, appended to each turn).

Both are bounded in memory by entries and by bytes (each entry's JSON size): past either
the least recently used entries go first (a conversation counting as new again when a turn
uses it), and each entry lives ``ttl`` seconds (a response from when it was stored, a
conversation from its last turn). Keys carry the API key's scope (``scoped``), so one
client never reads, continues or deletes another's entries. Size 0 turns a store off.
Every operation runs on the event loop without awaiting, so none interleaves with another;
the clock is injectable so that expiry can be tested.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgspec

from .schemas import Response

T = TypeVar("T")
_encode = msgspec.json.Encoder().encode


def size_of(value: Any) -> int:
    """An entry's size: its JSON encoding's bytes."""
    return len(_encode(value))


def scoped(scope: str, key: str) -> str:
    """A store key within an API key's scope ("" on a keyless server)."""
    return f"{scope}\x00{key}"


class TTLStore(Generic[T]):
    def __init__(self, max_entries: int, ttl: float,
                 clock: Callable[[], float] = time.monotonic, max_bytes: int = 1 << 62) -> None:
        self.max_entries, self.ttl, self.clock = max_entries, ttl, clock
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[str, tuple[float, int, T]] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def _drop(self, key: str) -> bool:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.bytes -= entry[1]
        return entry is not None

    def _expire(self) -> None:
        now = self.clock()
        for key in [k for k, (deadline, _, _) in self._entries.items() if deadline <= now]:
            self._drop(key)

    def get(self, key: str) -> T | None:
        self._expire()
        entry = self._entries.get(key)
        return None if entry is None else entry[2]

    def put(self, key: str, value: T, size: int | None = None) -> bool:
        """Store (or replace, as the newest) ``key``, dropping the least recently used
        entries past the bounds; False (nothing kept, the old value gone too) when storing
        is off or the value alone is over the byte budget."""
        self._expire()
        self._drop(key)
        size = size_of(value) if size is None else size
        if not self.enabled or size > self.max_bytes:
            return False
        self._entries[key] = (self.clock() + self.ttl, size, value)
        self.bytes += size
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
        return True

    def delete(self, key: str) -> bool:
        self._expire()
        return self._drop(key)


class Stored(msgspec.Struct, kw_only=True):
    """A stored response and the history it answered (its input items after the chain or
    conversation before it, without the request's ``instructions``), so that a later
    ``previous_response_id`` continues from ``history + response.output``."""

    response: Response
    history: list[dict[str, Any]]


class Stores:
    """The two stores of one app, sized by the settings."""

    def __init__(self, settings: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.responses: TTLStore[Stored] = TTLStore(
            settings.responses_store_max_entries, settings.responses_store_ttl_secs, clock,
            settings.responses_store_max_bytes)
        self.conversations: TTLStore[list[dict[str, Any]]] = TTLStore(
            settings.conversation_store_max_entries, settings.conversation_store_ttl_secs,
            clock, settings.conversation_store_max_bytes)

    def set_clock(self, clock: Callable[[], float]) -> None:
        self.responses.clock = self.conversations.clock = clock

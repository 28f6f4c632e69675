"""The stored responses (for GET, DELETE, cancel and ``previous_response_id``) and the
conversations (a ``conversation`` id's items, appended to each turn).

Both are bounded in memory: at most ``max_entries`` (the oldest dropped first, a
conversation counting as new again when a turn uses it) and each entry lives ``ttl``
seconds (a response from when it was stored, a conversation from its last turn). Size 0
turns a store off. Every operation runs on the event loop without awaiting, so none
interleaves with another; the clock is injectable so that expiry can be tested.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgspec

from .schemas import Response

T = TypeVar("T")


class TTLStore(Generic[T]):
    def __init__(self, max_entries: int, ttl: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries, self.ttl, self.clock = max_entries, ttl, clock
        self._entries: OrderedDict[str, tuple[float, T]] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def _expire(self) -> None:
        now = self.clock()
        for key in [k for k, (deadline, _) in self._entries.items() if deadline <= now]:
            del self._entries[key]

    def get(self, key: str) -> T | None:
        self._expire()
        entry = self._entries.get(key)
        return None if entry is None else entry[1]

    def put(self, key: str, value: T) -> None:
        """Store (or replace, as the newest) ``key``; dropped at once when disabled."""
        if not self.enabled:
            return
        self._expire()
        self._entries.pop(key, None)
        self._entries[key] = (self.clock() + self.ttl, value)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def delete(self, key: str) -> bool:
        self._expire()
        return self._entries.pop(key, None) is not None


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
            settings.responses_store_max_entries, settings.responses_store_ttl_secs, clock)
        self.conversations: TTLStore[list[dict[str, Any]]] = TTLStore(
            settings.conversation_store_max_entries, settings.conversation_store_ttl_secs,
            clock)

    def set_clock(self, clock: Callable[[], float]) -> None:
        self.responses.clock = self.conversations.clock = clock

"""Recently made values by key, least recently used out: the media path's memo of work
that a repeated image would otherwise redo on every turn.

Agents send the whole conversation every turn, so the images in it (screenshots, pasted
files) come back again and again with the same bytes, hence the same digest. Core keeps
the decoded items (``mlxcel.media.decode.decode_media``) and the engine the vision
features (``mlxcel.engine.media_rows.FeatureCache``); a family may keep its processor's
output the same way (``mlxcel_family_vlm.processed``). A family kit: import it from here.

At most ``size`` values are kept, holding at most ``budget`` bytes together (``nbytes``
says what one holds); a value over a quarter of the budget is not kept, so one huge image
does not push the conversation's others out. Safe to share between the threads that
render requests; a value is made outside the lock, so two threads that miss the same key
at once both make it, and the later one's is kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class Recent(Generic[T]):
    """Values by key (module docstring); ``nbytes(value)`` says what one holds."""

    def __init__(self, size: int, budget: int, nbytes: Callable[[T], int]) -> None:
        self.size = size
        self.budget = budget
        self._nbytes = nbytes
        self._items: OrderedDict[Hashable, tuple[T, int]] = OrderedDict()
        self.bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    def holds(self, key: Hashable) -> bool:
        """Whether a value is kept for ``key`` (not counted as a hit or a use)."""
        with self._lock:
            return key in self._items

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        """The value kept for ``key``, else ``make()``'s, kept if it fits."""
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return found[0]
            self.misses += 1
        value = make()
        held = self._nbytes(value)
        if self.size > 0 and held * 4 <= self.budget:
            with self._lock:
                old = self._items.pop(key, None)
                self.bytes += held - (old[1] if old is not None else 0)
                self._items[key] = (value, held)
                while len(self._items) > self.size or self.bytes > self.budget:
                    self.bytes -= self._items.popitem(last=False)[1][1]
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.bytes = 0

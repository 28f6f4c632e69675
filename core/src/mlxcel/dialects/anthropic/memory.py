"""The thinking-block memory: with the prompt cache on and thinking enabled, the reasoning
of each answer is remembered, keyed by a hash of what the client sees of the turn (its
text and tool calls). A later request that resends that assistant turn without its
thinking block gets the reasoning put back, so the turn renders as it was generated and
the prompt cache keeps matching the tokens it stored. Clients often drop thinking blocks
from history; without this, every such turn would miss the cache from that point on.

Two turns that show the same text and calls share one entry (the later reasoning wins).
Entries belong to the API key that made them (``scoped``): a client never gets back the
reasoning another key's answer held. The memory is per app, bounded (least recently used
entries go first, over all keys), and read from the threads that prepare large requests,
hence the lock.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any

import msgspec

from mlxcel.middleware import key_scope_var
from mlxcel.types.messages import Message

MAX_ENTRIES = 1024
_encode = msgspec.json.Encoder(order="sorted").encode


def turn_key(text: str, calls: list[tuple[str | None, str, Any]]) -> str:
    """The hash of a turn's visible text and its calls ``(id, name, input)``; key order
    inside inputs does not matter."""
    return hashlib.sha256(_encode([text, [list(c) for c in calls]])).hexdigest()


def message_key(message: Message) -> str:
    calls = [(c.id, c.name, c.arguments) for c in message.tool_calls or ()]
    return turn_key(message.text or "", calls)


def blocks_key(blocks: list[dict[str, Any]]) -> str:
    """The key of an answer's content blocks, as ``message_key`` sees them resent."""
    text = "".join(b["text"] for b in blocks if b["type"] == "text")
    calls = [(b["id"], b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"]
    return turn_key(text, calls)


class ThinkingMemory:
    def __init__(self, max_entries: int = MAX_ENTRIES, scope: str = "") -> None:
        self.max_entries, self.scope = max_entries, scope
        self._entries: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def scoped(self, scope: str) -> ThinkingMemory:
        """This memory as one API key scope sees it (the same entries and bound)."""
        view = ThinkingMemory(self.max_entries, scope)
        view._entries, view._lock = self._entries, self._lock
        return view

    def remember(self, blocks: list[dict[str, Any]]) -> None:
        """Keep the reasoning of an answer's blocks (answers without any are skipped)."""
        reasoning = "".join(b["thinking"] for b in blocks if b["type"] == "thinking")
        if not reasoning:
            return
        key = (self.scope, blocks_key(blocks))
        with self._lock:
            self._entries[key] = reasoning
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def recall(self, message: Message) -> str | None:
        """The reasoning remembered for an assistant turn resent without it, or its own."""
        key = (self.scope, message_key(message))
        with self._lock:
            reasoning = self._entries.get(key)
            if reasoning is not None:
                self._entries.move_to_end(key)
        return reasoning if reasoning is not None else message.reasoning


def memory_of(ctx: Any) -> ThinkingMemory:
    """The app's memory (one per app, made on first use), seen from the current request's
    API key scope (``mlxcel.middleware``; call it on the request's task)."""
    shared = ctx.extra.setdefault("anthropic_thinking_memory", ThinkingMemory())
    return shared.scoped(key_scope_var.get())

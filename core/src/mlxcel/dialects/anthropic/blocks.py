"""An answer's deltas -> its content blocks, in the order the model wrote them, and the
stream events (``content_block_start`` / ``_delta`` / ``_stop``) that build them. The
streamed and the non-streaming response are both made here from the same deltas, so the
SDK's accumulated stream equals the non-streaming message block for block.

Rules: a ``thinking`` block holds reasoning, a ``text`` block answer text, a ``tool_use``
block one call (its arguments streamed as ``input_json_delta``). A text or thinking block
opens on text that is more than whitespace (whitespace before it is held, and kept when
the block of its kind opens next); an answer with no block at all gets one text block. A
thinking block's ``signature`` is an HMAC of its text under a key made per process: opaque
to clients, as Anthropic's is. The whole answer's calls (``Finish.calls``) are
authoritative for the tool_use inputs; calls it has that were never streamed are added as
blocks at the end.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import uuid
from typing import Any

import msgspec

from mlxcel import types as mt
from mlxcel.types.toolcalls import ParsedCall

Event = dict[str, Any]
_KEY = secrets.token_bytes(32)
DELTA_TYPES = {"text": ("text_delta", "text"), "thinking": ("thinking_delta", "thinking"),
               "tool_use": ("input_json_delta", "partial_json")}


def signature(thinking: str) -> str:
    digest = hmac.new(_KEY, thinking.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the object ``tool_use.input`` holds (``{}`` if not one)."""
    try:
        value = msgspec.json.decode(arguments) if arguments.strip() else {}
    except msgspec.DecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _empty(kind: str, **fields: Any) -> dict[str, Any]:
    if kind == "text":
        return {"type": "text", "text": ""}
    if kind == "thinking":
        return {"type": "thinking", "thinking": "", "signature": ""}
    return {"type": "tool_use", "id": fields["id"], "name": fields["name"], "input": {}}


class Blocks:
    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []
        self._open: int | None = None
        self._held: tuple[str, str] | None = None  # (kind, whitespace) not yet shown
        self._calls: dict[int, int] = {}  # call index -> block index
        self._args: dict[int, str] = {}  # block index -> the call's argument text

    def add(self, delta: mt.Delta) -> list[Event]:
        """The events one delta makes (a ``Finish`` closes the answer's blocks)."""
        if isinstance(delta, mt.ContentDelta):
            return self._text("text", delta.text)
        if isinstance(delta, mt.ReasoningDelta):
            return self._text("thinking", delta.text)
        if isinstance(delta, mt.ToolCallStart):
            return self._start_call(delta.id, delta.name, delta.index)
        if isinstance(delta, mt.ToolCallArguments):
            return self._arguments(delta.index, delta.text)
        if isinstance(delta, mt.ToolCallEnd):
            return self._close() if self._calls.get(delta.index) == self._open else []
        if isinstance(delta, mt.Finish):
            return self._finish(delta)
        return []

    def _held_of(self, kind: str) -> str:
        held, self._held = self._held, None
        return held[1] if held is not None and held[0] == kind else ""

    def _text(self, kind: str, text: str) -> list[Event]:
        if not text:
            return []
        if self._open is not None and self.blocks[self._open]["type"] == kind:
            return [self._delta(self._open, self._held_of(kind) + text)]
        if not text.strip():
            self._held = (kind, self._held_of(kind) + text)
            return []
        held = self._held_of(kind)
        events = self._close() + self._start(_empty(kind))
        return [*events, self._delta(len(self.blocks) - 1, held + text)]

    def _start(self, block: dict[str, Any]) -> list[Event]:
        self.blocks.append(block)
        self._open = len(self.blocks) - 1
        return [{"type": "content_block_start", "index": self._open,
                 "content_block": dict(block)}]

    def _delta(self, index: int, text: str) -> Event:
        block = self.blocks[index]
        kind, field = DELTA_TYPES[block["type"]]
        if block["type"] == "tool_use":
            self._args[index] += text
        else:
            block[block["type"]] += text
        return {"type": "content_block_delta", "index": index,
                "delta": {"type": kind, field: text}}

    def _close(self) -> list[Event]:
        index, self._open = self._open, None
        if index is None:
            return []
        block = self.blocks[index]
        events: list[Event] = []
        if block["type"] == "thinking":
            block["signature"] = signature(block["thinking"])
            events.append({"type": "content_block_delta", "index": index, "delta": {
                "type": "signature_delta", "signature": block["signature"]}})
        elif block["type"] == "tool_use":
            block["input"] = tool_input(self._args[index])
        return [*events, {"type": "content_block_stop", "index": index}]

    def _start_call(self, call_id: str, name: str, call_index: int) -> list[Event]:
        self._held = None
        events = self._close() + self._start(_empty("tool_use", id=call_id, name=name))
        self._calls[call_index] = self._open  # type: ignore[assignment]
        self._args[len(self.blocks) - 1] = ""
        return events

    def _arguments(self, call_index: int, text: str) -> list[Event]:
        index = self._calls.get(call_index)
        if index is None or not text:
            return []
        if index != self._open:
            self._args[index] += text
            return []
        return [self._delta(index, text)]

    def _finish(self, finish: mt.Finish) -> list[Event]:
        events = self._close()
        if finish.ok:
            events += self._authoritative(finish.calls)
            if not self.blocks:
                held = self._held_of("text")
                events += self._start(_empty("text"))
                events += [self._delta(0, held)] if held else []
                events += self._close()
        return events

    def _authoritative(self, calls: tuple[ParsedCall, ...]) -> list[Event]:
        streamed = [b for b in self.blocks if b["type"] == "tool_use"]
        for block, call in zip(streamed, calls, strict=False):
            block.update(name=call.name, input=tool_input(call.arguments),
                         id=call.id or block["id"])
        events: list[Event] = []
        for n, call in enumerate(calls[len(streamed):], start=len(streamed)):
            call_id = call.id or f"toolu_{uuid.uuid4().hex[:24]}"
            events += self._start_call(call_id, call.name, -1 - n)
            events += self._arguments(-1 - n, call.arguments)
            events += self._close()
        return events

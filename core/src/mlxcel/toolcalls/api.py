"""Tool-call format contract: detect a template's format, parse model output into calls."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

import msgspec


class ParseEvent(msgspec.Struct, frozen=True, kw_only=True):
    """``content`` text for the user, or a tool call (whole or streamed in pieces)."""

    kind: Literal["content", "call_start", "call_arguments", "call_end"]
    text: str = ""
    index: int = 0
    name: str | None = None


class ToolCallParser(Protocol):
    """One per request; all state lives here. Same events whatever the chunking."""

    def feed(self, text: str) -> list[ParseEvent]: ...

    def finish(self) -> list[ParseEvent]: ...


class ToolFormat(msgspec.Struct, frozen=True, kw_only=True):
    """A tool-call wire format.

    ``detect`` takes the chat template source and says whether it uses this format.
    ``parser`` is a ``"module:attr"`` naming ``new_parser(tools) -> ToolCallParser``.
    ``grammar`` optionally names ``grammar(tools, choice)`` for JSON-in-wrapper formats.
    """

    name: str
    detect: Callable[[str], bool]
    parser: str
    grammar: str | None = None


NewParser = Callable[[list[dict[str, Any]]], ToolCallParser]

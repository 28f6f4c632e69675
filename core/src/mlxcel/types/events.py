"""What the engine sends back, one event per step (or fewer)."""

from __future__ import annotations

from typing import Literal

import msgspec

FinishReason = Literal["stop", "length", "error", "cancelled"]


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class GenerationEvent(msgspec.Struct, frozen=True, kw_only=True):
    """Text decoded since the previous event; ``finish_reason`` set on the last one."""

    text: str = ""
    token_ids: tuple[int, ...] = ()
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: str | None = None

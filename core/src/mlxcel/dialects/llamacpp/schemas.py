"""llama-server native wire schemas."""

from __future__ import annotations

import msgspec


class TokenizeRequest(msgspec.Struct, kw_only=True):
    content: str
    add_special: bool = False


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    tokens: list[int]  # msgspec reads JSON integers as 64-bit

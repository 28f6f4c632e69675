"""What a dialect hands to the engine."""

from __future__ import annotations

import msgspec


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """Resolved sampling settings for one request (server defaults already applied)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None


class GenerationRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One generation: token ids in, events out."""

    request_id: str
    prompt_tokens: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    priority: int = 1  # 0 high, 1 normal, 2 low (ordering arrives with the scheduler)

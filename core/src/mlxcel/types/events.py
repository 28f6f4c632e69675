"""What the engine sends back, one event per step (or fewer)."""

from __future__ import annotations

from typing import Literal

import msgspec

FinishReason = Literal["stop", "length", "error", "cancelled"]


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens served from the prompt cache
    # speculative decoding, when a drafter ran at least one verify round for the request:
    # tokens drafted, of them accepted, verify rounds, and the drafter's kind
    draft_n: int = 0
    draft_n_accepted: int = 0
    draft_rounds: int = 0
    draft_kind: str | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class TokenLogprob(msgspec.Struct, frozen=True, array_like=True):
    """One generated token's log-probability and the most likely alternatives."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class PromptProgress(msgspec.Struct, frozen=True, kw_only=True):
    """llama-server's ``prompt_progress``: the prompt's tokens (``total``), of them taken
    from the prompt cache (``cache``) and in the KV cache so far, those included
    (``processed``), and the milliseconds since its prefill started (``time_ms``)."""

    total: int
    cache: int
    processed: int
    time_ms: int


class GenerationEvent(msgspec.Struct, frozen=True, kw_only=True):
    """Text decoded since the previous event; ``finish_reason`` set on the last one.

    ``text`` keeps the text of special tokens (``<|python_tag|>``, ``[TOOL_CALLS]``,
    harmony's channel tokens), so that the chat layer can parse them; ``specials`` holds the
    ``(start, end)`` character span of each in ``text``, which is how the chat layer keeps
    them out of what a user sees without guessing from strings. ``logprobs`` has one entry
    per token in ``token_ids`` when the request asked for them.
    """

    text: str = ""
    specials: tuple[tuple[int, int], ...] = ()
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: str | None = None
    # a prefill chunk's progress (requests with ``return_progress``); such an event
    # carries nothing else
    progress: PromptProgress | None = None

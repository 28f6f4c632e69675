"""llama-server native wire schemas (requests tolerate unknown fields; None = absent)."""

from __future__ import annotations

from typing import Any

import msgspec


class TokenizeRequest(msgspec.Struct, kw_only=True):
    content: str
    add_special: bool = False


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    tokens: list[int]  # msgspec reads JSON integers as 64-bit


class NativeFields(msgspec.Struct, kw_only=True):
    """The generation fields ``/completion`` and ``/infill`` share, in llama-server's
    names. Fields llama-server has and this server ignores (``typical_p``, ``mirostat``,
    ``samplers``, ``n_keep``, ``id_slot``, ...) are tolerated like any unknown field; those
    whose absence would change what the client gets are refused (``completion``)."""

    n_predict: int | None = None
    max_tokens: int | None = None  # read when n_predict is absent, as llama-server does
    stream: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    p_less: bool | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: list[str | int] | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    n_probs: int = 0
    cache_prompt: bool | None = None
    return_tokens: bool = False
    timings_per_token: bool = False
    max_pattern_size: int | None = None
    min_pattern_size: int | None = None
    min_count: int | None = None
    thinking_budget_tokens: int | None = None
    reasoning_budget_tokens: int | None = None
    thinking_budget: int | None = None
    # refused unless they ask for nothing (see ``completion.refuse_unsupported``)
    response_format: dict[str, Any] | None = None
    post_sampling_probs: bool = False
    grammar: str | None = None
    json_schema: Any = None
    n_cmpl: int | None = None
    n: int | None = None
    lora: list[Any] | None = None


class CompletionRequest(NativeFields, kw_only=True):
    # a string, token ids, ids mixed with strings, {"prompt_string": ...}, or a list of those
    prompt: str | list[Any] | dict[str, Any]


class ExtraChunk(msgspec.Struct, kw_only=True):
    text: str
    filename: str = "tmp"


class InfillRequest(NativeFields, kw_only=True):
    input_prefix: str | list[str | int]
    input_suffix: str | list[str | int]
    input_extra: list[ExtraChunk] = []
    prompt: str = ""  # text after the middle marker: the start of the answer

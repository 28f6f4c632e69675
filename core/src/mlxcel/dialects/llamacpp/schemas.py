"""llama-server native wire schemas (requests tolerate unknown fields; None = absent)."""

from __future__ import annotations

from typing import Any

import msgspec

from mlxcel.dialects.kit import GenerationFields


class TokenizeRequest(msgspec.Struct, kw_only=True):
    content: str
    add_special: bool = False
    with_pieces: bool = False  # each token as {"id", "piece"} (``pieces``)


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    tokens: list[int]  # msgspec reads JSON integers as 64-bit


class NativeFields(GenerationFields, kw_only=True):
    """The generation fields ``/completion`` and ``/infill`` share, in llama-server's
    names. Fields llama-server has and this server ignores (``typical_p``, ``mirostat``,
    ``samplers``, ``n_keep``, ``id_slot``, ...) are tolerated like any unknown field; those
    whose absence would change what the client gets are refused (``completion``).
    ``max_tokens`` (``GenerationFields``) is read when ``n_predict`` is absent, as
    llama-server does; its ``response_format`` is refused unless it asks for nothing."""

    n_predict: int | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    dry_sequence_breakers: list[str | int] | None = None
    n_probs: int = 0
    return_tokens: bool = False
    timings_per_token: bool = False
    return_progress: bool = False  # prompt_progress chunks while streaming
    n_cmpl: int | None = None  # completions per prompt (``n`` is its alias)
    n: int | None = None
    logit_bias: Any = None  # llama-server's forms (chat.logit_bias)
    grammar: Any = None  # a GBNF grammar, or json_schema: at most one (chat.structured)
    json_schema: Any = None
    # a lazy grammar: from a trigger on (chat.lazy_grammar)
    grammar_lazy: bool = False
    grammar_triggers: Any = None
    preserved_tokens: Any = None
    # refused unless they ask for nothing (see ``completion.refuse_unsupported``)
    post_sampling_probs: bool = False
    lora: list[Any] | None = None


class CompletionRequest(NativeFields, kw_only=True):
    # a string, token ids, ids mixed with strings, {"prompt_string": ...} (with
    # "multimodal_data": see ``media``), or a list of those
    prompt: str | list[Any] | dict[str, Any]
    max_soft_tokens: Any = None  # media knobs (``dialects.media_options``), checked there
    mm_processor_kwargs: Any = None


class ExtraChunk(msgspec.Struct, kw_only=True):
    text: str
    filename: str = "tmp"


class InfillRequest(NativeFields, kw_only=True):
    input_prefix: str | list[str | int]
    input_suffix: str | list[str | int]
    input_extra: list[ExtraChunk] = []
    prompt: str = ""  # text after the middle marker: the start of the answer

"""Anthropic Messages wire schemas. Requests tolerate unknown fields (``metadata``,
``container``, ``service_tier``, ... are accepted and ignored); content blocks stay plain
objects here and are checked, with the field named, by ``translate``."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

Role = Literal["user", "assistant", "system"]  # system turns are folded into user turns


class InputMessage(msgspec.Struct, kw_only=True):
    role: Role
    content: str | list[dict[str, Any]]


class CountTokensRequest(msgspec.Struct, kw_only=True):
    """What a prompt is rendered from (``/v1/messages/count_tokens`` takes only this)."""

    model: str  # required, never matched against the loaded model
    messages: list[InputMessage]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    extra_body: dict[str, Any] | None = None
    cache_prompt: bool | None = None  # false: no prompt-cache reuse, no thinking memory
    max_soft_tokens: Any = None  # media knobs (``dialects.media_options``), checked there
    mm_processor_kwargs: Any = None


class MessagesRequest(CountTokensRequest, kw_only=True):
    max_tokens: int | None = None  # None: the server's default (--n-predict)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None  # llama-server's extensions, as on the OpenAI routes
    seed: int | None = None
    ignore_eos: bool = False


class Usage(msgspec.Struct):
    """``input_tokens`` counts the prompt tokens not read from the prompt cache, as
    Anthropic counts them (input + cache reads = the whole prompt)."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0


class MessageResponse(msgspec.Struct):
    id: str
    model: str
    content: list[dict[str, Any]]
    stop_reason: str | None
    stop_sequence: str | None
    usage: Usage
    type: str = "message"
    role: str = "assistant"

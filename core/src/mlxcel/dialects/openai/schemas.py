"""OpenAI wire schemas (requests tolerate unknown fields; UNSET = absent)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from mlxcel.dialects.kit import GenerationFields

Role = Literal["system", "developer", "user", "assistant", "tool"]


class ChatMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: Role
    content: str | list[dict[str, Any]] | None = None
    name: str | UnsetType = UNSET
    tool_calls: list[dict[str, Any]] | UnsetType = UNSET
    tool_call_id: str | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class SamplingFields(GenerationFields, kw_only=True):
    """Fields shared by chat completions and completions."""

    model: str | None = None
    stream_options: StreamOptions | None = None
    n: int = 1
    repetition_penalty: float | None = None
    repetition_context_size: int | None = None
    dry_sequence_breakers: list[int] | None = None
    # llama-server's fields, read on its OpenAI routes too (chat.logit_bias, chat.structured)
    logit_bias: Any = None
    grammar: Any = None
    json_schema: Any = None
    grammar_lazy: bool = False  # a lazy grammar: from a trigger on (chat.lazy_grammar)
    grammar_triggers: Any = None
    preserved_tokens: Any = None
    timings_per_token: bool = False  # llama-server's: ``timings`` on every streamed chunk
    return_progress: bool = False  # llama-server's: ``prompt_progress`` chunks first


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    logprobs: bool = False
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # checked only: templates decide parallel calls
    chat_template_kwargs: dict[str, Any] | None = None
    extra_body: dict[str, Any] | None = None
    add_generation_prompt: bool | None = None  # None: true, unless continuing (vLLM's rule)
    # None: llama-server's prefill of a final assistant message (chat.prompt.prefills)
    continue_final_message: bool | None = None
    # media knobs (``dialects.media_options``), checked there
    max_soft_tokens: Any = None
    mm_processor_kwargs: Any = None


class CompletionRequest(SamplingFields, kw_only=True):
    prompt: str | list[str | int]
    echo: bool = False
    logprobs: int | None = None  # number of alternatives per token (0-20)
    best_of: int | None = None  # only 1 (one candidate per choice)
    suffix: str | None = None  # fill-in-the-middle: refused


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] = {}


class AssistantMessage(msgspec.Struct):
    role: str = "assistant"
    content: str | None = None
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[dict[str, Any]] | UnsetType = UNSET
    reasoning_only: bool | UnsetType = UNSET  # mlxcel's: the answer was reasoning only


class ChatChoice(msgspec.Struct):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


class ChatCompletion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: str = "chat.completion"
    system_fingerprint: None = None
    timings: dict[str, Any] | UnsetType = UNSET


class Delta(msgspec.Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    reasoning_only: bool | None = None


class ChunkChoice(msgspec.Struct):
    index: int
    delta: Delta
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None


class _Frame(msgspec.Struct):
    """What a chat chunk and a completion (streamed or whole) both carry; each names its
    ``choices`` and ``object``, which keep their place in the encoded order."""

    id: str
    created: int
    model: str
    choices: list[Any]
    object: str
    system_fingerprint: None = None
    usage: Usage | UnsetType = UNSET
    timings: dict[str, Any] | UnsetType = UNSET  # llama-server's (``timings_per_token``)
    # llama-server's ``__verbose`` (``-v``; ``verbose``)
    verbose: dict[str, Any] | UnsetType = msgspec.field(default=UNSET, name="__verbose")


class ChatCompletionChunk(_Frame):
    choices: list[ChunkChoice]
    object: str = "chat.completion.chunk"


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


class Completion(_Frame):
    choices: list[CompletionChoice]
    object: str = "text_completion"

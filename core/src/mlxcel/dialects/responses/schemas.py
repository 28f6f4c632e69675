"""Responses wire schemas: the request bodies (unknown fields tolerated; input items stay
JSON objects until ``items`` checks them) and the response objects the SDK parses
(``openai.types.responses``: Response, its output items, usage)."""

from __future__ import annotations

from typing import Any

import msgspec


class Sampling(msgspec.Struct, kw_only=True):
    """Generation fields every generating Responses route takes: OpenAI's two, and the
    llama-server extensions the chat routes take too."""

    model: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    ignore_eos: bool = False
    cache_prompt: bool | None = None
    thinking_budget_tokens: int | None = None  # chat.request.REASONING_BUDGET_ALIASES
    reasoning_budget_tokens: int | None = None
    thinking_budget: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    extra_body: dict[str, Any] | None = None
    max_soft_tokens: Any = None  # media knobs (``dialects.media_options``), checked there
    mm_processor_kwargs: Any = None
    timings_per_token: bool = False  # llama-server's: ``timings`` on the stream's events
    return_progress: bool = False  # llama-server's: ``prompt_progress`` while prefilling


class History(Sampling, kw_only=True):
    """Where a request's items come from: ``input`` after the stored history that
    ``previous_response_id`` or ``conversation`` names; ``instructions`` are this
    request's system message only (never carried to the next turn)."""

    input: str | list[Any] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    stream: bool | None = None


class CreateRequest(History, kw_only=True):
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    store: bool = True
    metadata: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    truncation: str | None = None
    background: bool | None = None
    context_management: list[Any] | None = None
    max_tool_calls: int | None = None
    user: str | None = None


class CompactRequest(History, kw_only=True):
    keep_tokens: int | None = None  # mlxcel's: tokens of the newest turns kept verbatim


class ConversationRequest(msgspec.Struct, kw_only=True):
    """``POST /v1/conversations``: optional starting ``items`` (input items) and
    ``metadata``."""

    items: list[Any] | None = None
    metadata: dict[str, Any] | None = None


class Conversation(msgspec.Struct, kw_only=True):
    """A conversation as stored (its items) and, without them, as the routes answer it."""

    id: str
    created_at: int
    metadata: dict[str, Any] = {}
    items: list[Any] = []

    def wire(self) -> dict[str, Any]:
        return {"id": self.id, "object": "conversation", "created_at": self.created_at,
                "metadata": self.metadata}


# -- output ------------------------------------------------------------------------------
class OutputText(msgspec.Struct, kw_only=True, tag_field="type", tag="output_text"):
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] = []


class ReasoningText(msgspec.Struct, kw_only=True, tag_field="type", tag="reasoning_text"):
    text: str


class MessageItem(msgspec.Struct, kw_only=True, tag_field="type", tag="message"):
    id: str
    status: str
    content: list[OutputText]
    role: str = "assistant"


class ReasoningItem(msgspec.Struct, kw_only=True, tag_field="type", tag="reasoning"):
    id: str
    status: str
    content: list[ReasoningText]
    summary: list[Any] = []


class FunctionCallItem(msgspec.Struct, kw_only=True, tag_field="type", tag="function_call"):
    id: str
    status: str
    call_id: str
    name: str
    arguments: str


class CompactionItem(msgspec.Struct, kw_only=True, tag_field="type", tag="compaction"):
    id: str
    encrypted_content: str


OutputItem = MessageItem | ReasoningItem | FunctionCallItem | CompactionItem


class Usage(msgspec.Struct, kw_only=True):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens_details: dict[str, int]


class Response(msgspec.Struct, kw_only=True):
    """A response object; fields the request did not set echo OpenAI's defaults."""

    id: str
    created_at: int
    model: str
    status: str
    output: list[OutputItem] = []
    usage: Usage | None = None
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, Any] | None = None
    instructions: str | None = None
    metadata: dict[str, str] = {}
    tools: list[Any] = []
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    conversation: dict[str, str] | None = None
    text: dict[str, Any] = msgspec.field(default_factory=lambda: {"format": {"type": "text"}})
    reasoning: dict[str, Any] = msgspec.field(
        default_factory=lambda: {"effort": None, "summary": None})
    truncation: str = "disabled"
    store: bool = True
    background: bool = False
    completed_at: int | None = None
    object: str = "response"
    # llama-server's timings with the speculative counters, when a drafter ran for it
    timings: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


class CompactedResponse(msgspec.Struct, kw_only=True):
    id: str
    created_at: int
    model: str
    output: list[Any]
    usage: Usage
    object: str = "response.compaction"

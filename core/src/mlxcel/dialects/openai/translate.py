"""OpenAI request -> prompt tokens + GenerationRequest."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from mlxcel.context import AppContext
from mlxcel.errors import CapabilityNotSupported, InvalidRequest
from mlxcel.generation import (
    max_tokens,
    request_loop_policy,
    sampling_params,
    server_loop_policy,
    server_sampling_defaults,
    stop_strings,
)
from mlxcel.types import GenerationRequest

from .schemas import ChatCompletionRequest, ChatMessage, CompletionRequest, SamplingFields

LOOP_FIELDS = ("min_pattern_size", "max_pattern_size", "min_count")


def _text_content(msg: ChatMessage, index: int) -> str | None:
    if msg.content is None or isinstance(msg.content, str):
        return msg.content
    parts = []
    for j, part in enumerate(msg.content):
        kind = part.get("type")
        if kind in ("text", "input_text") and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif kind in ("image_url", "input_image", "video_url", "input_audio", "audio_url"):
            raise CapabilityNotSupported(
                f"the loaded model accepts text only; messages[{index}].content[{j}] is "
                f"'{kind}'", param=f"messages[{index}].content")
        else:
            raise InvalidRequest(f"messages[{index}].content[{j}] has unknown type '{kind}'",
                                 param=f"messages[{index}].content")
    return "".join(parts)


def _tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for call in calls:
        call = dict(call)
        fn = dict(call.get("function") or {})
        if isinstance(fn.get("arguments"), str):
            try:
                parsed = json.loads(fn["arguments"])
                fn["arguments"] = parsed if isinstance(parsed, dict) else fn["arguments"]
            except ValueError:
                pass
        call["function"] = fn
        out.append(call)
    return out


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    if not messages:
        raise InvalidRequest("'messages' must contain at least one message", param="messages")
    out = []
    for i, msg in enumerate(messages):
        item = {k: v for k, v in msgspec.structs.asdict(msg).items()
                if v is not msgspec.UNSET}
        item["content"] = _text_content(msg, i)
        if msg.tool_calls is not msgspec.UNSET:
            item["tool_calls"] = _tool_calls(msg.tool_calls)
        out.append(item)
    return out


def _template_kwargs(body: ChatCompletionRequest) -> dict[str, Any]:
    if body.chat_template_kwargs is not None:
        return dict(body.chat_template_kwargs)
    extra = body.extra_body or {}
    if isinstance(extra.get("chat_template_kwargs"), dict):
        return dict(extra["chat_template_kwargs"])
    return {"preserve_thinking": extra["preserve_thinking"]} if "preserve_thinking" in extra \
        else {}


def chat_prompt(ctx: AppContext, body: ChatCompletionRequest) -> list[int]:
    ckpt = ctx.engine.checkpoint
    tools = body.tools if body.tool_choice != "none" else None
    text = ckpt.template.render(template_messages(body.messages), tools=tools or None,
                                add_generation_prompt=True, **_template_kwargs(body))
    return ckpt.tokenizer.encode(text, add_special=False)


def completion_prompt(ctx: AppContext, body: CompletionRequest) -> list[int]:
    """A string, a one-string list, or a list of token ids."""
    tok = ctx.engine.checkpoint.tokenizer
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and all(type(p) is int for p in prompt):
        bad = tok.first_invalid_id(prompt)  # type: ignore[arg-type]
        if bad is not None:
            raise InvalidRequest(f"prompt token id {bad} is out of vocabulary range",
                                 param="prompt")
        return list(prompt)  # type: ignore[arg-type]
    if isinstance(prompt, list):
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise InvalidRequest("'prompt' must be a string, a list holding one string, or a "
                                 "list of token ids", param="prompt")
        prompt = prompt[0]
    ids = tok.encode(prompt, add_special=True) if prompt else []
    if not ids:
        if tok.bos_token is None:
            raise InvalidRequest("'prompt' is empty", param="prompt")
        ids = [tok.hf.token_to_id(tok.bos_token)]
    return ids


def generation_request(ctx: AppContext, body: SamplingFields, prompt: list[int],
                       request_id: str, limit: int | None, limit_field: str, *,
                       priority: int = 1, logprobs: bool = False,
                       top_logprobs: int = 0) -> GenerationRequest:
    if body.n != 1:
        raise InvalidRequest("only 'n': 1 is supported", param="n")
    ckpt = ctx.engine.checkpoint
    defaults = server_sampling_defaults(ckpt, ctx.settings)
    fields = {k: getattr(body, k, None) for k in defaults}
    sampling = sampling_params(fields, defaults, logprobs=logprobs, top_logprobs=top_logprobs)
    loop_fields = {k: getattr(body, k) for k in LOOP_FIELDS}
    loop = request_loop_policy(loop_fields, server_loop_policy(ckpt.family.loop_detection))
    stops = stop_strings(body.stop)
    wanted = max_tokens(limit, limit_field, ctx.settings.n_predict)
    return GenerationRequest(request_id=request_id, prompt_tokens=tuple(prompt),
                             max_tokens=ctx.engine.fit(len(prompt), wanted), sampling=sampling,
                             stop=stops, ignore_eos=body.ignore_eos, priority=priority,
                             loop=loop, cache_prompt=body.cache_prompt is not False)

"""OpenAI request -> prompt tokens + GenerationRequest."""

from __future__ import annotations

from typing import Any

import msgspec

from mlxcel.chat.prompt import template_kwargs
from mlxcel.chat.request import (
    max_tokens,
    request_loop_policy,
    sampling_params,
    server_loop_policy,
    server_sampling_defaults,
    stop_strings,
)
from mlxcel.context import AppContext
from mlxcel.dialects.jsondepth import MAX_JSON_DEPTH, too_deep
from mlxcel.dialects.prepare import check_token_ids, encode_prompt
from mlxcel.errors import CapabilityNotSupported, InvalidRequest
from mlxcel.types import GenerationRequest

from .schemas import ChatCompletionRequest, ChatMessage, CompletionRequest, SamplingFields

LOOP_FIELDS = ("min_pattern_size", "max_pattern_size", "min_count")


def _text_part(part: Any, where: str) -> str:
    if not isinstance(part, dict):
        raise InvalidRequest(f"{where} must be an object with a 'type'", param=where)
    kind = part.get("type")
    if kind in ("text", "input_text"):
        if not isinstance(part.get("text"), str):
            raise InvalidRequest(f"{where}.text must be a string", param=f"{where}.text")
        return part["text"]
    index = where.split(".", 1)[0]
    if kind in ("image_url", "input_image", "video_url", "input_audio", "audio_url"):
        raise CapabilityNotSupported(
            f"the loaded model accepts text only; {where} is '{kind}'",
            param=f"{index}.content")
    raise InvalidRequest(f"{where} has an unknown type", param=f"{where}.type")


def _text_content(msg: ChatMessage, index: int) -> str | None:
    if msg.content is None or isinstance(msg.content, str):
        return msg.content
    return "".join(_text_part(part, f"messages[{index}].content[{j}]")
                   for j, part in enumerate(msg.content))


def _arguments(value: Any, where: str) -> Any:
    """Arguments given as a JSON string are parsed into an object for the template (other
    strings stay as they are); nesting is bounded because templates recurse through it."""
    too_deep_error = InvalidRequest(f"{where} is nested more than {MAX_JSON_DEPTH} levels "
                                    "deep", param=where)
    if value is not None and not isinstance(value, (str, dict)):
        raise InvalidRequest(f"{where} must be a JSON string or an object", param=where)
    if not isinstance(value, str):
        return value
    try:
        parsed = msgspec.json.decode(value)
    except RecursionError:
        raise too_deep_error from None
    except msgspec.DecodeError:
        return value
    if too_deep(parsed)[0]:
        raise too_deep_error
    return parsed if isinstance(parsed, dict) else value


def _tool_calls(calls: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    out = []
    for j, call in enumerate(calls):
        where = f"messages[{index}].tool_calls[{j}]"
        if not isinstance(call, dict):
            raise InvalidRequest(f"{where} must be an object", param=where)
        fn = call.get("function")
        if not isinstance(fn, dict):
            raise InvalidRequest(f"{where}.function must be an object with 'name' and "
                                 "'arguments'", param=f"{where}.function")
        fn = dict(fn)
        if "arguments" in fn:
            fn["arguments"] = _arguments(fn["arguments"], f"{where}.function.arguments")
        out.append({**call, "function": fn})
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
            item["tool_calls"] = _tool_calls(msg.tool_calls, i)
        out.append(item)
    return out


def _template_kwargs(body: ChatCompletionRequest,
                     server: dict[str, Any] | None = None) -> dict[str, Any]:
    """The request's template variables, in the spec's order of forms (top-level
    ``chat_template_kwargs``, ``extra_body.chat_template_kwargs``, then DashScope's flat
    ``extra_body.preserve_thinking``), over ``--chat-template-kwargs`` (``server``; the
    merge rule is ``mlxcel.chat.prompt.template_kwargs``)."""
    if body.chat_template_kwargs is not None:
        kwargs = dict(body.chat_template_kwargs)
    else:
        extra = body.extra_body or {}
        if isinstance(extra.get("chat_template_kwargs"), dict):
            kwargs = dict(extra["chat_template_kwargs"])
        else:
            kwargs = {"preserve_thinking": extra["preserve_thinking"]} \
                if "preserve_thinking" in extra else {}
    return template_kwargs(kwargs, server)


def chat_prompt(ctx: AppContext, body: ChatCompletionRequest) -> list[int]:
    """Render and tokenize; a rendered text too long for the context is refused before
    tokenizing (blocking work: run it through ``prepare``)."""
    ckpt = ctx.engine.checkpoint
    tools = body.tools if body.tool_choice != "none" else None
    text = ckpt.template.render(template_messages(body.messages), tools=tools or None,
                                add_generation_prompt=True,
                                **_template_kwargs(body, ctx.settings.chat_template_kwargs))
    return encode_prompt(ctx.engine, text, "messages", add_special=False)


def completion_prompt(ctx: AppContext, body: CompletionRequest) -> list[int]:
    """A string, a one-string list, or a list of token ids (blocking work: run it through
    ``prepare``)."""
    tok = ctx.engine.checkpoint.tokenizer
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and all(type(p) is int for p in prompt):
        check_token_ids(tok, prompt, "prompt")  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]
    text = prompt_text(body)
    ids = encode_prompt(ctx.engine, text, "prompt", add_special=True) if text else []
    if not ids:
        if tok.bos_token is None:
            raise InvalidRequest("'prompt' is empty", param="prompt")
        ids = [tok.hf.token_to_id(tok.bos_token)]
    return ids


def prompt_text(body: CompletionRequest) -> str:
    """The prompt as text: a string or a one-string list."""
    prompt = body.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise InvalidRequest("'prompt' must be a string, a list holding one string, or a "
                                 "list of token ids", param="prompt")
        prompt = prompt[0]
    return prompt


def check_completion_options(body: CompletionRequest) -> None:
    """Refuse the legacy completion fields this server cannot honour, instead of ignoring
    them: a client that asks for them would get something other than it asked for."""
    if body.suffix:
        raise InvalidRequest("'suffix' (fill-in-the-middle) is not supported; send the whole "
                             "text as 'prompt'", param="suffix")
    if body.best_of is not None and body.best_of != 1:
        raise InvalidRequest("only 'best_of': 1 is supported", param="best_of")
    if body.echo and body.logprobs is not None:
        raise InvalidRequest("'echo' with 'logprobs' is not supported: the prompt tokens' "
                             "logprobs are not computed", param="echo")


def echo_text(ctx: AppContext, body: CompletionRequest, prompt: list[int]) -> str:
    """The prompt as the client sent it (token ids are decoded), for ``echo``."""
    if isinstance(body.prompt, str):
        return body.prompt
    if body.prompt and isinstance(body.prompt[0], str):
        return body.prompt[0]
    return ctx.engine.checkpoint.tokenizer.decode(list(prompt), skip_special=False)


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
    server_loop = server_loop_policy(ckpt.family.loop_detection, ctx.settings.loop_detection)
    loop = request_loop_policy(loop_fields, server_loop)
    stops = stop_strings(body.stop)
    wanted = max_tokens(limit, limit_field, ctx.settings.n_predict)
    return GenerationRequest(request_id=request_id, prompt_tokens=tuple(prompt),
                             max_tokens=ctx.engine.fit(len(prompt), wanted), sampling=sampling,
                             stop=stops, ignore_eos=body.ignore_eos, priority=priority,
                             loop=loop, cache_prompt=body.cache_prompt is not False)

"""OpenAI request -> the chat layer's typed request and prompt, + GenerationRequest."""

from __future__ import annotations

from typing import Any

import msgspec

from mlxcel.chat.logit_bias import check_openai_range
from mlxcel.chat.prompt import pick_template_kwargs
from mlxcel.chat.request import (
    REASONING_BUDGET_ALIASES,
    SAMPLING_DEFAULTS,
    reasoning_budget,
    stop_strings,
)
from mlxcel.context import AppContext
from mlxcel.dialects.draft_fields import draft_limits
from mlxcel.dialects.jsondepth import call_arguments
from mlxcel.dialects.media_options import media_options
from mlxcel.dialects.prepare import check_token_ids, encode_prompt
from mlxcel.dialects.turn import TurnOptions
from mlxcel.errors import InvalidRequest
from mlxcel.types.constraints import Constraint
from mlxcel.types.messages import (
    AudioPart,
    FunctionChoice,
    ImagePart,
    Message,
    Part,
    PromptRequest,
    TextPart,
    Tool,
    ToolCall,
    ToolChoice,
    VideoPart,
)

from .schemas import ChatCompletionRequest, ChatMessage, CompletionRequest, SamplingFields

LOOP_FIELDS = ("min_pattern_size", "max_pattern_size", "min_count")


MEDIA = {  # wire part type -> typed part, and the key that holds its reference
    "image_url": (ImagePart, "image_url"), "input_image": (ImagePart, "image_url"),
    "video_url": (VideoPart, "video_url"), "input_audio": (AudioPart, "input_audio"),
    "audio_url": (AudioPart, "audio_url"),
}


def _media(kind: str, ref: Any) -> Part:
    """A media part with its reference as given: a URL string, or an object with ``url``,
    or ``data`` and ``format``; nothing is checked, since nothing decodes it yet."""
    cls, _ = MEDIA[kind]
    if isinstance(ref, str):
        return cls(url=ref, wire_type=kind)
    fields = {k: ref[k] for k in ("url", "data", "format")
              if isinstance(ref, dict) and isinstance(ref.get(k), str)}
    return cls(**fields, wire_type=kind)


def _part(part: Any, where: str) -> Part:
    if not isinstance(part, dict):
        raise InvalidRequest(f"{where} must be an object with a 'type'", param=where)
    kind = part.get("type")
    if kind in ("text", "input_text"):
        if not isinstance(part.get("text"), str):
            raise InvalidRequest(f"{where}.text must be a string", param=f"{where}.text")
        return TextPart(text=part["text"])
    if isinstance(kind, str) and kind in MEDIA:
        return _media(kind, part.get(MEDIA[kind][1]))
    raise InvalidRequest(f"{where} has an unknown type", param=f"{where}.type")


def _content(msg: ChatMessage, index: int) -> tuple[Part, ...] | None:
    if msg.content is None:
        return None
    if isinstance(msg.content, str):
        return (TextPart(text=msg.content),)
    return tuple(_part(part, f"messages[{index}].content[{j}]")
                 for j, part in enumerate(msg.content))


def _tool_call(call: Any, where: str) -> ToolCall:
    if not isinstance(call, dict):
        raise InvalidRequest(f"{where} must be an object", param=where)
    fn = call.get("function")
    if not isinstance(fn, dict):
        raise InvalidRequest(f"{where}.function must be an object with 'name' and "
                             "'arguments'", param=f"{where}.function")
    if not isinstance(fn.get("name"), str):
        raise InvalidRequest(f"{where}.function.name must be a string",
                             param=f"{where}.function.name")
    call_id = call.get("id")
    return ToolCall(id=call_id if isinstance(call_id, str) else None, name=fn["name"],
                    arguments=call_arguments(fn.get("arguments"),
                                             f"{where}.function.arguments"))


def _message(msg: ChatMessage, index: int) -> Message:
    calls = None if msg.tool_calls is msgspec.UNSET else tuple(
        _tool_call(call, f"messages[{index}].tool_calls[{j}]")
        for j, call in enumerate(msg.tool_calls))
    return Message(role=msg.role, content=_content(msg, index),
                   name=_given(msg.name), tool_calls=calls,
                   tool_call_id=_given(msg.tool_call_id), reasoning=_given(msg.reasoning_content))


def _given(value: Any) -> Any:
    return None if value is msgspec.UNSET else value


def _tool(tool: dict[str, Any], where: str) -> Tool:
    """``{"type": "function", "function": {"name", "description"?, "parameters"?,
    "strict"?}}``, each part checked (a 400 names the field, as Responses does): a tool
    the template cannot render must not reach it."""
    if tool.get("type", "function") != "function":
        raise InvalidRequest(f"'{where}.type' must be \"function\"", param=f"{where}.type")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise InvalidRequest(f"'{where}.function' must be an object with a 'name'",
                             param=f"{where}.function")
    name = fn.get("name")
    if not isinstance(name, str) or not name.strip():
        raise InvalidRequest(f"'{where}.function.name' must be a non-empty string",
                             param=f"{where}.function.name")
    for key, kind, what in (("description", str, "a string"),
                            ("parameters", dict, "a JSON Schema object"),
                            ("strict", bool, "a boolean")):
        if fn.get(key) is not None and not isinstance(fn[key], kind):
            raise InvalidRequest(f"'{where}.function.{key}' must be {what}",
                                 param=f"{where}.function.{key}")
    return Tool(name=name, definition=tool)


def _tool_choice(value: Any) -> ToolChoice:
    """OpenAI's forms: absent, ``"auto"``, ``"none"``, ``"required"`` or
    ``{"type": "function", "function": {"name": ...}}``; anything else is a 400."""
    if value is None:
        return "auto"
    if isinstance(value, str) and value in ("auto", "none", "required"):
        return value  # type: ignore[return-value]
    if isinstance(value, dict):
        if value.get("type") != "function":
            raise InvalidRequest("'tool_choice' type must be \"function\"", param="tool_choice")
        fn = value.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise InvalidRequest("'tool_choice' must name a function: {\"type\": \"function\", "
                                 "\"function\": {\"name\": ...}}", param="tool_choice")
        return FunctionChoice(name=name)
    raise InvalidRequest("'tool_choice' must be \"auto\", \"none\", \"required\" or "
                         "{\"type\": \"function\", \"function\": {\"name\": ...}}",
                         param="tool_choice")


def prompt_request(body: ChatCompletionRequest) -> PromptRequest:
    """The chat request's wire fields as the chat layer's typed request (wire shapes are
    checked here; the prompt rules are ``mlxcel.chat.prompt``'s)."""
    return PromptRequest(
        messages=tuple(_message(m, i) for i, m in enumerate(body.messages)),
        tools=tuple(_tool(t, f"tools[{i}]") for i, t in enumerate(body.tools or ())),
        tool_choice=_tool_choice(body.tool_choice),
        template_kwargs=pick_template_kwargs(body.chat_template_kwargs, body.extra_body),
        add_generation_prompt=body.add_generation_prompt,
        continue_final_message=body.continue_final_message, media_options=media_options(body))


def completion_prompt(ctx: AppContext, body: CompletionRequest) -> list[int]:
    """A string, a one-string list, or a list of token ids (blocking work: run it through
    ``prepare``)."""
    tok = ctx.checkpoint.tokenizer
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
    return ctx.checkpoint.tokenizer.decode(list(prompt), skip_special=False)


def turn_options(body: SamplingFields, limit: int | None, limit_field: str, *,
                 logprobs: bool = False, top_logprobs: int = 0,
                 response: Constraint | None = None, lazy: Any = None) -> TurnOptions:
    """The body's generation fields in the chat layer's names."""
    budget = reasoning_budget({k: getattr(body, k) for k in REASONING_BUDGET_ALIASES})
    if body.logit_bias is not None:
        check_openai_range(body.logit_bias)
    return TurnOptions(
        sampling={k: getattr(body, k, None) for k in SAMPLING_DEFAULTS},
        loop={k: getattr(body, k) for k in LOOP_FIELDS}, limit=limit,
        limit_field=limit_field, stop=stop_strings(body.stop), ignore_eos=body.ignore_eos,
        cache_prompt=body.cache_prompt is not False, logprobs=logprobs,
        top_logprobs=top_logprobs, n=body.n, response=response, lazy=lazy,
        reasoning_budget=budget,
        logit_bias=body.logit_bias, return_progress=body.return_progress and body.stream,
        draft=draft_limits(body))

"""Prompt rules shared by every dialect that renders a chat template: typed messages,
tools and template variables in, the rendered prompt's token ids (``PromptInput``) out.

Order: template variables, the generation-prompt flags, media, ``tool_choice``, earlier
reasoning, the adaptation to the template's capabilities (``chat.adapt``), render, the cut
for ``continue_final_message`` (or the assistant prefill appended), tokenize within the
context.

A final assistant message is continued two ways, each as its server does it: asked with
``continue_final_message`` (vLLM's), the whole conversation is rendered and cut at the end
of that message's text; given neither that nor ``add_generation_prompt`` (llama-server's
assistant prefill, on by default there), the turns before it are rendered with the
generation prompt and its text follows as is.
"""

from __future__ import annotations

from typing import Any

import msgspec

from mlxcel.chat.adapt import adapt_messages, adapt_tools, call_example
from mlxcel.chat.cache_marks import boundaries, token_positions
from mlxcel.chat.media import (
    MediaInput,
    expand,
    kind_of,
    lift_tool_media,
    media_parts,
    template_content,
)
from mlxcel.chat.reasoning import prompt_opens
from mlxcel.chat.thinking import drop_earlier_reasoning, knows_reasoning
from mlxcel.chat.tokens import check_length, encode_prompt, encode_prompt_spans
from mlxcel.chat.tool_choice import apply_tool_choice
from mlxcel.errors import CapabilityNotSupported, InvalidRequest
from mlxcel.families.api import ReasoningSpec
from mlxcel.options import RESERVED_TEMPLATE_KEYS
from mlxcel.types.messages import (
    FunctionChoice,
    MediaPart,
    Message,
    PromptInput,
    PromptRequest,
    TextPart,
    Tool,
    ToolCall,
)


def template_kwargs(request: dict[str, Any], server: dict[str, Any] | None) -> dict[str, Any]:
    """A request's template variables over the server's (``--chat-template-kwargs``): a
    request's key wins, a server key the request leaves out stays. Unknown keys pass to
    the template as they are, so a template that understands a new variable can use it;
    the keys the server sets for every render are refused (400)."""
    for key in sorted(RESERVED_TEMPLATE_KEYS & request.keys()):
        raise InvalidRequest(f"chat_template_kwargs.{key} is set by the server and cannot be "
                             "overridden", param=f"chat_template_kwargs.{key}")
    return {**(server or {}), **request}


def pick_template_kwargs(chat_template_kwargs: dict[str, Any] | None,
                         extra_body: dict[str, Any] | None) -> dict[str, Any]:
    """The request's template variables from the first of the spec's three forms it uses:
    a top-level ``chat_template_kwargs`` (llama.cpp), ``extra_body.chat_template_kwargs``
    (vLLM, the OpenAI SDK), then DashScope's flat ``extra_body.preserve_thinking`` (that
    key only). Clients of each server send their own form, so all three are read."""
    if chat_template_kwargs is not None:
        return dict(chat_template_kwargs)
    extra = extra_body or {}
    if isinstance(extra.get("chat_template_kwargs"), dict):
        return dict(extra["chat_template_kwargs"])
    if "preserve_thinking" in extra:
        return {"preserve_thinking": extra["preserve_thinking"]}
    return {}


def refuse_media(messages: tuple[Message, ...]) -> None:
    """Media parts reaching a render that was given no fetched media are refused (501)
    naming the first one: only ``chat.media``'s path fetches and decodes them."""
    for path, part in media_parts(messages):
        kind = part.wire_type or kind_of(part)
        raise CapabilityNotSupported(f"{kind_of(part)} input is not supported here: {path} "
                                     f"is '{kind}'", param=path)


def prefills(request: PromptRequest) -> bool:
    """Whether the final assistant message is prefilled llama-server's way (module
    docstring): neither flag given and the last message the assistant's. Two assistant
    messages at the end are refused, as llama-server refuses them."""
    messages = request.messages
    if request.continue_final_message is not None or request.add_generation_prompt is not None \
            or not messages or messages[-1].role != "assistant":
        return False
    if len(messages) > 1 and messages[-2].role == "assistant":
        raise InvalidRequest("Cannot have 2 or more assistant messages at the end of the "
                             "list", param="messages")
    return True


def generation_prompt(request: PromptRequest) -> bool:
    """``add_generation_prompt`` (default true) and ``continue_final_message`` (default
    false), as vLLM names and reads them: not both true, and continuing needs a final
    assistant message; continuing renders without the generation prompt (a prefill,
    ``prefills``, renders the turns before it with one)."""
    param = "continue_final_message"
    if not request.continue_final_message:
        return request.add_generation_prompt is not False
    if request.add_generation_prompt:
        raise InvalidRequest("'continue_final_message' and 'add_generation_prompt' cannot both "
                             "be true", param=param)
    if not request.messages or request.messages[-1].role != "assistant":
        raise InvalidRequest("'continue_final_message' needs the last message to be an "
                             "assistant message", param=param)
    return False


def continue_cut(text: str, final: Message) -> str:
    """The rendered text up to the end of the final message's content, so the model goes on
    with it; as transformers does, the content is found (its last occurrence) without its
    surrounding whitespace, and a template that does not render it verbatim is a 400."""
    param = "continue_final_message"
    content = final.text or ""
    core = content.strip()
    if not core:
        raise InvalidRequest("'continue_final_message' needs text in the final assistant "
                             "message to continue", param=param)
    at = text.rfind(core)
    if at < 0:
        raise InvalidRequest("'continue_final_message': the chat template does not render the "
                             "final assistant message's content verbatim, so it cannot be "
                             "continued", param=param)
    lead = content.lstrip()
    keeps_trailing = text[at:at + len(lead)] == lead
    return text[:at + (len(lead) if keeps_trailing else len(core))]


def _call(call: ToolCall) -> dict[str, Any]:
    item: dict[str, Any] = {"id": call.id} if call.id is not None else {}
    return {**item, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def template_message(message: Message) -> dict[str, Any]:
    """A message as Hugging Face templates read it: content as one string, or as typed
    parts where it has media (``chat.media.template_content``)."""
    typed = any(isinstance(p, MediaPart) for p in message.content or ())
    item: dict[str, Any] = {"role": message.role,
                            "content": template_content(message) if typed else message.text}
    if message.name is not None:
        item["name"] = message.name
    if message.tool_calls is not None:
        item["tool_calls"] = [_call(c) for c in message.tool_calls]
    if message.tool_call_id is not None:
        item["tool_call_id"] = message.tool_call_id
    if message.reasoning is not None:
        item["reasoning_content"] = message.reasoning
    return item


def system_turns(messages: tuple[Message, ...], template_source: str
                 ) -> tuple[Message, ...]:
    """OpenAI's ``developer`` role is a system message to a template that does not name it
    (most reject an unknown role), and the leading system messages become one, joined by a
    blank line: templates take one system message, first, while clients often send
    instructions and a system message both."""
    if "developer" not in template_source:
        messages = tuple(msgspec.structs.replace(m, role="system") if m.role == "developer"
                         else m for m in messages)
    lead = 0
    while lead < len(messages) and messages[lead].role == "system":
        lead += 1
    if lead < 2:
        return messages
    text = "\n\n".join(m.text for m in messages[:lead] if m.text)
    return (Message(role="system", content=(TextPart(text=text),)), *messages[lead:])


def render_chat(request: PromptRequest, template: Any,
                server_kwargs: dict[str, Any] | None = None, media: bool = False) -> str:
    """The prompt text of ``request`` through ``template`` (a ``ChatTemplate``), with the
    server's template variables under the request's; ``media``: its media parts are
    printed as the template prints them (the caller checked that the model takes them)."""
    return _render(request, template, server_kwargs, media=media)[0]


def render_marked(request: PromptRequest, template: Any,
                  server_kwargs: dict[str, Any] | None = None
                  ) -> tuple[str, list[tuple[int, str]]]:
    """``render_chat``, with the character offsets of the prompt's message boundaries
    (``chat.cache_marks.boundaries``)."""
    text, _, marks = _render(request, template, server_kwargs, marks=True)
    return text, marks


def _render(request: PromptRequest, template: Any, server_kwargs: dict[str, Any] | None,
            marks: bool = False, media: bool = False
            ) -> tuple[str, tuple[Tool, ...], list[tuple[int, str]]]:
    """The prompt text, its tools, and (``marks``) its message boundaries
    (``chat.cache_marks``); ``media``: media parts are rendered (else refused)."""
    kwargs = template_kwargs(request.template_kwargs, server_kwargs)
    if not request.messages:
        raise InvalidRequest("'messages' must contain at least one message", param="messages")
    add_generation = generation_prompt(request)
    prefill = prefills(request)
    messages = request.messages[:-1] if prefill else request.messages
    if media:
        messages = lift_tool_media(messages)
    else:
        refuse_media(messages)
    messages, tools = apply_tool_choice(system_turns(messages, template.source),
                                        request.tools, request.tool_choice)
    if knows_reasoning(template.source) and kwargs.get("preserve_thinking") is not True:
        messages = drop_earlier_reasoning(messages)
    definitions = [t.definition for t in tools]
    caps = template.caps
    example = call_example(template) if definitions and not caps.tools else ""
    adapted = adapt_messages([template_message(m) for m in messages], definitions, caps,
                             example)
    shown = adapt_tools(definitions, caps)
    text = template.render(adapted, tools=shown, add_generation_prompt=add_generation,
                           **kwargs)
    if request.continue_final_message:
        return continue_cut(text, messages[-1]), tuple(tools), []
    if prefill:
        return text + (request.messages[-1].text or ""), tuple(tools), []
    found = boundaries(template, adapted, shown, kwargs, text) if marks else []
    return text, tuple(tools), found


def prompt_input(request: PromptRequest, engine: Any, *,
                 server_kwargs: dict[str, Any] | None = None,
                 reasoning: ReasoningSpec | None = None,
                 media: MediaInput | None = None) -> PromptInput:
    """Render with the loaded checkpoint's template and tokenize within ``engine``'s
    context window (blocking work: a dialect runs it through ``dialects.prepare``).
    ``reasoning`` is the checkpoint's reasoning spec, when it has one; ``media``: the
    request's fetched media parts (``chat.media``), decoded here and expanded by the
    model into its own tokens."""
    marks = bool(getattr(engine, "cache_marks", False))
    items = media.decode() if media is not None else []
    text, tools, chars = _render(request, engine.checkpoint.template, server_kwargs, marks,
                                 media=media is not None)
    if marks:
        ids, spans = encode_prompt_spans(engine, text, "messages", add_special=False)
        cache_marks = token_positions(spans, chars)
    else:
        ids, cache_marks = encode_prompt(engine, text, "messages", add_special=False), ()
    expanded = None
    if media is not None:
        expanded, cache_marks = expand(engine.checkpoint.model, list(ids), items,
                                       media.options, cache_marks,
                                       tuple(f.part for f in media.fetched))
        ids = list(expanded.token_ids)
        check_length(engine, len(ids), "messages")
    forced = request.tool_choice == "required" or isinstance(request.tool_choice,
                                                             FunctionChoice)
    return PromptInput(token_ids=tuple(ids), tools=tools, forced=forced and bool(tools),
                       reasoning_open=prompt_opens(text, reasoning), cache_marks=cache_marks,
                       media=expanded)

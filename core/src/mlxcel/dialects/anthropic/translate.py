"""Anthropic request -> the chat layer's typed request (``PromptRequest``) and
``TurnOptions``. Wire shapes are checked here, each refusal a 400 naming the field; the
prompt rules (tool choice, media, earlier reasoning) are the chat layer's.

Turns map as the chat templates expect them: the top-level ``system`` is the leading
system message; a ``system`` turn inside ``messages`` is folded into the next user turn
(else the one before it); each ``tool_result`` block becomes a ``tool`` message; an
assistant turn's ``tool_use`` blocks are its tool calls and its ``thinking`` blocks its
reasoning. A final assistant turn is continued (Anthropic's prefill). A plain-text
``document`` and a ``search_result`` block are their text, after their title.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from mlxcel.chat.prompt import pick_template_kwargs
from mlxcel.chat.request import MAX_STOP_STRINGS, stop_strings
from mlxcel.dialects.media_options import media_options
from mlxcel.dialects.turn import TurnOptions
from mlxcel.errors import InvalidRequest
from mlxcel.types import messages as mt

from .schemas import CountTokensRequest, InputMessage, MessagesRequest

Recall = Callable[[mt.Message], "str | None"]  # an assistant turn -> its remembered reasoning
THINKING_ON = ("enabled", "adaptive", "between_tools")
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed")
# the blocks a user turn and a tool result hold (documents and search results as text)
RESULT_BLOCKS = ("text", "image", "document", "search_result")


def _bad(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def _string(block: dict[str, Any], key: str, where: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise _bad(f"{where}.{key} must be a string", f"{where}.{key}")
    return value


def _image(block: dict[str, Any], where: str) -> mt.ImagePart:
    """A ``base64`` or ``url`` image source as the client gave it (the chat layer decides
    whether the model takes images)."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        return mt.ImagePart(data=_string(source, "data", f"{where}.source"),
                            format=_string(source, "media_type", f"{where}.source"),
                            wire_type="image", path=where)
    if kind == "url":
        return mt.ImagePart(url=_string(source, "url", f"{where}.source"), wire_type="image",
                            path=where)
    raise _bad(f"{where}.source must be a \"base64\" or \"url\" image source",
               f"{where}.source")


def _texts(blocks: Any, where: str) -> list[str]:
    if not isinstance(blocks, list):
        raise _bad(f"{where} must be a list of text blocks", where)
    out = []
    for k, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise _bad(f"{where}[{k}].type must be \"text\"", f"{where}[{k}].type")
        out.append(_string(block, "text", f"{where}[{k}]"))
    return out


def _titled(block: dict[str, Any], where: str, body: list[str]) -> mt.TextPart:
    """A document's or a search result's text, after its title and context when given
    (they tell the model what the text is; citations are not made)."""
    head = []
    for key in ("title", "context"):
        if block.get(key) is not None:
            head.append(_string(block, key, where))
    return mt.TextPart(text="\n\n".join(head + body))


def _document(block: dict[str, Any], where: str) -> mt.TextPart:
    """A ``text`` or ``content`` document as text; a PDF (``base64``, ``url``) or a
    ``file`` id is refused, since nothing here reads PDFs or holds files."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "text":
        return _titled(block, where, [_string(source, "data", f"{where}.source")])
    if kind == "content":
        content = source.get("content")
        if isinstance(content, str):
            return _titled(block, where, [content])
        return _titled(block, where, _texts(content, f"{where}.source.content"))
    raise _bad(f"{where}.source: only plain-text documents are supported (source \"text\" or "
               f"\"content\"); send a PDF's text instead", f"{where}.source")


def _part(block: Any, where: str, allowed: tuple[str, ...]) -> mt.Part:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind not in allowed:
        kinds = " or ".join(f'"{kind}"' for kind in allowed)
        raise _bad(f"{where}.type must be {kinds}", f"{where}.type")
    if kind == "text":
        return mt.TextPart(text=_string(block, "text", where))
    if kind == "document":
        return _document(block, where)
    if kind == "search_result":
        return _titled(block, where, [_string(block, "source", where),
                                      *_texts(block.get("content"), f"{where}.content")])
    return _image(block, where)


def _tool_result(block: dict[str, Any], where: str) -> mt.Message:
    content = block.get("content", "")
    if isinstance(content, str):
        parts: tuple[mt.Part, ...] = (mt.TextPart(text=content),)
    elif isinstance(content, list):
        parts = tuple(_part(b, f"{where}.content[{k}]", RESULT_BLOCKS)
                      for k, b in enumerate(content))
    else:
        raise _bad(f"{where}.content must be a string or a list of blocks", f"{where}.content")
    return mt.Message(role="tool", content=parts,
                      tool_call_id=_string(block, "tool_use_id", where))


def _user_turns(blocks: list[dict[str, Any]], where: str) -> list[mt.Message]:
    """A user turn's blocks in order: its text and images, split around each
    ``tool_result`` (a ``tool`` message of its own)."""
    out: list[mt.Message] = []
    parts: list[mt.Part] = []
    for j, block in enumerate(blocks):
        at = f"{where}[{j}]"
        if isinstance(block, dict) and block.get("type") == "tool_result":
            if parts:
                out.append(mt.Message(role="user", content=tuple(parts)))
                parts = []
            out.append(_tool_result(block, at))
        else:
            parts.append(_part(block, at, (*RESULT_BLOCKS, "tool_result")))
    if parts or not out:
        out.append(mt.Message(role="user", content=tuple(parts)))
    return out


def _tool_use(block: dict[str, Any], where: str) -> mt.ToolCall:
    arguments = block.get("input", {})
    if not isinstance(arguments, dict):
        raise _bad(f"{where}.input must be an object", f"{where}.input")
    call_id = block.get("id")
    return mt.ToolCall(id=call_id if isinstance(call_id, str) else None,
                       name=_string(block, "name", where), arguments=arguments)


def _assistant(blocks: list[dict[str, Any]], where: str) -> tuple[mt.Message, bool]:
    """The assistant turn, and whether it carried thinking (a ``thinking`` or an opaque
    ``redacted_thinking`` block, which is accepted and not rendered)."""
    parts: list[mt.Part] = []
    calls: list[mt.ToolCall] = []
    reasoning: list[str] = []
    thought = False
    for j, block in enumerate(blocks):
        at = f"{where}[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_use":
            calls.append(_tool_use(block, at))
        elif kind in ("thinking", "redacted_thinking"):
            thought = True
            if kind == "thinking":
                reasoning.append(_string(block, "thinking", at))
        else:
            parts.append(_part(block, at, ("text", "tool_use", "thinking")))
    content = tuple(parts) if parts or not calls else None
    return mt.Message(role="assistant", content=content, tool_calls=tuple(calls) or None,
                      reasoning="".join(reasoning) or None), thought


def _system_text(value: str | list[dict[str, Any]], where: str) -> str:
    if isinstance(value, str):
        return value
    return "".join(_part(b, f"{where}[{j}]", ("text",)).text  # type: ignore[union-attr]
                   for j, b in enumerate(value))


def _joined(message: mt.Message, text: str, before: bool) -> mt.Message:
    extra = mt.TextPart(text=text + "\n\n" if before else "\n\n" + text)
    parts = (extra, *(message.content or ())) if before else (*(message.content or ()), extra)
    return msgspec.structs.replace(message, content=parts)


def _fold_system(turns: list[mt.Message | str]) -> list[mt.Message]:
    """System text (``str`` items) joins the next user turn; without one before the next
    assistant turn, the user turn right before it (else it becomes a user turn)."""
    out: list[mt.Message] = []
    pending: list[str] = []

    def attach() -> None:
        text = "\n\n".join(pending)
        if out and out[-1].role == "user":
            out[-1] = _joined(out[-1], text, before=False)
        else:
            out.append(mt.Message(role="user", content=(mt.TextPart(text=text),)))
        pending.clear()

    for turn in turns:
        if isinstance(turn, str):
            pending.append(turn)
            continue
        if pending and turn.role == "user":
            turn = _joined(turn, "\n\n".join(pending), before=True)
            pending.clear()
        elif pending and turn.role == "assistant":
            attach()
        out.append(turn)
    if pending:
        attach()
    return out


def _turns(messages: list[InputMessage], recall: Recall | None) -> list[mt.Message]:
    turns: list[mt.Message | str] = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}].content"
        blocks = [{"type": "text", "text": msg.content}] if isinstance(msg.content, str) \
            else msg.content
        if msg.role == "system":
            turns.append(_system_text(msg.content, where))
        elif msg.role == "user":
            turns += _user_turns(blocks, where)
        else:
            turn, thought = _assistant(blocks, where)
            if recall is not None and not thought:
                turn = msgspec.structs.replace(turn, reasoning=recall(turn))
            turns.append(turn)
    return _fold_system(turns)


def _tools(tools: list[dict[str, Any]] | None) -> tuple[mt.Tool, ...]:
    """Client tools in the function shape templates read, keys in the order OpenAI's
    shape has them (name, description, parameters), so the same tools render the same
    prompt from every dialect; server tools (no ``input_schema``: hosted web search,
    code execution, ...) are dropped, since nothing here runs them."""
    out: list[mt.Tool] = []
    for i, tool in enumerate(tools or ()):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _bad(f"{where} must be an object", where)
        if "input_schema" not in tool:
            continue
        name = _string(tool, "name", where)
        schema = tool["input_schema"]
        if not isinstance(schema, dict):
            raise _bad(f"{where}.input_schema must be an object", f"{where}.input_schema")
        fn: dict[str, Any] = {"name": name}
        if isinstance(tool.get("description"), str):
            fn["description"] = tool["description"]
        fn["parameters"] = schema
        out.append(mt.Tool(name=name, definition={"type": "function", "function": fn}))
    return tuple(out)


def _tool_choice(value: dict[str, Any] | None) -> mt.ToolChoice:
    """``auto``, ``any`` (a call is required), ``tool`` (that one), ``none``;
    ``disable_parallel_tool_use`` is accepted."""
    kind = None if value is None else value.get("type")
    if value is None or kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool":
        return mt.FunctionChoice(name=_string(value, "name", "tool_choice"))
    raise _bad("tool_choice.type must be \"auto\", \"any\", \"tool\" or \"none\"",
               "tool_choice.type")


def thinking_on(body: CountTokensRequest) -> bool:
    return body.thinking is not None and body.thinking.get("type") in THINKING_ON


def thinking_budget(body: CountTokensRequest) -> int | None:
    """``budget_tokens`` of ``{"type": "enabled"}`` (a positive integer); the other kinds
    leave the budget to the server."""
    thinking = body.thinking
    if thinking is None:
        return None
    kind = thinking.get("type")
    if kind not in (*THINKING_ON, "disabled"):
        raise _bad("thinking.type must be \"enabled\", \"adaptive\" or \"disabled\"",
                   "thinking.type")
    if kind != "enabled":
        return None
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise _bad("thinking.budget_tokens must be a positive integer",
                   "thinking.budget_tokens")
    return budget


def _template_kwargs(body: CountTokensRequest) -> dict[str, Any]:
    """The request's template variables; ``thinking`` sets ``enable_thinking`` unless
    they set it themselves."""
    kwargs = pick_template_kwargs(body.chat_template_kwargs, body.extra_body)
    if body.thinking is not None and "enable_thinking" not in kwargs:
        kwargs["enable_thinking"] = thinking_on(body)
    return kwargs


def prompt_request(body: CountTokensRequest, recall: Recall | None = None) -> mt.PromptRequest:
    """The typed request; ``recall`` gives back the reasoning of an assistant turn that
    was resent without its thinking block (the thinking memory)."""
    thinking_budget(body)  # refuse a bad ``thinking`` before rendering
    if not body.messages:
        raise _bad("messages must hold at least one message", "messages")
    messages = list(_turns(body.messages, recall))
    if body.system is not None:
        system = _system_text(body.system, "system")
        messages.insert(0, mt.Message(role="system", content=(mt.TextPart(text=system),)))
    prefill = bool(messages) and messages[-1].role == "assistant"
    tools, choice = _tools(body.tools), _tool_choice(body.tool_choice)
    if choice == "required" and not tools:
        raise _bad("tool_choice \"any\" needs at least one tool with an input_schema in "
                   "'tools'", "tool_choice")
    return mt.PromptRequest(messages=tuple(messages), tools=tools, tool_choice=choice,
                            template_kwargs=_template_kwargs(body),
                            continue_final_message=prefill, media_options=media_options(body))


def turn_options(body: MessagesRequest) -> TurnOptions:
    """The generation fields in the chat layer's names."""
    stops = body.stop_sequences or []
    if len(stops) > MAX_STOP_STRINGS:
        raise _bad(f"stop_sequences takes at most {MAX_STOP_STRINGS} strings",
                   "stop_sequences")
    return TurnOptions(
        sampling={k: getattr(body, k) for k in SAMPLING_FIELDS}, limit=body.max_tokens,
        limit_field="max_tokens", stop=stop_strings(stops), ignore_eos=body.ignore_eos,
        cache_prompt=body.cache_prompt is not False, reasoning_budget=thinking_budget(body))

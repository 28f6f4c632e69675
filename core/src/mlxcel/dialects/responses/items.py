"""Responses input items: checked once when they arrive (``normalize``, a 400 naming the
item), then read as the chat layer's messages (``messages``).

The item forms: a message (``type: "message"``, or no type and a role), whose content is
a string or parts (``input_text``, ``input_image``, ``input_audio``, and on an assistant
message ``output_text`` and ``refusal``, so that a previous ``response.output`` can be
sent back); ``function_call`` and ``function_call_output``; ``reasoning`` (the reasoning
of the assistant output that follows it); ``compaction`` (``compaction.replay``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from mlxcel.dialects.jsondepth import call_arguments
from mlxcel.errors import InvalidRequest
from mlxcel.types.messages import AudioPart, ImagePart, Message, Part, TextPart, ToolCall

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")
INSTRUCTION_ROLES = ("system", "developer")


def _fail(message: str, where: str) -> InvalidRequest:
    return InvalidRequest(f"'{where}' {message}", param=where)


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise _fail("must be a string", f"{where}.{key}")
    return value


def _part(part: Any, where: str) -> dict[str, Any]:
    if isinstance(part, str):
        return {"type": "input_text", "text": part}
    if not isinstance(part, dict):
        raise _fail("must be a content part object with a 'type'", where)
    kind = part.get("type")
    if kind in TEXT_PARTS:
        _string(part, "text", where)
    elif kind == "refusal":
        _string(part, "refusal", where)
    elif kind == "input_image":
        return _image(part, where)
    elif kind == "input_file":
        raise InvalidRequest(f"'{where}': 'input_file' parts are not supported; send the "
                             "file's text as 'input_text'", param=f"{where}.type")
    elif kind != "input_audio":
        raise _fail("has an unknown content part type", f"{where}.type")
    return part


def _image(part: dict[str, Any], where: str) -> dict[str, Any]:
    """``input_image``: ``image_url`` (a URL or a data: URI; chat completions' ``{"url":
    ...}`` is read too) as a string; ``detail`` is accepted and changes nothing (the
    model's processor sizes the image). A ``file_id`` names an upload of OpenAI's Files
    API, which this server does not have: 400, never a silent text-only turn."""
    if part.get("file_id") is not None:
        raise InvalidRequest(f"'{where}.file_id': file ids are not supported (this server "
                             "has no Files API); send the image as 'image_url', a URL or "
                             "a data: URI", param=f"{where}.file_id")
    url = part.get("image_url")
    if isinstance(url, dict):
        url = url.get("url")
    if not isinstance(url, str) or not url:
        raise _fail("must be a URL or a data: URI string", f"{where}.image_url")
    return {**part, "image_url": url}


def _content(value: Any, role: str, where: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"type": "output_text" if role == "assistant" else "input_text",
                 "text": value}]
    if not isinstance(value, list):
        raise _fail("must be a string or a list of content parts", where)
    return [_part(part, f"{where}[{j}]") for j, part in enumerate(value)]


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ROLES:
        raise _fail(f"must be one of {', '.join(ROLES)}", f"{where}.role")
    return {**item, "type": "message",
            "content": _content(item.get("content"), role, f"{where}.content")}


def _function_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    for key in ("call_id", "name", "arguments"):
        _string(item, key, where)
    return item


def _function_output(item: dict[str, Any], where: str) -> dict[str, Any]:
    _string(item, "call_id", where)
    output = item.get("output")
    if isinstance(output, str):
        return item
    return {**item, "output": _content(output, "tool", f"{where}.output")}


def _reasoning(item: dict[str, Any], where: str) -> dict[str, Any]:
    for key in ("content", "summary"):
        value = item.get(key)
        if value is not None and not (isinstance(value, list) and all(
                isinstance(p, dict) and isinstance(p.get("text"), str) for p in value)):
            raise _fail("must be a list of parts with 'text'", f"{where}.{key}")
    return item


def normalize(item: Any, where: str) -> dict[str, Any]:
    """One input item, checked, with its message ``type`` and content parts made explicit
    (a compaction item's capsule is checked by ``compaction.open_capsule``)."""
    if not isinstance(item, dict):
        raise _fail("must be an input item object", where)
    kind = item.get("type")
    if kind is None and "role" in item or kind == "message":
        return _message(item, where)
    if kind == "function_call":
        return _function_call(item, where)
    if kind == "function_call_output":
        return _function_output(item, where)
    if kind == "reasoning":
        return _reasoning(item, where)
    if kind == "compaction":
        _string(item, "encrypted_content", where)
        return item
    raise _fail("has an unsupported item type (supported: message, function_call, "
                "function_call_output, reasoning, compaction)", f"{where}.type")


def input_items(value: str | list[Any] | None, where: str = "input") -> list[dict[str, Any]]:
    """A request's ``input``: a string is one user message."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": value}]}]
    return [normalize(item, f"{where}[{i}]") for i, item in enumerate(value)]


# -- items -> messages -------------------------------------------------------------------
def is_instruction(item: dict[str, Any]) -> bool:
    return item.get("type") == "message" and item.get("role") in INSTRUCTION_ROLES


def is_user(item: dict[str, Any]) -> bool:
    return item.get("type") == "message" and item.get("role") == "user"


def part_text(part: dict[str, Any]) -> str:
    return part.get("refusal", "") if part.get("type") == "refusal" else part.get("text", "")


def _chat_part(part: dict[str, Any]) -> Part:
    kind = part["type"]
    if kind == "input_image":
        url = part.get("image_url")
        return ImagePart(url=url if isinstance(url, str) else None, wire_type=kind)
    if kind == "input_audio":
        audio = part.get("input_audio")
        audio = audio if isinstance(audio, dict) else {}
        return AudioPart(data=audio.get("data"), format=audio.get("format"), wire_type=kind)
    return TextPart(text=part_text(part))


def _parts(value: Any) -> tuple[Part, ...]:
    if isinstance(value, str):
        return (TextPart(text=value),)
    return tuple(_chat_part(p) for p in value)


def reasoning_text(item: dict[str, Any]) -> str:
    """A reasoning item's text: its ``reasoning_text`` parts, else its summary."""
    parts = item.get("content") or item.get("summary") or []
    return "".join(p["text"] for p in parts)


def _add_call(out: list[Message], call: ToolCall, reasoning: str | None) -> None:
    last = out[-1] if out else None
    if last is not None and last.role == "assistant":
        out[-1] = msgspec.structs.replace(last, tool_calls=(*(last.tool_calls or ()), call))
    else:
        out.append(Message(role="assistant", tool_calls=(call,), reasoning=reasoning))


def messages(items: list[dict[str, Any]],
             sources: list[int] | None = None) -> list[Message]:
    """Normalized items (compaction replayed) as messages: the function calls after an
    assistant message join it; a reasoning item goes to the assistant output right after
    it (and is dropped when none follows). ``sources`` gets, per message, the index of
    the item it starts at (for errors that name a message)."""
    out: list[Message] = []
    reasoning: str | None = None
    for at, item in enumerate(items):
        kind = item["type"]
        if kind == "reasoning":
            reasoning = (reasoning or "") + reasoning_text(item)
            continue
        if kind == "message":
            out.append(Message(role=item["role"], content=_parts(item["content"]),
                               reasoning=reasoning if item["role"] == "assistant" else None))
        elif kind == "function_call":
            call = ToolCall(id=item["call_id"], name=item["name"],
                            arguments=call_arguments(item["arguments"], "input.arguments"))
            _add_call(out, call, reasoning)
        elif kind == "function_call_output":
            out.append(Message(role="tool", content=_parts(item["output"]),
                               tool_call_id=item["call_id"]))
        reasoning = None
        if sources is not None:
            sources.extend([at] * (len(out) - len(sources)))
    return out

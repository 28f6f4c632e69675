"""A conversation reshaped to what the model's template supports (its ``TemplateCaps``),
the way llama.cpp's template layer fills the gaps, for every dialect alike.

It works on the message dicts made for one render (``chat.prompt.template_message``), so
the request itself never changes. In order:

1. reasoning goes in the field the template reads (``reasoning_content`` or ``thinking``);
2. a call's ``arguments`` become what the template prints: the object, or its JSON text;
3. tool-call ids the template would refuse are replaced consistently (``chat.call_ids``);
   where it shows only the first call of a turn (gpt-oss), a turn's calls become turns
   of one call each, each followed by its results (a template that refuses several
   calls, Llama 3.1's, keeps its refusal: a 400 that quotes it);
4. where the template has no tools, the tool list and an example call go into the system
   prompt; where it renders no calls, an assistant turn's calls become its text,
   ``{"tool_calls": [{"name", "arguments", "id"}], "content"}``; where it has no tool
   turn, a result becomes a user turn, ``{"tool_response": {"name", "tool_call_id",
   "content"}}`` (results in a row, and the user text right after them, make one turn,
   since such templates alternate roles);
5. where it has no system role, system text opens the next user turn; so does a later
   system turn where it shows only the first; where it shows the system prompt only in
   the last user turn (Mistral Nemo), a conversation that ends otherwise gets it there;
6. a ``null`` content becomes ``""`` where the template needs a string, and content
   becomes a list of text parts where it needs parts.

The tools reach the template as it reads them (``adapt_tools``): bare functions where it
reads ``tool.name``, with empty descriptions where it fails without one, and not at all
where a tool list makes it fail (they are in the system prompt then).

"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from typing import Any

from mlxcel.chat.call_ids import fitted
from mlxcel.model.chat_template.caps import TemplateCaps

TOOLS_PREAMBLE = "You can call any of the following tools to satisfy the user's requests: "


def _as_json(value: Any) -> Any:
    """A JSON string's value when it holds an object, else the value as it is."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        return parsed if isinstance(parsed, dict) else value
    return value


def _arguments(value: Any, caps: TemplateCaps) -> Any:
    if caps.arguments == "string" and not isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if caps.arguments == "object" or not caps.tool_calls:
        return _as_json(value)
    return value


def _ids(messages: list[dict[str, Any]], rule: str) -> None:
    """Ids the template accepts, on calls and on the results that answer them; a result
    without an id answers the earliest unanswered call."""
    pending: list[str] = []
    for at, message in enumerate(messages):
        for n, call in enumerate(message.get("tool_calls") or ()):
            call["id"] = fitted(call.get("id") or f"mlxcel-{at}-{n}", rule)
            pending.append(call["id"])
        if message["role"] == "tool":
            given = message.get("tool_call_id")
            message["tool_call_id"] = fitted(given, rule) if given else \
                (pending[0] if pending else fitted(f"mlxcel-{at}", rule))
            if message["tool_call_id"] in pending:
                pending.remove(message["tool_call_id"])


def _one_call_per_turn(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each call its own assistant turn, followed by the results that answer it (by id;
    results without ids in order); the turn's content and reasoning stay on its first."""
    out: list[dict[str, Any]] = []
    at = 0
    while at < len(messages):
        message = messages[at]
        at += 1
        calls = message.get("tool_calls") or []
        if len(calls) < 2:
            out.append(message)
            continue
        results = []
        while at < len(messages) and messages[at]["role"] == "tool":
            results.append(messages[at])
            at += 1
        left = list(results)
        later = {k: v for k, v in message.items()
                 if k not in ("content", "reasoning_content", "thinking")}
        for n, call in enumerate(calls):
            turn = message if n == 0 else {**later, "content": ""}
            out.append({**turn, "tool_calls": [call]})
            mine = [r for r in left if r.get("tool_call_id") == call.get("id")] \
                if call.get("id") else left[:1]
            out += mine
            left = [r for r in left if all(r is not m for m in mine)]
        out += left
    return out


def _calls_as_text(message: dict[str, Any]) -> None:
    calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"],
              **({"id": c["id"]} if c.get("id") else {})} for c in message.pop("tool_calls")]
    body: dict[str, Any] = {"tool_calls": calls}
    if message.get("content"):
        body["content"] = message["content"]
    message["content"] = json.dumps(body, indent=2, ensure_ascii=False)


def _response_as_text(message: dict[str, Any]) -> dict[str, Any]:
    response = {k: message[k] for k in ("name", "tool_call_id") if message.get(k)}
    response["content"] = message.get("content")
    return {"role": "user",
            "content": json.dumps({"tool_response": response}, indent=2, ensure_ascii=False),
            "mlxcel_tool_response": True}


def _tool_turns(messages: list[dict[str, Any]], caps: TemplateCaps) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.get("tool_calls") and not caps.tool_calls:
            _calls_as_text(message)
        last = out[-1] if out else None
        if message["role"] == "tool" and not caps.tool_responses:
            message = _response_as_text(message)
            if last is not None and last.get("mlxcel_tool_response"):
                message["content"] = f"{last['content']}\n{message['content']}"
                out.pop()
        elif message["role"] == "user" and last is not None \
                and last.get("mlxcel_tool_response") and isinstance(message["content"], str):
            message = dict(message, content=f"{last['content']}\n{message['content']}")
            out.pop()
        out.append(message)
    for message in out:
        message.pop("mlxcel_tool_response", None)
    return out


def _add_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0], content=f"{messages[0].get('content') or ''}{text}")
        return [first, *messages[1:]]
    return [{"role": "system", "content": text.lstrip("\n")}, *messages]


def _fold_system(messages: list[dict[str, Any]], keep_first: bool) -> list[dict[str, Any]]:
    """System text opens the next user turn (a line break between); with no user turn
    after it, it is a user turn of its own before the next other turn or at the end.
    ``keep_first``: a leading system turn stays as it is."""
    out: list[dict[str, Any]] = []
    pending = ""
    for at, message in enumerate(messages):
        if message["role"] == "system" and not (keep_first and at == 0):
            text = message.get("content") or ""
            pending = f"{pending}\n{text}" if pending and text else pending or text
            continue
        if pending and message["role"] == "user":
            content = message.get("content") or ""
            message = dict(message, content=f"{pending}\n{content}" if content else pending)
            pending = ""
        elif pending:
            out.append({"role": "user", "content": pending})
            pending = ""
        out.append(message)
    if pending:
        out.append({"role": "user", "content": pending})
    return out


def _system_to_last_user(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The leading system text opens the last user turn, as the template itself places
    it when the conversation ends with that turn."""
    last = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last is None or not isinstance(messages[last].get("content"), str):
        return messages
    text = messages[0].get("content") or ""
    out = messages[1:]
    out[last - 1] = dict(out[last - 1], content=f"{text}\n\n{out[last - 1]['content']}")
    return out


def _described(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return schema
    props = schema.get("properties")
    if not isinstance(props, dict):
        return schema
    return {**schema, "properties": {
        k: {"description": "", **v} if isinstance(v, dict) else v for k, v in props.items()}}


def adapt_tools(tools: list[dict[str, Any]], caps: TemplateCaps) -> list[dict[str, Any]] | None:
    """The tool list as the template reads it (None: it is not given the tools)."""
    if not tools or caps.tools_fail:
        return None
    out = []
    for tool in tools:
        fn = tool.get("function")
        if isinstance(fn, dict) and caps.tool_descriptions:
            fn = {"description": "", **fn, "parameters": _described(fn.get("parameters"))}
            tool = {**tool, "function": fn}
        out.append(fn if caps.flat_tools and isinstance(fn, dict) else tool)
    return out


def adapt_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                   caps: TemplateCaps, example: str = "") -> list[dict[str, Any]]:
    """``messages`` (dicts this render owns) in the shape ``caps`` asks for; ``example``
    is the template's own rendering of a call, shown where it has no tools."""
    for message in messages:
        if "reasoning_content" in message and caps.reasoning_field == "thinking":
            message["thinking"] = message.pop("reasoning_content")
        for call in message.get("tool_calls") or ():
            call["function"]["arguments"] = _arguments(call["function"]["arguments"], caps)
    if caps.call_ids != "any":
        _ids(messages, caps.call_ids)
    if caps.tool_calls and not caps.parallel_tool_calls and not caps.refuses_parallel_calls:
        messages = _one_call_per_turn(messages)
    if tools and not caps.tools:
        listing = json.dumps(tools, indent=2, ensure_ascii=False)
        shown = f"Example tool call syntax:\n\n{example}\n\n" if example else ""
        messages = _add_system(messages, f"\n\n{TOOLS_PREAMBLE}{listing}\n\n{shown}")
    messages = _tool_turns(messages, caps)
    if not caps.system_role or not caps.later_system:
        messages = _fold_system(messages, keep_first=caps.system_role)
    if caps.system_at_last_user and messages and messages[0]["role"] == "system" \
            and messages[-1]["role"] != "user":
        messages = _system_to_last_user(messages)
    for message in messages:
        if message.get("content") is None and caps.non_null_content:
            message["content"] = ""
        if caps.typed_content and isinstance(message.get("content"), str):
            message["content"] = [{"type": "text", "text": message["content"]}]
    return messages


@lru_cache(maxsize=8)
def call_example(template: Any) -> str:
    """How ``template`` (adapted to its caps) renders an assistant turn that calls a tool:
    the text after the prompt that leads to it (llama.cpp shows the same). Where that
    prompt is not a prefix of the turn, the text after what they share, or, where the
    template renders no calls, the generic JSON the call becomes."""
    user = {"role": "user", "content": "Hey"}
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1___", "type": "function",
         "function": {"name": "tool_name", "arguments": {"arg1": "some_value"}}}]}
    caps = template.caps
    try:
        prefix = template.render_raw(adapt_messages([dict(user)], [], caps),
                                     add_generation_prompt=True)
        full = template.render_raw(adapt_messages([dict(user), json.loads(json.dumps(call))],
                                                  [], caps))
    except Exception:  # noqa: BLE001 - a template that cannot show one gets no example
        return ""
    eos = template.special["eos_token"]
    if not full.startswith(prefix) and eos and prefix.endswith(eos):
        prefix = prefix[:-len(eos)]
    if full.startswith(prefix):
        return full[len(prefix):]
    if caps.tool_calls:  # a generation prompt the turn does not write (R1's "<think>\n")
        return full[len(os.path.commonprefix([prefix, full])):]
    shown = json.loads(json.dumps(call))  # the text the call becomes, without the turn
    _calls_as_text(shown)
    return shown["content"]

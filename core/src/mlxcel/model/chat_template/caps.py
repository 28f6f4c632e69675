"""What a chat template supports, found by rendering probe conversations once at startup,
as llama.cpp's template layer does.

Templates differ in what they accept: some have no system role (Gemma 2), no tools, no
tool turns; some need ``arguments`` as an object (they print it with ``tojson``), others
as a string (they print it as it is); some fail on a ``null`` content; some accept only
9-character alphanumeric tool-call ids (Mistral). Reading the source cannot tell these
apart reliably, rendering can: each probe renders a small conversation with a needle and
looks for it in the output. ``mlxcel.chat.adapt`` then reshapes every request to fit, so
a client sends the conversation its SDK builds and the template gets what it was written
for.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

import msgspec

Arguments = Literal["object", "string", "any"]
CallIds = Literal["any", "alnum9"]
ReasoningField = Literal["reasoning_content", "thinking"]

USER, SYSTEM = "mlxcel-user-needle", "mlxcel-system-needle"
VALUE, RESPONSE, REASONING = "mlxcel-value-needle", "mlxcel-response-needle", \
    "mlxcel-reasoning-needle"
TOOL = "mlxcel_probe_tool"
_LONG_ID, _SHORT_ID = "call_mlxcel_probe_0123456789", "a1B2c3D4e"


class TemplateCaps(msgspec.Struct, frozen=True, kw_only=True):
    """A template's capabilities. ``arguments``: how it needs a call's arguments
    (``object``, ``string`` or ``any``); ``non_null_content``: a turn without content
    must be ``""``; ``typed_content``: content must be a list of text parts;
    ``reasoning_field``: the message field it reads earlier reasoning from (None: it
    carries none); ``call_ids``: ``alnum9`` when it refuses tool-call ids that are not 9
    alphanumeric characters; ``flat_tools``: it reads a tool's ``name`` at the top level,
    not under ``function``; ``tool_descriptions``: it fails on a tool or parameter without
    a ``description``; ``later_system``: it shows a system turn that comes after the
    first; ``system_at_last_user``: it shows the system prompt only inside the last user
    turn, so it loses it when a conversation ends with a tool result (Mistral Nemo);
    ``refuses_parallel_calls``: without ``parallel_tool_calls`` it raises on a turn with
    several calls (Llama 3.1) rather than showing only the first (gpt-oss);
    ``tools_fail``: without ``tools``, it also fails when given a tool list, so it is
    given none."""

    system_role: bool = True
    tools: bool = True
    tool_calls: bool = True
    tool_responses: bool = True
    parallel_tool_calls: bool = True
    arguments: Arguments = "any"
    non_null_content: bool = False
    typed_content: bool = False
    reasoning_field: ReasoningField | None = None
    call_ids: CallIds = "any"
    flat_tools: bool = False
    tool_descriptions: bool = False
    later_system: bool = True
    system_at_last_user: bool = False
    refuses_parallel_calls: bool = False
    tools_fail: bool = False

    def wire(self) -> dict[str, Any]:
        """llama-server's ``chat_template_caps`` names, plus the ones it has no name for."""
        return {
            "supports_system_role": self.system_role, "supports_tools": self.tools,
            "supports_tool_calls": self.tool_calls,
            "supports_tool_responses": self.tool_responses,
            "supports_parallel_tool_calls": self.parallel_tool_calls,
            "requires_object_arguments": self.arguments == "object",
            "requires_string_arguments": self.arguments == "string",
            "requires_non_null_content": self.non_null_content,
            "requires_typed_content": self.typed_content,
            "supports_reasoning": self.reasoning_field is not None,
            "reasoning_field": self.reasoning_field,
            "tool_call_id_format": self.call_ids,
            "requires_flat_tools": self.flat_tools,
            "requires_tool_descriptions": self.tool_descriptions,
            "supports_later_system_turns": self.later_system,
            "system_at_last_user": self.system_at_last_user,
            "refuses_parallel_tool_calls": self.refuses_parallel_calls,
        }

    def summary(self) -> dict[str, Any]:
        """The capabilities as log fields."""
        return {f: getattr(self, f) for f in self.__struct_fields__}


Render = Callable[..., str]


def _try(render: Render, messages: list[dict[str, Any]], **kwargs: Any) -> str | None:
    try:
        return render(messages, **kwargs)
    except Exception:  # noqa: BLE001 - a probe that does not render says "not supported"
        return None


def _has(out: str | None, *needles: str) -> bool:
    return out is not None and all(n in out for n in needles)


def _call(name: str, arguments: Any, call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _calls_turn(calls: list[dict[str, Any]], content: str | None) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": calls}


def _shows_arguments(out: str | None, name: str) -> bool:
    """The call and its argument value are in ``out``, as JSON or markup: not escaped
    twice (a string printed through ``tojson``) nor as a Python dict's repr."""
    return _has(out, name, VALUE) and '\\"argument_needle\\"' not in out \
        and "'argument_needle'" not in out


class _Probe:
    """One template's probes; ``render(messages, tools=None, add_generation_prompt=False)``
    renders without any adaptation."""

    def __init__(self, render: Render) -> None:
        self.render = render
        self.typed = False

    def text(self, value: str) -> Any:
        return [{"type": "text", "text": value}] if self.typed else value

    def user(self) -> dict[str, Any]:
        return {"role": "user", "content": self.text(USER)}

    def with_calls(self, make: Callable[[str], list[dict[str, Any]]],
                   after: list[dict[str, Any]] = (), **kwargs: Any
                   ) -> tuple[str | None, str | None, str]:
        """The first of (content null / "", long id / 9 alphanumerics) that renders an
        assistant turn of ``make(id)`` calls: its output, the content, the id."""
        for call_id in (_LONG_ID, _SHORT_ID):
            for content in (None, ""):
                turn = _calls_turn(make(call_id), content)
                tail = [dict(m, tool_call_id=call_id) if m.get("role") == "tool" else m
                        for m in after]
                out = _try(self.render, [self.user(), turn, *tail], **kwargs)
                if out is not None:
                    return out, content, call_id
        return None, None, _LONG_ID

    def arguments(self, value: Any) -> tuple[bool, str | None, str]:
        out, content, call_id = self.with_calls(lambda i: [_call(TOOL, value, i)])
        return _shows_arguments(out, TOOL), content, call_id


def _reasoning_field(probe: _Probe, calls: bool, args: Any) -> ReasoningField | None:
    """The field whose reasoning shows: in a final assistant turn, or in one that calls a
    tool before its result (some templates keep reasoning only there)."""
    for field in ("reasoning_content", "thinking"):
        turn = {"role": "assistant", "content": probe.text("answer"), field: REASONING}
        if _has(_try(probe.render, [probe.user(), turn]), REASONING):
            return field
        if calls:
            call_turn = {**_calls_turn([_call(TOOL, args, _SHORT_ID)], ""), field: REASONING}
            tool = {"role": "tool", "tool_call_id": _SHORT_ID, "content": probe.text("ok")}
            out = _try(probe.render, [probe.user(), call_turn, tool],
                       add_generation_prompt=True)
            if _has(out, REASONING):
                return field
    return None


def _system_placement(probe: _Probe, calls: bool, args: Any) -> tuple[bool, bool]:
    """Whether a system turn after the first exchange shows, and whether the leading
    one shows only in the last user turn (lost after a tool result)."""
    first = {"role": "system", "content": probe.text(SYSTEM)}
    later = {"role": "system", "content": probe.text(REASONING)}
    answer = {"role": "assistant", "content": probe.text("answer")}
    out = _try(probe.render, [first, probe.user(), answer, later, probe.user()],
               add_generation_prompt=True)
    shows_later = _has(out, SYSTEM, REASONING)
    if not calls:
        return shows_later, False
    turns = [first, probe.user(), _calls_turn([_call(TOOL, args, _SHORT_ID)], ""),
             {"role": "tool", "tool_call_id": _SHORT_ID, "content": probe.text(RESPONSE)}]
    out = _try(probe.render, turns, add_generation_prompt=True)
    return shows_later, out is not None and RESPONSE in out and SYSTEM not in out


def probe_caps(render: Render) -> TemplateCaps:
    """Probe ``render`` (a raw render of one template) and say what it supports."""
    probe = _Probe(render)
    plain = _try(render, [probe.user()])
    if not _has(plain, USER):
        probe.typed = True
        typed = _has(_try(render, [probe.user()]), USER)
        probe.typed = typed
    system = {"role": "system", "content": probe.text(SYSTEM)}
    system_role = _has(_try(render, [system, probe.user()]), SYSTEM)
    bare = {"name": TOOL, "parameters": {"type": "object", "properties": {
        "argument_needle": {"type": "string"}}, "required": ["argument_needle"]}}
    described = {**bare, "description": "A probe tool.", "parameters": {
        **bare["parameters"], "properties": {
            "argument_needle": {"type": "string", "description": "An argument."}}}}
    tools = flat = descriptions = False
    fails = True
    for fn, shape in ((bare, False), (described, False), (bare, True), (described, True)):
        listed = fn if shape else {"type": "function", "function": fn}
        out = _try(render, [probe.user()], tools=[listed])
        fails = fails and out is None
        if _has(out, TOOL):
            tools, flat, descriptions = True, shape, fn is described
            break
    args = {"argument_needle": VALUE}
    as_object, content_o, id_o = probe.arguments(args)
    as_string, content_s, id_s = probe.arguments(json.dumps(args))
    calls = as_object or as_string
    arguments: Arguments = "any" if as_object == as_string else \
        "object" if as_object else "string"
    sample = args if as_object or not calls else json.dumps(args)
    empty = _try(render, [probe.user(), {"role": "assistant", "content": probe.text("")}])
    null = _try(render, [probe.user(), {"role": "assistant", "content": None}])
    non_null = (_has(empty, USER) and not _has(null, USER)) or \
        (_has(empty, USER) and "None" in null and "None" not in empty) or \
        (calls and (content_o if as_object else content_s) == "")
    call_ids: CallIds = "alnum9" if calls and (id_o if as_object else id_s) == _SHORT_ID \
        else "any"
    parallel = refuses = False
    tool_turn = {"role": "tool", "name": TOOL, "content": probe.text(RESPONSE)}
    if calls:
        out, _, _ = probe.with_calls(lambda i: [_call(TOOL + "_a", sample, i),
                                                _call(TOOL + "_b", sample, i)])
        parallel = _has(out, TOOL + "_a", TOOL + "_b")
        refuses = out is None
        out, _, _ = probe.with_calls(lambda i: [_call(TOOL, sample, i)], after=[tool_turn])
    else:  # the calls will be text; the results may still have their own turn
        answer = {"role": "assistant", "content": probe.text("calling")}
        out = _try(render, [probe.user(), answer, dict(tool_turn, tool_call_id=_SHORT_ID)])
    responses = _has(out, RESPONSE)
    later, at_last = _system_placement(probe, calls, sample) if system_role else (True, False)
    return TemplateCaps(
        system_role=system_role, tools=tools, tool_calls=calls, tool_responses=responses,
        parallel_tool_calls=parallel, arguments=arguments if calls else "any",
        non_null_content=non_null, typed_content=probe.typed,
        reasoning_field=_reasoning_field(probe, calls, sample), call_ids=call_ids,
        flat_tools=flat, tool_descriptions=descriptions, later_system=later,
        system_at_last_user=at_last, refuses_parallel_calls=refuses,
        tools_fail=not tools and fails)

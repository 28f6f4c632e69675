"""tool_choice is enforced, not echoed (the spec's "도구와 tool_choice"): which tools the
template renders, the directive to call one and where it goes, and every refusal."""

from __future__ import annotations

import msgspec
import pytest
from mlxcel.chat.prompt import render_chat
from mlxcel.chat.tool_choice import place_directive
from mlxcel.dialects.openai.schemas import ChatCompletionRequest
from mlxcel.dialects.openai.translate import prompt_request
from mlxcel.errors import InvalidRequest
from mlxcel.model.chat_template import ChatTemplate
from mlxcel.types.messages import FunctionChoice, Message, PromptRequest, TextPart, Tool

CHAT = "/v1/chat/completions"
WIRE_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city, today and tomorrow.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "the city's name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}},
    {"type": "function", "function": {"name": "get_time", "description": "The time.",
                                      "parameters": {"type": "object", "properties": {}}}},
]
TOOLS = tuple(Tool(name=t["function"]["name"], definition=t) for t in WIRE_TOOLS)
REQUIRED = "You must call at least one of the declared functions (get_weather, get_time)"
NAMED = "You must call the function get_time"


def msg(role: str, text: str) -> Message:
    return Message(role=role, content=(TextPart(text=text),))  # type: ignore[arg-type]


def render(template, messages, **fields) -> str:
    return render_chat(PromptRequest(messages=tuple(messages), **fields), template)


# -- what is rendered ---------------------------------------------------------------------
def test_auto_and_absent_render_every_tool_and_no_directive(template):
    auto = render(template, [msg("user", "hi")], tools=TOOLS, tool_choice="auto")
    assert auto == render(template, [msg("user", "hi")], tools=TOOLS)
    assert '"get_weather"' in auto and '"get_time"' in auto and "You must call" not in auto


def test_no_tools_leaves_the_variable_undefined_whatever_the_choice():
    probe = ChatTemplate("{{ 'defined' if tools is defined else 'undefined' }}")
    assert render(probe, [msg("user", "hi")]) == "undefined"
    assert render(probe, [msg("user", "hi")], tools=TOOLS, tool_choice="none") == "undefined"
    assert render(probe, [msg("user", "hi")], tools=TOOLS) == "defined"


def test_none_renders_no_tools(template):
    text = render(template, [msg("user", "hi")], tools=TOOLS, tool_choice="none")
    assert text == render(template, [msg("user", "hi")])
    assert "<tools>" not in text and "get_weather" not in text


def test_required_renders_every_tool_and_the_directive(template):
    text = render(template, [msg("user", "hi")], tools=TOOLS, tool_choice="required")
    assert '"name": "get_weather"' in text and '"name": "get_time"' in text
    assert REQUIRED in text


def test_a_named_function_renders_only_it_and_a_directive_to_call_it(template):
    text = render(template, [msg("user", "hi")], tools=TOOLS,
                  tool_choice=FunctionChoice(name="get_time"))
    assert '"name": "get_time"' in text and "get_weather" not in text
    assert NAMED in text


# -- refusals -----------------------------------------------------------------------------
@pytest.mark.parametrize("tools,choice,words", [
    ((), "required", "needs at least one tool"),
    ((), FunctionChoice(name="get_time"), "not declared"),
    (TOOLS, FunctionChoice(name="get_date"), "not declared"),
    (TOOLS, FunctionChoice(name=""), "empty"),
    (TOOLS, "sometimes", "must be"),
])
def test_refusals_are_400_naming_tool_choice(template, tools, choice, words):
    with pytest.raises(InvalidRequest, match=words) as info:
        render(template, [msg("user", "hi")], tools=tools, tool_choice=choice)
    assert info.value.param == "tool_choice" and info.value.status == 400


# -- where the directive goes -------------------------------------------------------------
def test_the_directive_goes_into_the_first_system_message(template):
    messages = [msg("system", "Be brief."), msg("user", "one"), msg("user", "two")]
    text = render(template, messages, tools=TOOLS, tool_choice="required")
    assert text.startswith("<|im_start|>system\nBe brief.\n\n" + REQUIRED)
    assert "<|im_start|>user\none<|im_end|>\n<|im_start|>user\ntwo<|im_end|>" in text
    assert text.count("You must call") == 1


def test_without_a_system_message_it_goes_into_the_last_user_message(template):
    messages = [msg("user", "one"), msg("assistant", "ok"), msg("user", "two")]
    text = render(template, messages, tools=TOOLS, tool_choice=FunctionChoice(name="get_time"))
    assert "<|im_start|>user\none<|im_end|>" in text
    assert f"<|im_start|>user\ntwo\n\n{NAMED} in this reply.<|im_end|>" in text
    assert text.count("You must call") == 1


def test_without_system_or_user_it_is_a_new_leading_system_message(template):
    messages = [msg("assistant", "Hello.")]
    text = render(template, messages, tools=TOOLS, tool_choice="required",
                  add_generation_prompt=False)
    assert text.startswith(f"<|im_start|>system\n{REQUIRED} in this reply.\n\n# Tools")
    placed = place_directive(tuple(messages), "D")
    assert [m.role for m in placed] == ["system", "assistant"] and placed[1] is messages[0]


def test_an_empty_system_message_takes_the_directive_without_a_blank_line():
    placed = place_directive((Message(role="system", content=None), msg("user", "hi")), "D")
    assert placed[0].text == "D" and placed[1].text == "hi"


def test_the_request_is_never_changed(template):
    wire = {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "tools": WIRE_TOOLS, "tool_choice": {"type": "function",
                                                 "function": {"name": "get_time"}}}
    body = msgspec.convert(wire, ChatCompletionRequest)
    before = msgspec.to_builtins(body)
    request = prompt_request(body)
    typed = msgspec.to_builtins(request)
    assert NAMED in render_chat(request, template)
    assert msgspec.to_builtins(body) == before and msgspec.to_builtins(request) == typed
    assert before["messages"][0]["content"] == "Be brief." and len(before["tools"]) == 2


# -- over HTTP ----------------------------------------------------------------------------
def _tokens(client, **body) -> int:
    r = client.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}],
                                "max_tokens": 1, **body})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens"]


def test_http_choice_changes_the_prompt(client):
    plain = _tokens(client)
    auto = _tokens(client, tools=WIRE_TOOLS)
    assert _tokens(client, tools=WIRE_TOOLS, tool_choice="auto") == auto
    assert _tokens(client, tools=WIRE_TOOLS, tool_choice="none") == plain
    assert _tokens(client, tools=WIRE_TOOLS, tool_choice="required") > auto
    named = _tokens(client, tools=WIRE_TOOLS,
                    tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert plain < named < auto  # get_weather's long schema is left out


@pytest.mark.parametrize("body", [
    {"tool_choice": "required"},
    {"tool_choice": "required", "tools": []},
    {"tool_choice": {"type": "function", "function": {"name": "get_time"}}},
    {"tools": WIRE_TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
    {"tools": WIRE_TOOLS, "tool_choice": {"type": "function", "function": {"name": ""}}},
    {"tools": WIRE_TOOLS, "tool_choice": {"type": "function", "function": {}}},
    {"tools": WIRE_TOOLS, "tool_choice": {"type": "function"}},
    {"tools": WIRE_TOOLS, "tool_choice": {"type": "tool", "name": "get_time"}},
    {"tools": WIRE_TOOLS, "tool_choice": "sometimes"},
    {"tools": WIRE_TOOLS, "tool_choice": 5},
])
def test_http_bad_choices_are_400_naming_tool_choice(client, body):
    r = client.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}],
                                "max_tokens": 1, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == "tool_choice", err
    assert "nope" not in err["message"]

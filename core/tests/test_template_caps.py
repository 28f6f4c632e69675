"""Template capabilities (mlxcel.model.chat_template.caps) and the adaptation of each conversation
to them (mlxcel.chat.adapt), on small templates that each behave as a real family does."""

from __future__ import annotations

import json

import pytest
from mlxcel.chat.call_ids import fitted, new_call_id
from mlxcel.chat.prompt import render_chat
from mlxcel.errors import InvalidRequest
from mlxcel.model.chat_template import FALLBACK_CHATML, ChatTemplate
from mlxcel.types.messages import Message, PromptRequest, TextPart, Tool, ToolCall

# Llama 3.1: arguments through tojson (an object), one call per turn, ipython results.
OBJECT_ARGS = """{% for m in messages %}<{{ m.role }}>{% if m.tool_calls %}\
{% if m.tool_calls | length > 1 %}{{ raise_exception('only single tool-calls at once!') }}\
{% endif %}{% for c in m.tool_calls %}{"name": "{{ c.function.name }}", "parameters": \
{{ c.function.arguments | tojson }}}{% endfor %}{% else %}{{ m.content }}{% endif %}\
{% endfor %}{% if tools %}TOOLS{{ tools | tojson }}{% endif %}"""

# Functionary v3.2: arguments printed as they are (a string).
STRING_ARGS = """{% for m in messages %}<{{ m.role }}>{{ m.content or '' }}\
{% for c in m.tool_calls or [] %}>>>{{ c.function.name }}\n{{ c.function.arguments }}\
{% endfor %}{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}"""

# Gemma 2: no system role, roles must alternate, no tools.
NO_SYSTEM = """{{ bos_token }}{% for m in messages %}\
{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}\
{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\
{% endif %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}\
{% endif %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}\
<start_of_turn>{{ role }}\n{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}\
{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"""

# Mistral Nemo: 9-alphanumeric ids on calls and results.
MISTRAL_IDS = """{% for m in messages %}{% if m.tool_calls %}[TOOL_CALLS][\
{% for c in m.tool_calls %}{% if c.id is not defined or c.id | length != 9 %}\
{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}\
{% endif %}{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}\
, "id": "{{ c.id }}"}{% endfor %}]{% elif m.role == 'tool' %}\
{% if m.tool_call_id is not defined or m.tool_call_id | length != 9 %}\
{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}\
{% endif %}[TOOL_RESULTS]{"call_id": "{{ m.tool_call_id }}", "content": {{ m.content | tojson }}}\
{% else %}[{{ m.role }}]{{ m.content }}{% endif %}{% endfor %}"""

# Qwen3: reads `'</think>' in message.content`, so a null content fails.
NULL_BREAKS = """{% for m in messages %}<|im_start|>{{ m.role }}\n\
{% if m.role == 'assistant' and m.reasoning_content is defined %}<think>{{ m.reasoning_content }}\
</think>{% elif m.role == 'assistant' and '</think>' in m.content %}{% endif %}{{ m.content }}\
{% for c in m.tool_calls or [] %}<tool_call>{"name": "{{ c.function.name }}", "arguments": \
{{ c.function.arguments | tojson }}}</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"""

# gpt-oss: earlier reasoning in `thinking`.
THINKING = """{% for m in messages %}<|start|>{{ m.role }}\
{% if m.thinking is defined %}<|channel|>analysis<|message|>{{ m.thinking }}<|end|>{% endif %}\
<|message|>{{ m.content }}<|end|>{% endfor %}"""


def msg(role: str, text: str | None = None, **fields) -> Message:
    content = None if text is None else (TextPart(text=text),)
    return Message(role=role, content=content, **fields)  # type: ignore[arg-type]


TOOL = Tool(name="get_weather", definition={"type": "function", "function": {
    "name": "get_weather", "description": "Weather.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})


def loop_turns(call_id: str = "call_abc123XYZ_long", content: str | None = None):
    return [msg("system", "Be brief."), msg("user", "Weather in Paris?"),
            msg("assistant", content, tool_calls=(ToolCall(id=call_id, name="get_weather",
                                                            arguments={"city": "Paris"}),)),
            msg("tool", "sunny, 21C", tool_call_id=call_id), msg("user", "Thanks!")]


def render(template: ChatTemplate, messages, **fields) -> str:
    return render_chat(PromptRequest(messages=tuple(messages), **fields), template)


def test_fallback_chatml_caps():
    caps = ChatTemplate(FALLBACK_CHATML).caps
    assert caps.system_role and not caps.tools and not caps.tool_calls
    assert caps.tool_responses and caps.non_null_content  # it would print "None"


def test_object_arguments_template():
    caps = ChatTemplate(OBJECT_ARGS).caps
    assert (caps.arguments, caps.tool_calls, caps.tools) == ("object", True, True)
    assert not caps.parallel_tool_calls and caps.system_role


def test_string_arguments_template_gets_json_text():
    t = ChatTemplate(STRING_ARGS)
    assert t.caps.arguments == "string" and t.caps.parallel_tool_calls
    out = render(t, loop_turns())
    assert '>>>get_weather\n{"city": "Paris"}' in out and "'city'" not in out


def test_object_template_gets_an_object_from_a_string():
    t = ChatTemplate(OBJECT_ARGS)
    turns = loop_turns()
    turns[2] = msg("assistant", tool_calls=(ToolCall(id="x", name="get_weather",
                                                     arguments='{"city": "Paris"}'),))
    out = render(t, turns)
    assert '"parameters": {"city": "Paris"}' in out and '\\"city\\"' not in out


def test_template_refusal_of_parallel_calls_is_a_400_quoting_it():
    t = ChatTemplate(OBJECT_ARGS)
    two = (ToolCall(id="a", name="get_weather", arguments={"city": "A"}),
           ToolCall(id="b", name="get_weather", arguments={"city": "B"}))
    with pytest.raises(InvalidRequest, match="only single tool-calls at once!"):
        render(t, [msg("user", "x"), msg("assistant", tool_calls=two)])


def test_no_system_role_and_no_tools_are_filled_in():
    t = ChatTemplate(NO_SYSTEM, bos_token="<bos>")
    caps = t.caps
    assert not caps.system_role and not caps.tools and not caps.tool_calls
    assert not caps.tool_responses
    turns = loop_turns()
    turns.insert(4, msg("tool", "humid", tool_call_id="call_abc123XYZ_long"))
    out = render(t, turns, tools=(TOOL,))
    first_user = out.split("<start_of_turn>user\n")[1]
    assert first_user.startswith("Be brief.")
    assert "You can call any of the following tools" in first_user and '"get_weather"' in out
    assert "Weather in Paris?" in first_user
    model_turn = out.split("<start_of_turn>model\n")[1].split("<end_of_turn>")[0]
    assert json.loads(model_turn)["tool_calls"][0] == {
        "name": "get_weather", "arguments": {"city": "Paris"}, "id": "call_abc123XYZ_long"}
    results = out.split("<start_of_turn>user\n")[2].split("<end_of_turn>")[0]
    assert "sunny, 21C" in results and "humid" in results and '"tool_response"' in results
    assert out.endswith("<start_of_turn>model\n")


def test_mid_conversation_system_turn_without_a_system_role():
    t = ChatTemplate(NO_SYSTEM)
    out = render(t, [msg("user", "a"), msg("assistant", "b"), msg("system", "Now be terse."),
                     msg("user", "c")])
    assert "<start_of_turn>user\nNow be terse.\nc<end_of_turn>" in out


def test_mistral_ids_are_fitted_and_pair():
    t = ChatTemplate(MISTRAL_IDS)
    assert t.caps.call_ids == "alnum9"
    out = render(t, loop_turns("toolu_01A09q90qw90lq917835lq9"))
    short = fitted("toolu_01A09q90qw90lq917835lq9", "alnum9")
    assert len(short) == 9 and short.isalnum()
    assert f'"id": "{short}"' in out and f'"call_id": "{short}"' in out
    assert render(t, loop_turns("toolu_01A09q90qw90lq917835lq9")) == out  # stable per turn
    kept = render(t, loop_turns("abcDEF123"))
    assert '"id": "abcDEF123"' in kept


def test_results_without_ids_answer_calls_in_order():
    t = ChatTemplate(MISTRAL_IDS)
    calls = (ToolCall(name="get_weather", arguments={"city": "A"}),
             ToolCall(name="get_weather", arguments={"city": "B"}))
    out = render(t, [msg("user", "x"), msg("assistant", tool_calls=calls), msg("tool", "ra"),
                     msg("tool", "rb")])
    ids = [part.split('"')[0] for part in out.split('"id": "')[1:]]
    answered = [part.split('"')[0] for part in out.split('"call_id": "')[1:]]
    assert len(set(ids)) == 2 and answered == ids


def test_null_content_becomes_empty_where_the_template_needs_a_string():
    t = ChatTemplate(NULL_BREAKS)
    assert t.caps.non_null_content and t.caps.reasoning_field == "reasoning_content"
    out = render(t, loop_turns())
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}' in out
    assert "None" not in out


def test_reasoning_goes_to_the_field_the_template_reads():
    t = ChatTemplate(THINKING)
    assert t.caps.reasoning_field == "thinking"
    out = render(t, [msg("user", "q"), msg("assistant", "a", reasoning="because")])
    assert "<|channel|>analysis<|message|>because<|end|>" in out


def test_server_made_ids_take_the_templates_form():
    assert len(new_call_id("alnum9")) == 9 and new_call_id("alnum9").isalnum()
    assert new_call_id("any").startswith("call_")
    assert fitted("call_x", "any") == "call_x"
    assert fitted("call_x", "alnum9") == fitted("call_x", "alnum9") != fitted("call_y",
                                                                              "alnum9")


def test_caps_wire_names_match_llama_server():
    wire = ChatTemplate(OBJECT_ARGS).caps.wire()
    assert wire["requires_object_arguments"] is True
    assert {"supports_system_role", "supports_tools", "supports_tool_calls",
            "supports_tool_responses", "supports_parallel_tool_calls",
            "requires_non_null_content", "requires_typed_content"} <= wire.keys()


# gpt-oss: one call per assistant turn, the rest dropped without a word.
FIRST_CALL_ONLY = """{% for m in messages %}<{{ m.role }}>{{ m.content or '' }}\
{% if m.tool_calls %}CALL {{ m.tool_calls[0].function.name }} \
{{ m.tool_calls[0].function.arguments | tojson }}{% endif %}{% endfor %}"""


def test_a_template_that_drops_parallel_calls_gets_one_call_per_turn():
    t = ChatTemplate(FIRST_CALL_ONLY)
    assert not t.caps.parallel_tool_calls and not t.caps.refuses_parallel_calls
    calls = (ToolCall(id="a", name="get_weather", arguments={"city": "A"}),
             ToolCall(id="b", name="get_time", arguments={"city": "B"}))
    out = render(t, [msg("user", "x"), msg("assistant", tool_calls=calls),
                     msg("tool", "rb", tool_call_id="b"), msg("tool", "ra", tool_call_id="a"),
                     msg("tool", "orphan")])
    assert out == ('<user>x<assistant>CALL get_weather {"city": "A"}<tool>ra'
                   '<assistant>CALL get_time {"city": "B"}<tool>rb<tool>orphan')
    assert ChatTemplate(OBJECT_ARGS).caps.refuses_parallel_calls


def test_split_calls_keep_the_turns_reasoning_once():
    t = ChatTemplate(FIRST_CALL_ONLY + "{% for m in messages %}"
                     "{% if m.reasoning_content is defined %}[R:{{ m.reasoning_content }}]"
                     "{% endif %}{% endfor %}")
    calls = (ToolCall(id="a", name="get_weather", arguments={"city": "A"}),
             ToolCall(id="b", name="get_time", arguments={"city": "B"}))
    out = render(t, [msg("user", "x"), msg("assistant", "let me", tool_calls=calls,
                                           reasoning="plan"),
                     msg("tool", "ra", tool_call_id="a"), msg("tool", "rb", tool_call_id="b")])
    assert out.count("[R:plan]") == 1 and out.count("let me") == 1

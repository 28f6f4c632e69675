"""The Jinja environment matches transformers' where real templates depend on it."""

from __future__ import annotations

import pytest
from mlxcel.errors import InvalidRequest, StartupError
from mlxcel.model.chat_template import ChatTemplate

USER = [{"role": "user", "content": "hi"}]


def test_generation_block_renders_its_body():
    t = ChatTemplate("{% for m in messages %}{% generation %}[{{ m.content }}]"
                     "{% endgeneration %}{% endfor %}")
    assert t.render(USER) == "[hi]"


def test_loop_controls_and_strftime_now():
    t = ChatTemplate("{% for i in [1, 2, 3] %}{% if i == 2 %}{% continue %}{% endif %}{{ i }}"
                     "{% endfor %}|{{ strftime_now('%Y') | length }}")
    assert t.render(USER) == "13|4"


def test_tojson_keeps_key_order_unicode_and_takes_transformers_options():
    t = ChatTemplate("{{ messages[0].x | tojson }}|{{ messages[0].x | tojson(indent=2) }}|"
                     "{{ messages[0].x | tojson(separators=(',', ':'), sort_keys=true) }}")
    out = t.render([{"role": "user", "x": {"b": "é<", "a": [1]}}])
    assert out == ('{"b": "é<", "a": [1]}|{\n  "b": "é<",\n  "a": [\n    1\n  ]\n}|'
                   '{"a":[1],"b":"é<"}')


def test_template_may_grow_its_own_lists_and_dicts():
    t = ChatTemplate("{% set seen = [] %}{% set d = {} %}{% for m in messages %}"
                     "{% set _ = seen.append(m.role) %}{% set _ = d.update({m.role: 1}) %}"
                     "{% endfor %}{% set _ = seen.extend(['x']) %}{{ seen | join(',') }}"
                     "{{ seen.pop() }}{{ d | list | join(',') }}")
    assert t.render([*USER, {"role": "assistant", "content": "a"}]) == \
        "user,assistant,xxuser,assistant"


@pytest.mark.parametrize("expr", ["messages.append(1)", "messages[0].update({'role': 'x'})",
                                  "tools.pop()", "messages[0].clear()"])
def test_template_cannot_change_what_it_was_given(expr):
    t = ChatTemplate("{% set _ = " + expr + " %}{{ messages | length }}")
    messages = [{"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "f"}}]
    with pytest.raises(InvalidRequest):
        t.render(messages, tools=tools)
    assert messages == [{"role": "user", "content": "hi"}] and len(tools) == 1


def test_sandbox_still_denies_internals():
    t = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(InvalidRequest):
        t.render(USER)


def test_raise_exception_is_a_400_quoting_the_template():
    t = ChatTemplate("{{ raise_exception('Only user and assistant roles are supported!') }}")
    with pytest.raises(InvalidRequest) as err:
        t.render(USER)
    assert "Only user and assistant roles are supported!" in err.value.message
    assert "refused" in err.value.message


def test_a_template_that_does_not_compile_is_one_line_naming_the_construct():
    with pytest.raises(StartupError) as err:
        ChatTemplate("{% for m in messages %}{% frobnicate %}{% endfor %}", origin="x.jinja")
    message = str(err.value)
    assert "\n" not in message and "frobnicate" in message and "line 1" in message

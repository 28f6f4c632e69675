"""HF-compatible chat template rendering with jinja2."""

from __future__ import annotations

import pytest
from mlxcel.errors import InvalidRequest, StartupError
from mlxcel.model.chat_template import FALLBACK_CHATML, ChatTemplate, load_chat_template

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "w",
                                           "parameters": {"type": "object", "properties": {}}}}]


def test_tools_rendered_only_when_there_is_at_least_one(template):
    msgs = [{"role": "user", "content": "hi"}]
    assert "get_weather" in template.render(msgs, tools=TOOLS)
    assert template.render(msgs, tools=[]) == template.render(msgs, tools=None)
    assert "<tools>" not in template.render(msgs, tools=[])


def test_tools_variable_is_undefined_without_tools():
    probe = ChatTemplate("{{ 'defined' if tools is defined else 'undefined' }}")
    assert probe.render([], tools=[]) == "undefined"
    assert probe.render([], tools=TOOLS) == "defined"


def test_generation_prompt_and_tool_calls(template):
    msgs = [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                              "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "sunny"}]
    text = template.render(msgs, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    assert "<tool_call>" in text and '"city": "Paris"' in text and "sunny" in text
    assert not template.render(msgs, add_generation_prompt=False).endswith("assistant\n")


def test_template_kwargs_reach_the_template(template):
    msgs = [{"role": "user", "content": "hi"}]
    assert template.render(msgs, enable_thinking=False).endswith("<think>\n\n</think>\n\n")


def test_raise_exception_becomes_invalid_request():
    tpl = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(InvalidRequest, match="roles must alternate"):
        tpl.render([{"role": "user", "content": "x"}])


def test_source_precedence(tmp_path):
    (tmp_path / "chat_template.jinja").write_text("FILE")
    cfg = {"chat_template": "CONFIG"}
    assert load_chat_template(tmp_path, cfg, override=None, bos_token=None,
                              eos_token=None).render([]) == "FILE"
    override = tmp_path / "o.jinja"
    override.write_text("OVERRIDE {{ bos_token }}")
    assert load_chat_template(tmp_path, cfg, override=override, bos_token="<s>",
                              eos_token=None).render([]) == "OVERRIDE <s>"
    (tmp_path / "chat_template.jinja").unlink()
    assert load_chat_template(tmp_path, cfg, override=None, bos_token=None,
                              eos_token=None).render([]) == "CONFIG"
    named = {"chat_template": [{"name": "tool_use", "template": "T"},
                               {"name": "default", "template": "D"}]}
    assert load_chat_template(tmp_path, named, override=None, bos_token=None,
                              eos_token=None).render([]) == "D"
    fallback = load_chat_template(tmp_path, {}, override=None, bos_token=None, eos_token=None)
    assert fallback.source == FALLBACK_CHATML
    # a processor's chat_template.json (vision-language repos) comes before tokenizer_config
    (tmp_path / "chat_template.json").write_text('{"chat_template": "JSON"}')
    loaded = load_chat_template(tmp_path, cfg, override=None, bos_token=None, eos_token=None)
    assert (loaded.render([]), loaded.origin) == ("JSON", "chat_template.json")
    (tmp_path / "chat_template.jinja").write_text("FILE")
    assert load_chat_template(tmp_path, cfg, override=None, bos_token=None,
                              eos_token=None).render([]) == "FILE"
    (tmp_path / "chat_template.jinja").unlink()
    (tmp_path / "chat_template.json").write_text("{not json")
    with pytest.raises(StartupError, match="chat_template.json"):
        load_chat_template(tmp_path, cfg, override=None, bos_token=None, eos_token=None)


def test_broken_template_is_a_startup_error():
    with pytest.raises(StartupError, match="does not compile"):
        ChatTemplate("{% for %}")

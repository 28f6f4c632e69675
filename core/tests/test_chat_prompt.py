"""The chat layer's prompt rules (mlxcel.chat.prompt): earlier reasoning
(preserve_thinking), add_generation_prompt / continue_final_message, reasoning_open, media
parts, and the typed messages a dialect maps its wire to."""

from __future__ import annotations

import json

import msgspec
import pytest
from mlxcel.chat.prompt import prompt_input, refuse_media, render_chat
from mlxcel.chat.reasoning import prompt_opens
from mlxcel.dialects.openai.schemas import ChatCompletionRequest
from mlxcel.dialects.openai.translate import prompt_request
from mlxcel.errors import CapabilityNotSupported, InvalidRequest
from mlxcel.families.api import ReasoningSpec
from mlxcel.model.chat_template import ChatTemplate
from mlxcel.types.messages import (
    AudioPart,
    ImagePart,
    Message,
    Part,
    PromptRequest,
    TextPart,
    ToolCall,
)

CHAT = "/v1/chat/completions"
THINK = ReasoningSpec(open="<think>", close="</think>")


def msg(role: str, text: str | None = None, **fields) -> Message:
    content = None if text is None else (TextPart(text=text),)
    return Message(role=role, content=content, **fields)  # type: ignore[arg-type]


def render(template, messages, **fields) -> str:
    return render_chat(PromptRequest(messages=tuple(messages), **fields), template)


# -- preserve_thinking --------------------------------------------------------------------
# the query is q2; the tool result in Qwen's wrapped user form is not a query
CONVERSATION = [
    msg("user", "q1"),
    msg("assistant", "A1", reasoning="old field reasoning"),
    msg("user", "q1b"),
    msg("assistant", "<think>\nold inline reasoning\n</think>\n\nA1b"),
    msg("user", "q2"),
    msg("assistant", "<think>\nnew reasoning\n</think>\n\ncalling",
        tool_calls=(ToolCall(id="c1", name="get_weather", arguments={"city": "Paris"}),)),
    msg("user", "<tool_response>\nsunny\n</tool_response>"),
]


def test_by_default_reasoning_before_the_last_query_is_dropped(template):
    text = render(template, CONVERSATION)
    assert "old field reasoning" not in text and "old inline reasoning" not in text
    assert "<|im_start|>assistant\nA1<|im_end|>" in text
    assert "<|im_start|>assistant\nA1b<|im_end|>" in text
    assert "<think>\nnew reasoning\n</think>\n\ncalling" in text  # after the query: kept
    assert text == render(template, CONVERSATION,
                          template_kwargs={"preserve_thinking": False})


def test_preserve_thinking_keeps_every_earlier_turns_reasoning(template):
    text = render(template, CONVERSATION, template_kwargs={"preserve_thinking": True})
    assert "<think>\nold field reasoning\n</think>\n\nA1" in text
    assert "<think>\nold inline reasoning\n</think>\n\nA1b" in text
    assert "<think>\nnew reasoning\n</think>" in text


def test_the_servers_preserve_thinking_counts_too(template):
    text = render_chat(PromptRequest(messages=tuple(CONVERSATION)), template,
                       {"preserve_thinking": True})
    assert "old inline reasoning" in text


def test_templates_without_reasoning_ignore_the_flag_but_still_get_it():
    probe = ChatTemplate("{{ preserve_thinking | default('unset') }}|"
                         "{% for m in messages %}{{ m.content }}|{% endfor %}")
    text = render(probe, CONVERSATION[:5])
    assert text == "unset|q1|A1|q1b|<think>\nold inline reasoning\n</think>\n\nA1b|q2|"
    assert render(probe, CONVERSATION[:1],
                  template_kwargs={"preserve_thinking": True}).startswith("True|")


def test_dropping_reasoning_makes_new_messages():
    probe = ChatTemplate("<think>{% for m in messages %}{{ m.content }}|{% endfor %}")
    messages = tuple(CONVERSATION)
    render(probe, messages)
    assert messages == tuple(CONVERSATION) and messages[1].reasoning == "old field reasoning"


# -- add_generation_prompt / continue_final_message ---------------------------------------
PARTIAL = [msg("user", "Count to five."), msg("assistant", "1, 2, 3,")]


def test_add_generation_prompt_false_ends_after_the_last_turn(template):
    text = render(template, PARTIAL[:1], add_generation_prompt=False)
    assert text.endswith("Count to five.<|im_end|>\n")
    assert render(template, PARTIAL[:1]).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("flag", [None, False])
def test_continue_final_message_ends_inside_the_final_content(template, flag):
    text = render(template, PARTIAL, continue_final_message=True, add_generation_prompt=flag)
    assert text.endswith("<|im_start|>user\nCount to five.<|im_end|>\n"
                         "<|im_start|>assistant\n1, 2, 3,")


def test_continuing_keeps_the_final_turns_trailing_space_and_reasoning(template):
    final = msg("assistant", "1, 2, 3, ", reasoning="count up")
    text = render(template, [PARTIAL[0], final], continue_final_message=True)
    assert text.endswith("<|im_start|>assistant\n<think>\ncount up\n</think>\n\n1, 2, 3, ")


@pytest.mark.parametrize("messages,fields,words", [
    (PARTIAL, {"add_generation_prompt": True}, "cannot both be true"),
    (PARTIAL[:1], {}, "last message to be an assistant message"),
    ([PARTIAL[0], msg("assistant", "  ")], {}, "needs text"),
    ([PARTIAL[0], msg("assistant")], {}, "needs text"),
])
def test_continue_final_message_refusals(template, messages, fields, words):
    with pytest.raises(InvalidRequest, match=words) as info:
        render(template, messages, continue_final_message=True, **fields)
    assert info.value.param == "continue_final_message"


def test_continuing_is_refused_when_the_template_changes_the_content():
    shouting = ChatTemplate("{% for m in messages %}{{ m.content | upper }}\n{% endfor %}")
    with pytest.raises(InvalidRequest, match="verbatim") as info:
        render(shouting, [PARTIAL[0], msg("assistant", "one, two,")],
               continue_final_message=True)
    assert info.value.param == "continue_final_message"


# -- prompt_opens -------------------------------------------------------------------------
@pytest.mark.parametrize("text,open_", [
    ("<|im_start|>assistant\n<think>\n", True),
    ("<|im_start|>assistant\n<think>\nLet me", True),
    ("<|im_start|>assistant\n<think>\n\n</think>\n\n", False),
    ("<think>a</think> then <think>\n  \n", True),
    ("<|im_start|>assistant\n", False),
])
def test_reasoning_open_is_the_last_open_marker_after_the_last_close(text, open_):
    assert prompt_opens(text, THINK) is open_
    spaced = ReasoningSpec(open="<think>\n", close=" </think>\n")
    assert prompt_opens(text, spaced) is open_  # whitespace aside
    assert prompt_opens(text, None) is False


def test_prompt_input_reports_an_open_reasoning_block(client):
    engine = client.app.state["ctx"].engine
    started = PromptRequest(messages=(PARTIAL[0], msg("assistant", "<think>\nLet me")),
                            continue_final_message=True)
    result = prompt_input(started, engine, reasoning=THINK)
    assert result.reasoning_open is True
    tail = engine.checkpoint.tokenizer.decode(list(result.token_ids), skip_special=False)
    assert tail.endswith("<|im_start|>assistant\n<think>\nLet me")
    assert prompt_input(started, engine).reasoning_open is False  # no markers: never open
    closed = PromptRequest(messages=PARTIAL[:1], template_kwargs={"enable_thinking": False})
    assert prompt_input(closed, engine, reasoning=THINK).reasoning_open is False


# -- media parts --------------------------------------------------------------------------
def test_media_parts_are_tagged_and_carry_their_reference():
    part = msgspec.convert({"type": "audio", "data": "AAA=", "format": "wav"}, Part)
    assert part == AudioPart(data="AAA=", format="wav")
    assert json.loads(msgspec.json.encode(TextPart(text="x"))) == {"type": "text", "text": "x"}
    wire = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is it"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA==",
                                            "detail": "low"}},
        {"type": "input_image", "image_url": "https://example.com/a.png"},
        {"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}}]}]}
    content = prompt_request(msgspec.convert(wire, ChatCompletionRequest)).messages[0].content
    assert content == (
        TextPart(text="what is it"),
        ImagePart(url="data:image/png;base64,AA==", wire_type="image_url"),
        ImagePart(url="https://example.com/a.png", wire_type="input_image"),
        AudioPart(data="UklG", format="wav", wire_type="input_audio"))


def test_media_parts_are_refused_naming_the_first():
    messages = (msg("user", "hi"),
                Message(role="user", content=(TextPart(text="see"), ImagePart(url="u"))))
    with pytest.raises(CapabilityNotSupported) as info:
        refuse_media(messages)
    assert info.value.message == "image input is not supported here: messages[1].content[1] " \
        "is 'image'"
    assert info.value.param == "messages[1].content[1]" and info.value.status == 501


@pytest.mark.parametrize("kind,ref", [
    ("image_url", {"url": "data:image/png;base64,AA=="}), ("input_image", "https://x/a.png"),
    ("video_url", {"url": "https://x/v.mp4"}), ("input_audio", {"data": "AA", "format": "wav"}),
    ("audio_url", {"url": "https://x/a.mp3"}), ("image_url", None),
])
def test_http_media_on_the_text_model_is_refused_as_before(client, kind, ref):
    parts = [{"type": "text", "text": "what is it"}, {"type": kind, kind: ref}]
    r = client.post(CHAT, json={"messages": [{"role": "user", "content": parts}]})
    assert r.status_code == 501, r.text
    err = r.json()["error"]
    media = {"image_url": "image", "input_image": "image", "video_url": "video"}.get(kind, "audio")
    assert err["message"] == f"{media} input is not supported: the loaded model accepts text " \
        f"only; messages[0].content[1] is '{kind}'"
    assert err["param"] == "messages[0].content[1]" and err["type"] == "not_supported_error"


# -- over HTTP ----------------------------------------------------------------------------
def _post(client, messages, **body):
    return client.post(CHAT, json={"messages": messages, "max_tokens": 1, **body})


def _tokens(client, messages, **body) -> int:
    r = _post(client, messages, **body)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens"]


WIRE_PARTIAL = [{"role": "user", "content": "Count to five."},
                {"role": "assistant", "content": "1, 2, 3,"}]


def test_http_add_generation_prompt(client):
    user = WIRE_PARTIAL[:1]
    with_prompt = _tokens(client, user)
    assert _tokens(client, user, add_generation_prompt=True) == with_prompt
    assert _tokens(client, user, add_generation_prompt=False) < with_prompt


def test_http_continue_final_message(client):
    closed = _tokens(client, WIRE_PARTIAL, add_generation_prompt=False)
    continued = _tokens(client, WIRE_PARTIAL, continue_final_message=True)
    assert continued < closed  # the end-of-turn marker after "1, 2, 3," is gone
    assert _tokens(client, WIRE_PARTIAL, continue_final_message=True,
                   add_generation_prompt=False) == continued
    assert _tokens(client, WIRE_PARTIAL, extra_body={"continue_final_message": True}) == \
        continued


@pytest.mark.parametrize("messages,body", [
    (WIRE_PARTIAL, {"continue_final_message": True, "add_generation_prompt": True}),
    (WIRE_PARTIAL[:1], {"continue_final_message": True}),
])
def test_http_continue_final_message_refusals(client, messages, body):
    r = _post(client, messages, **body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "continue_final_message" and err["type"] == "invalid_request_error"


WIRE_CONVERSATION = [
    {"role": "user", "content": "q1"},
    {"role": "assistant", "content": "A1", "reasoning_content": "a long reasoning " * 5},
    {"role": "user", "content": "q2"},
]


def test_http_preserve_thinking(client):
    dropped = _tokens(client, WIRE_CONVERSATION)
    kept = _tokens(client, WIRE_CONVERSATION, chat_template_kwargs={"preserve_thinking": True})
    assert kept > dropped
    assert _tokens(client, WIRE_CONVERSATION,
                   chat_template_kwargs={"preserve_thinking": False}) == dropped


def test_http_a_tool_call_needs_a_string_name(client):
    call = {"id": "c1", "type": "function", "function": {"arguments": "{}"}}
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "user", "content": "and?"}]
    r = _post(client, messages)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "messages[1].tool_calls[0].function.name"
    call["function"]["name"] = "f"
    assert _post(client, messages).status_code == 200


# -- system turns ---------------------------------------------------------------------------
def test_developer_turns_and_leading_system_messages_reach_the_template_as_one(client):
    """ChatML names no ``developer`` role: it is a system message, and the leading system
    messages are joined, so the rendered prompt has one system turn holding both."""
    template = client.app.state["ctx"].engine.checkpoint.template
    both = PromptRequest(messages=(msg("developer", "Be brief."), msg("system", "Be kind."),
                                   msg("user", "hi")))
    text = render_chat(both, template)
    assert text.count("<|im_start|>system") == 1
    assert "Be brief.\n\nBe kind." in text
    one = PromptRequest(messages=(msg("system", "Be brief.\n\nBe kind."), msg("user", "hi")))
    assert text == render_chat(one, template)


def test_a_template_that_names_developer_keeps_the_role():
    from mlxcel.chat.prompt import system_turns

    turns = (msg("developer", "rules"), msg("user", "hi"))
    assert [m.role for m in system_turns(turns, "{% if m.role == 'developer' %}")] == \
        ["developer", "user"]
    assert [m.role for m in system_turns(turns, "plain")] == ["system", "user"]
    later = (msg("system", "a"), msg("user", "hi"), msg("system", "b"))
    assert system_turns(later, "plain") == later  # only the leading run is joined

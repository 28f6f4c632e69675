"""The prompt boundaries the chat layer marks for the prompt cache's checkpoints
(``mlxcel.chat.cache_marks``), on every real template in tests/chat_templates: each is a
prefix that the prompts which should reuse it really start with -- the system + tools
prefix is shared by the conversation's next turn and by a sub-agent with another first
question, a turn boundary by the next turn."""

from __future__ import annotations

import msgspec
import pytest
from mlxcel.chat.prompt import render_chat, render_marked
from mlxcel.dialects.openai.schemas import ChatCompletionRequest
from mlxcel.dialects.openai.translate import prompt_request
from template_fixtures import SOURCES
from test_template_matrix import SYSTEM, TIME, WEATHER, template

ASK = {"role": "user", "content": "What is the weather in Lisbon today?"}
ANSWER = {"role": "assistant", "content": "It is sunny in Lisbon."}
NEXT = {"role": "user", "content": "And in Porto?"}
OTHER = {"role": "user", "content": "List the files in the repository."}
# templates that render text after the last message (tool instructions, documents), so a
# turn's end is not where the next turn continues: their turn marks are never shared
TRAILING = {"command-r-plus-rag", "command-r-plus-tool-use", "command-r7b-rag",
            "command-r7b-tool-use"}


def prompt(*messages):
    body = {"model": "m", "messages": list(messages), "tools": [WEATHER, TIME]}
    return prompt_request(msgspec.convert(body, ChatCompletionRequest))


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_marks_are_prefixes_later_prompts_share(name):
    t = template(name)
    text, marks = render_marked(prompt(SYSTEM, ASK), t)
    next_turn = render_chat(prompt(SYSTEM, ASK, ANSWER, NEXT), t)
    sub_agent = render_chat(prompt(SYSTEM, OTHER), t)
    kinds = [kind for _, kind in marks]
    assert "system" in kinds, marks
    offsets = [at for at, _ in marks]
    assert offsets == sorted(set(offsets)) and all(0 < at < len(text) for at in offsets)
    for at, kind in marks:
        if kind == "system":
            assert next_turn.startswith(text[:at]) and sub_agent.startswith(text[:at])
        elif name not in TRAILING:
            assert next_turn.startswith(text[:at]), (at, text[at - 40:at])


def test_most_templates_mark_a_turn_the_next_turn_shares():
    """Templates whose tools or instructions move with the last user message (Mistral's)
    have no such turn boundary; every other family has one."""
    shared = []
    for name in sorted(SOURCES):
        t = template(name)
        text, marks = render_marked(prompt(SYSTEM, ASK), t)
        next_turn = render_chat(prompt(SYSTEM, ASK, ANSWER, NEXT), t)
        if any(k == "turn" and next_turn.startswith(text[:at]) for at, k in marks):
            shared.append(name)
    assert len(shared) >= 0.8 * len(SOURCES), sorted(set(SOURCES) - set(shared))

"""The reasoning split: block markers with a channel label, harmony channels, detection
from a template and vocabulary, ``reasoning_only``, ``--reasoning-format``, and no tool
parsing inside reasoning. The same runs come out however the text is split."""

from __future__ import annotations

import random

import numpy as np
import pytest
from mlxcel.builtin.toolcalls.harmony import HarmonyParser
from mlxcel.builtin.toolcalls.hermes import new_parser as hermes_parser
from mlxcel.chat import reasoning as r
from mlxcel.chat.output import OutputMachine, merge
from mlxcel.engine.budget import ReasoningBudget
from mlxcel.families.api import ReasoningSpec
from mlxcel.model import reasoning as pick
from mlxcel.types import ContentDelta, Finish, ReasoningDelta, ToolCallStart
from mlxcel.types.messages import Tool
from test_chat_output import events, run, texts

THINK = ReasoningSpec(open="<think>", close="</think>")
GEMMA = ReasoningSpec(open="<|channel>", close="<channel|>", label="thought")
TOOLS = (Tool(name="get_weather", definition={"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}}}}),)


def split(spec, parts, seed=None, inside=False):
    machine = OutputMachine(reasoning=spec, reasoning_open=inside)
    deltas = merge(run(machine, events(parts, None if seed is None else random.Random(seed))))
    return texts(deltas, ReasoningDelta), texts(deltas, ContentDelta), deltas[-1]


@pytest.mark.parametrize("seed", [None, *range(12)])
def test_a_channel_label_is_not_reasoning_text(seed):
    parts = [("<|channel>", True), ("thought\nweigh the options", False),
             ("<channel|>", True), ("The answer.", False)]
    assert split(GEMMA, parts, seed)[:2] == ("weigh the options", "The answer.")


@pytest.mark.parametrize("seed", [None, *range(6)])
def test_labels_and_markers_split_over_ordinary_text_too(seed):
    parts = [("<|channel>thou", False), ("ght\nhmm<chan", False), ("nel|>ok", False)]
    assert split(GEMMA, parts, seed)[:2] == ("hmm", "ok")


def test_text_that_is_not_the_label_stays_reasoning():
    parts = [("<|channel>", True), ("though it seems", False), ("<channel|>", True)]
    assert split(GEMMA, parts)[0] == "though it seems"


HARMONY_ANSWER = [("<|channel|>", True), ("analysis", False), ("<|message|>", True),
                  ("the user wants a greeting", False), ("<|end|>", True),
                  ("<|start|>", True), ("assistant", False), ("<|channel|>", True),
                  ("final", False), ("<|message|>", True), ("Hello there", False)]


@pytest.mark.parametrize("seed", [None, *range(6)])
def test_harmony_analysis_is_reasoning_and_headers_never_content(seed):
    reasoning, content, finish = split(pick.HARMONY, HARMONY_ANSWER, seed)
    assert reasoning == "the user wants a greeting"
    assert content == "Hello there"
    assert not finish.reasoning_only


def test_harmony_calls_parse_outside_the_analysis_only():
    parts = [("<|channel|>", True), ("analysis", False), ("<|message|>", True),
             ('to=functions.get_weather {"city": "no"}', False), ("<|end|>", True),
             ("<|start|>", True), ("assistant", False), ("<|channel|>", True),
             ("commentary to=functions.get_weather ", False), ("<|constrain|>", True),
             ("json", False), ("<|message|>", True), ('{"city": "Paris"}', False)]
    machine = OutputMachine(reasoning=pick.HARMONY, tool_parser=HarmonyParser(),
                            special_texts=("<|channel|>", "<|message|>", "<|end|>",
                                           "<|start|>", "<|constrain|>"))
    deltas = run(machine, events(parts, random.Random(3)))
    finish = deltas[-1]
    assert [(c.name, c.arguments) for c in finish.calls] == [("get_weather",
                                                              '{"city": "Paris"}')]
    assert texts(deltas, ContentDelta) == ""
    assert 'to=functions.get_weather {"city": "no"}' in texts(deltas, ReasoningDelta)


def test_harmony_text_that_is_no_header_is_the_answer():
    parts = [("just words\nand more", False)]
    assert split(pick.HARMONY, parts)[:2] == ("", "just words\nand more")


@pytest.mark.parametrize("seed", [None, 1, 2])
def test_a_call_inside_reasoning_is_not_parsed(seed):
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    parts = [("<think>", True), (f"maybe {call}", False), ("</think>", True),
             ("No call.", False)]
    machine = OutputMachine(reasoning=THINK, tool_parser=hermes_parser(TOOLS),
                            special_texts=("<think>", "</think>"))
    deltas = run(machine, events(parts, None if seed is None else random.Random(seed)))
    assert not any(isinstance(d, ToolCallStart) for d in deltas)
    assert deltas[-1].calls == () and deltas[-1].reason == "stop"
    assert call in texts(deltas, ReasoningDelta)
    assert texts(deltas, ContentDelta) == "No call."


@pytest.mark.parametrize("parts,inside,only", [
    ([("a long thought", False)], True, True),  # the block used up the answer
    ([("thought</think>", False), ("  \n", False)], True, True),  # whitespace is no content
    ([("thought</think>", False), ("Answer", False)], True, False),
    ([("Answer", False)], False, False),  # nothing in reasoning
    ([("", False)], False, False),  # nothing at all
])
def test_reasoning_only_is_set_when_the_answer_never_left_the_reasoning(parts, inside, only):
    finish = split(THINK, parts, inside=inside)[2]
    assert isinstance(finish, Finish) and finish.reasoning_only is only


def test_deepseek_legacy_keeps_the_reasoning_in_the_content_too():
    machine = OutputMachine(reasoning=THINK, legacy_reasoning=True)
    deltas = merge(run(machine, events([("<think>hm</think>ok", False)], None)))
    assert texts(deltas, ReasoningDelta) == "hm"
    assert texts(deltas, ContentDelta) == "<think>hm</think>ok"


VOCAB = {"<think>": 1, "</think>": 2, "[THINK]": 3, "[/THINK]": 4, "<|channel|>": 5,
         "<|message|>": 6, "<|end|>": 7}


@pytest.mark.parametrize("template,vocab,found", [
    ("{{ '<think>' }}", VOCAB, ("<think>", "</think>", "block")),
    ("{{ '[THINK]' }}", VOCAB, ("[THINK]", "[/THINK]", "block")),
    ("<|channel|>analysis<|message|>", VOCAB, ("<|channel|>", "<|end|>", "harmony")),
    ("{{ '<think>' }}", {"<think>": 1}, None),  # no close token
    ("plain template", VOCAB, None),  # a vocabulary with markers the template never writes
])
def test_detect_needs_the_template_and_the_vocabulary(template, vocab, found):
    spec, why = pick.detect(template, vocab)
    assert (spec and (spec.open, spec.close, spec.style)) == found
    assert why


def test_select_prefers_the_family():
    assert pick.select(GEMMA, "{{ '<think>' }}", VOCAB) == (GEMMA, "the family's")
    assert pick.select(None, "{{ '<think>' }}", VOCAB)[0] == THINK


def test_an_unknown_style_is_refused():
    with pytest.raises(ValueError, match="unknown reasoning style"):
        r.splitter(ReasoningSpec(open="a", close="b", style="fancy"), False)


# -- the budget's matcher ------------------------------------------------------------------
def allowed(matcher, vocab=64) -> list[int]:
    row = np.zeros(2, dtype=np.int32)
    matcher.write_mask_into(row)
    bits = row.view(np.uint32)
    return [t for t in range(vocab) if bits[t // 32] >> (t % 32) & 1]


def test_a_spent_budget_forces_the_close_tokens_in_order():
    budget = ReasoningBudget(None, 2, "<think>", "</think>", (40, 41), inside=True)
    for text in ("a", "b"):
        assert budget.advance(9)
        budget.observe(text)
    assert budget.active and allowed(budget) == [40]
    assert not budget.advance(9)  # anything else is refused
    assert budget.advance(40) and allowed(budget) == [41]
    budget.observe("</")
    assert budget.advance(41)
    budget.observe("think>")
    assert not budget.active and not budget.inside and budget.used == 4


def test_a_budget_waits_for_a_block_the_model_opens():
    budget = ReasoningBudget(None, 0, "<think>", "</think>", (40,), inside=False)
    budget.observe("hello")
    assert not budget.active
    budget.observe("<thi")
    budget.observe("nk>")
    assert budget.active and allowed(budget) == [40]


def test_a_zero_budget_inside_an_opened_prompt_forces_at_once():
    assert allowed(ReasoningBudget(None, 0, "<think>", "</think>", (7, 8), inside=True)) == [7]


def test_a_broken_streamed_call_does_not_shift_the_calls_after_it():
    """Call 0 starts streaming and then breaks; call 1 parses. The whole answer's one call
    is stream index 1, with the id its start carried, and nothing diverges."""
    from mlxcel.types import ToolCallArguments

    broken = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome" oops}}\n' \
        '</tool_call>'
    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    machine = OutputMachine(tool_parser=hermes_parser(TOOLS))
    deltas = run(machine, events([(broken + "\n" + good, False)], None))
    starts = {d.index: d.id for d in deltas if isinstance(d, ToolCallStart)}
    assert sorted(starts) == [0, 1]
    finish = deltas[-1]
    assert [(c.id, c.arguments) for c in finish.calls] == [(starts[1], '{"city": "Oslo"}')]
    args = "".join(d.text for d in deltas if isinstance(d, ToolCallArguments) and d.index == 1)
    assert args == '{"city": "Oslo"}'
    assert finish.reason == "tool_calls"


@pytest.fixture(scope="module")
def harmony_checkpoint(tmp_path_factory):
    from mlxcel.model.loader import load_checkpoint
    from mlxcel.plugins import load_plugins
    from mlxcel.testing import build_checkpoint

    plugins = load_plugins()
    path = build_checkpoint(tmp_path_factory.mktemp("harmony") / "ckpt", template="harmony")
    return load_checkpoint(str(path), plugins.families, tool_formats=plugins.tool_formats)


def test_a_harmony_checkpoint_splits_its_answer_token_by_token(harmony_checkpoint):
    """The detected harmony spec and format on the loaded checkpoint, fed a gpt-oss answer
    as the engine emits it: the analysis is reasoning, the call parses, the final message
    is content, and no header reaches the content."""
    from mlxcel.chat.output import answer_machine
    from mlxcel.model.detokenizer import IncrementalDetokenizer
    from mlxcel.types import GenerationEvent, GenerationRequest
    from mlxcel.types.messages import PromptInput

    ckpt = harmony_checkpoint
    assert ckpt.reasoning == pick.HARMONY and ckpt.tool_format.name == "harmony"
    answer = ("<|channel|>analysis<|message|>Need the weather.<|end|>"
              "<|start|>assistant<|channel|>commentary to=functions.get_weather "
              "<|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>")
    req = GenerationRequest(request_id="r", prompt_tokens=(1,), max_tokens=10)
    machine = answer_machine(ckpt, req, PromptInput(token_ids=(1,), tools=TOOLS))
    detok, deltas = IncrementalDetokenizer(ckpt.tokenizer), []
    ids = ckpt.tokenizer.encode(answer)
    for n, token in enumerate(ids):
        text, span = detok.add(token)
        deltas += machine.feed(GenerationEvent(
            text=text, token_ids=(token,), specials=() if span is None else (span,),
            finish_reason="tool_calls" if n == len(ids) - 1 else None))
    merged = merge(deltas)
    assert texts(merged, ReasoningDelta) == "Need the weather."
    assert texts(merged, ContentDelta) == ""
    assert [(c.name, c.arguments) for c in merged[-1].calls] == [
        ("get_weather", '{"city": "Paris"}')]

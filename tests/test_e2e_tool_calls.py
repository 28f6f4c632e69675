"""Tool calls end to end: the real ``mlxcel-server`` on tiny checkpoints with each builtin
family template whose format has a forced-call grammar, and the real ``openai`` SDK.

Forced ``required`` and named choices return a valid call of a declared function even from
random weights; a streamed call leaks no markup and its fragments join to the arguments;
the SDK round trip (call, tool result, next turn) works; reasoning a prompt opens lands in
``reasoning_content``."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from mlxcel.testing import build_checkpoint
from mlxcel.testing.servers import MlxcelServer as Server
from mlxcel.testing.templates import STYLES

pytestmark = pytest.mark.slow

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "unit": {"type": "string", "enum": ["C", "F"]}}, "required": ["city", "unit"]}
TIME = {"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["tz"]}
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
TOOLS = [{"type": "function", "function": {"name": n, "description": f"{n} tool",
                                           "parameters": s}} for n, s in SCHEMAS.items()]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
STYLE_FORMATS = {"chatml": "hermes", "llama3": "llama3"}


@pytest.fixture(scope="module", params=sorted(STYLE_FORMATS))
def sdk(request, tmp_path_factory):
    style = request.param
    ckpt = build_checkpoint(tmp_path_factory.mktemp(style) / "ckpt", template=style)
    srv = Server(["--model", str(ckpt), "--parallel", "2"])
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0)
    client.style = style
    yield client
    srv.stop()


def create(sdk, **kw):
    return sdk.chat.completions.create(model="tiny", messages=kw.pop("messages", ASK),
                                       tools=TOOLS, max_tokens=300, temperature=1.0, **kw)


def valid(call, allowed) -> dict:
    assert call.type == "function" and call.id
    assert call.function.name in allowed
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])
    return args


def markers() -> set[str]:
    return {m for style in STYLES.values() for m in style.special if len(m) > 3}


@pytest.mark.parametrize("seed", [1, 2])
def test_required_returns_a_call_of_a_declared_function(sdk, seed):
    r = create(sdk, tool_choice="required", seed=seed)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(choice.message.tool_calls) == 1
    valid(choice.message.tool_calls[0], set(SCHEMAS))


def test_a_named_choice_returns_that_function(sdk):
    r = create(sdk, tool_choice={"type": "function", "function": {"name": "get_time"}},
               seed=3)
    assert r.choices[0].finish_reason == "tool_calls"
    valid(r.choices[0].message.tool_calls[0], {"get_time"})


def test_a_streamed_call_leaks_no_markup_and_its_fragments_join(sdk):
    chunks = list(create(sdk, tool_choice="required", seed=4, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert not any(m in content for m in markers())
    starts, args = {}, {}
    for c in chunks:
        for call in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            if call.id:
                starts[call.index] = (call.id, call.function.name)
            args[call.index] = args.get(call.index, "") + (call.function.arguments or "")
    assert len(starts) == 1 and chunks[-1].choices[0].finish_reason == "tool_calls"
    (index, (call_id, name)), = starts.items()
    assert call_id.startswith("call_") and name in SCHEMAS
    jsonschema.validate(json.loads(args[index]), SCHEMAS[name])


def test_the_sdk_round_trip_answers_the_tool_result(sdk):
    first = create(sdk, tool_choice="required", seed=5).choices[0].message
    call = first.tool_calls[0]
    history = [*ASK, first.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id,
                "content": json.dumps({"temperature": 21})}]
    nxt = create(sdk, messages=history, tool_choice="none", max_completion_tokens=8,
                 extra_body={"ignore_eos": True})
    assert nxt.choices[0].finish_reason == "length"
    assert isinstance(nxt.choices[0].message.content, str)
    assert not nxt.choices[0].message.tool_calls
    alone = create(sdk, tool_choice="none", max_completion_tokens=1)
    assert nxt.usage.prompt_tokens > alone.usage.prompt_tokens  # the call and its result


def test_reasoning_the_prompt_opens_lands_in_reasoning_content(sdk):
    """ChatML writes ``<think>``: an answer the prompt left inside the block is reasoning.
    Llama 3's template has no reasoning markers, so the same answer is content."""
    spec = STYLES[sdk.style].reasoning or ("<think>", "</think>")
    r = sdk.chat.completions.create(
        model="tiny", max_tokens=6, temperature=0,
        messages=[*ASK, {"role": "assistant", "content": spec[0] + "\n"}],
        extra_body={"continue_final_message": True, "add_generation_prompt": False,
                    "ignore_eos": True})
    message, extra = r.choices[0].message, r.choices[0].message.model_extra
    if STYLES[sdk.style].reasoning is None:
        assert message.content and "reasoning_content" not in extra
        return
    assert extra["reasoning_content"] and extra.get("reasoning_only") is True
    assert spec[0] not in extra["reasoning_content"]

"""Real chat templates of the families people run (tests/chat_templates, sources and
licences in SOURCES.toml) against the conversations agents send, through the dialects'
own translation and the chat layer, as a request would go.

Each render must succeed, or be a 400 that quotes the template's own refusal
(``raise_exception``); a render that succeeds must hold every message's text and every
call's name and argument values.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import msgspec
import pytest
from mlxcel.chat.prompt import render_chat
from mlxcel.dialects.anthropic.schemas import CountTokensRequest
from mlxcel.dialects.anthropic.translate import prompt_request as anthropic_request
from mlxcel.dialects.openai.schemas import ChatCompletionRequest
from mlxcel.dialects.openai.translate import prompt_request as openai_request
from mlxcel.errors import InvalidRequest
from mlxcel.model.chat_template import ChatTemplate
from template_fixtures import HERE, SOURCES, source_of

REFUSED = "the model's chat template refused these messages: "

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city."},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
SYSTEM = {"role": "system", "content": "You are a terse assistant named Ferris."}
ASK = {"role": "user", "content": "What is the weather in Lisbon today?"}


def call(call_id: str, name: str, city: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps({"city": city})}}


def calls_turn(content: str | None, *calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def result(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


# name -> (OpenAI chat request body, the texts the prompt must hold)
OPENAI: dict[str, dict[str, Any]] = {
    "plain": {"messages": [ASK]},
    "system_user": {"messages": [SYSTEM, ASK]},
    "multi_turn": {"messages": [
        SYSTEM, ASK, {"role": "assistant", "content": "Sunny and mild in Lisbon."},
        {"role": "user", "content": "And tomorrow in Porto?"}]},
    "tools_first_turn": {"messages": [SYSTEM, ASK], "tools": [WEATHER, TIME]},
    "tool_loop_null_content": {"messages": [
        SYSTEM, ASK, calls_turn(None, call("call_Ab12Cd34Ef56Gh78", "get_weather", "Lisbon")),
        result("call_Ab12Cd34Ef56Gh78", "Sunny, 24 degrees celsius")],
        "tools": [WEATHER, TIME]},
    "tool_loop_empty_content": {"messages": [
        SYSTEM, ASK, calls_turn("", call("call_Zy98Xw76Vu54Ts32", "get_weather", "Lisbon")),
        result("call_Zy98Xw76Vu54Ts32", "Sunny, 24 degrees celsius"),
        {"role": "assistant", "content": "It is sunny in Lisbon."},
        {"role": "user", "content": "Thanks, and the time there?"}],
        "tools": [WEATHER, TIME]},
    "parallel_calls": {"messages": [
        SYSTEM, {"role": "user", "content": "Weather and time in Madrid, please."},
        calls_turn(None, call("call_1111aaaa2222", "get_weather", "Madrid"),
                   call("call_3333bbbb4444", "get_time", "Madrid")),
        result("call_1111aaaa2222", "Cloudy, 18 degrees celsius"),
        result("call_3333bbbb4444", "Fourteen twenty local time")],
        "tools": [WEATHER, TIME]},
    "reasoning_history": {"messages": [
        ASK, {"role": "assistant", "content": "Probably sunny in Lisbon.",
              "reasoning_content": "Lisbon in summer is usually sunny."},
        {"role": "user", "content": "Are you sure about that?"}]},
    "mid_conversation_system": {"messages": [
        SYSTEM, ASK, {"role": "assistant", "content": "Sunny and mild in Lisbon."},
        {"role": "system", "content": "From now on answer in French."},
        {"role": "user", "content": "And tomorrow in Porto?"}]},
    # six rounds of parallel calls with reasoning, then a booking: the longest (and the
    # conversation bench/probes/template_render.py times)
    "long_agent_session": json.loads((HERE / "long_agent_session.json").read_text()),
}

ANTHROPIC_TOOL_LOOP = {
    "model": "any", "system": "You are a terse assistant named Ferris.",
    "tools": [{"name": "get_weather", "description": "Current weather for a city.",
               "input_schema": WEATHER["function"]["parameters"]}],
    "messages": [
        {"role": "user", "content": "What is the weather in Lisbon today?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "get_weather",
             "input": {"city": "Lisbon"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01A09q90qw90lq917835lq9",
             "content": "Sunny, 24 degrees celsius"},
            {"type": "text", "text": "Summarise it in one line."}]}],
}


def texts(messages: list[dict[str, Any]]) -> list[str]:
    """What the prompt must show: each message's text (tool results' too), each call's
    name, its argument names and their values."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str) and content:
            out.append(content)
        elif isinstance(content, list):
            out += [b.get("text") or b.get("content") for b in content
                    if isinstance(b, dict) and (b.get("text") or b.get("content"))]
        for c in m.get("tool_calls") or ():
            args = json.loads(c["function"]["arguments"])
            out += [c["function"]["name"], *args, *(str(v) for v in args.values())]
        for b in content if isinstance(content, list) else ():
            if isinstance(b, dict) and b.get("type") == "tool_use":
                out += [b["name"], *b["input"], *b["input"].values()]
    return [t for t in out if isinstance(t, str)]


def load(name: str) -> ChatTemplate:
    entry = SOURCES[name]
    return ChatTemplate(source_of(name), bos_token=entry.get("bos_token"),
                        eos_token=entry.get("eos_token"), origin=entry["file"])


_TEMPLATES: dict[str, ChatTemplate] = {}


def template(name: str) -> ChatTemplate:
    if name not in _TEMPLATES:
        _TEMPLATES[name] = load(name)
    return _TEMPLATES[name]


def rendered_or_refused(t: ChatTemplate, prompt: Any) -> str | None:
    """The prompt, or None for a 400 quoting the template's own refusal."""
    try:
        return render_chat(prompt, t)
    except InvalidRequest as exc:
        assert exc.message.startswith(REFUSED), exc.message
        return None


def check_holds(out: str, needed: list[str]) -> None:
    missing = [t for t in needed if t not in out]
    assert not missing, f"the prompt lacks {missing}"


@pytest.mark.parametrize("conversation", sorted(OPENAI))
@pytest.mark.parametrize("name", sorted(SOURCES))
def test_openai_conversation_renders(name, conversation):
    body = {"model": "any", **copy.deepcopy(OPENAI[conversation])}
    request = openai_request(msgspec.convert(body, ChatCompletionRequest))
    out = rendered_or_refused(template(name), request)
    if out is None:
        return
    needed = texts(body["messages"])
    if conversation == "reasoning_history":  # earlier reasoning may be dropped by design
        needed = [t for t in needed if "usually sunny" not in t]
    if conversation == "tools_first_turn":
        needed += ["get_weather", "get_time"]
    check_holds(out, needed)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_anthropic_tool_use_turn_renders(name):
    body = copy.deepcopy(ANTHROPIC_TOOL_LOOP)
    request = anthropic_request(msgspec.convert(body, CountTokensRequest))
    out = rendered_or_refused(template(name), request)
    if out is not None:
        check_holds(out, [body["system"], *texts(body["messages"])])


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_every_template_compiles_and_is_probed(name):
    caps = template(name).caps
    assert caps.tool_calls or not caps.parallel_tool_calls
    assert caps.arguments in ("object", "string", "any")


def test_the_matrix_covers_the_families_agents_run():
    families = {entry.get("family", "").lower() for entry in SOURCES.values()}
    for family in ("qwen3", "llama 3.1", "mistral nemo", "gemma 2", "gpt-oss", "kimi k2"):
        assert any(family in f for f in families), family
    assert len(SOURCES) >= 30


def test_calls_shown_in_the_generic_shape_parse_back():
    """Where a template renders no calls, the chat layer shows them in llama-server's
    generic shape and the server reads the model's answers as generic JSON: the example
    call the prompt shows must parse back into that call."""
    from mlxcel.chat.adapt import call_example
    from mlxcel.lazy import resolve
    from mlxcel.model.loader import select_tool_format
    from mlxcel.plugins import load_plugins
    from mlxcel.types.messages import Tool

    plugins = load_plugins(None, None)
    text_family = plugins.families.get("mlx-lm-text")
    tool = Tool(name="tool_name", definition={"type": "function", "function": {
        "name": "tool_name", "parameters": {"type": "object", "properties": {
            "arg1": {"type": "string"}}}}})
    checked = []
    for name in sorted(SOURCES):
        t = template(name)
        fmt, why = select_tool_format(plugins.tool_formats, text_family, t)
        if t.caps.tool_calls or fmt is None or fmt.name != "generic_json":
            continue
        parser = resolve(fmt.parser)((tool,))
        parser.feed(call_example(t))
        calls = [(c.name, json.loads(c.arguments)) for c in parser.finish().calls]
        assert calls == [("tool_name", {"arg1": "some_value"})], (name, why)
        checked.append(name)
    assert {"gemma-2", "gemma-3", "phi-4", "smollm3"} <= set(checked), checked


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_jinja_matches_transformers(name):
    """Where transformers' own environment renders a template, ours renders the same
    text for the same messages (its ``tojson``, trimming, loop controls, generation
    block); ours may render more (a template's own lists, legacy variables)."""
    utils = pytest.importorskip("transformers.utils.chat_template_utils")
    entry = SOURCES[name]
    theirs = utils._compile_jinja_template(source_of(name))
    special = {"bos_token": entry.get("bos_token") or "",
               "eos_token": entry.get("eos_token") or ""}
    compared = 0
    for conversation in ("plain", "system_user", "multi_turn", "tools_first_turn"):
        body = OPENAI[conversation]
        kwargs = {"messages": copy.deepcopy(body["messages"]), "add_generation_prompt": True,
                  **({"tools": copy.deepcopy(body["tools"])} if "tools" in body else {})}
        try:
            expected = theirs.render(**kwargs, **special)
        except Exception:  # noqa: BLE001 - what transformers cannot render is not compared
            continue
        assert template(name).render_raw(**copy.deepcopy(kwargs)) == expected, conversation
        compared += 1
    assert compared or name in TRANSFORMERS_FAILS, name


# Templates transformers' environment cannot render at all (legacy variables it never
# sets): firefunction-v2 reads `functions` and `datetime`.
TRANSFORMERS_FAILS = {"firefunction-v2"}


def test_a_templates_own_call_parses_back():
    """Where a template renders calls in its own markup (DeepSeek V3.1's and R1's
    full-width markers, FireFunction v2's ``functools[``), the format its template selects
    reads that call back (``call_example``: the call turn as the template renders it; R1's
    generation prompt ends in a ``<think>`` its call turn does not write)."""
    from mlxcel.chat.adapt import call_example
    from mlxcel.lazy import resolve
    from mlxcel.model.loader import select_tool_format
    from mlxcel.plugins import load_plugins
    from mlxcel.types.messages import Tool

    plugins = load_plugins(None, None)
    text_family = plugins.families.get("mlx-lm-text")
    tool = Tool(name="tool_name", definition={"type": "function", "function": {
        "name": "tool_name", "parameters": {"type": "object", "properties": {
            "arg1": {"type": "string"}}}}})
    expected = {"deepseek-v3.1": "deepseek_v3_1", "deepseek-r1-distill-qwen": "deepseek_r1",
                "deepseek-r1-distill-llama": "deepseek_r1",
                "firefunction-v2": "firefunction_v2"}
    for name, format_name in expected.items():
        t = template(name)
        fmt, why = select_tool_format(plugins.tool_formats, text_family, t)
        assert (fmt and fmt.name, why) == (format_name, "detected in the chat template")
        shown = call_example(t)
        assert "tool_name" in shown, (name, shown)
        parser = resolve(fmt.parser)((tool,))
        parser.feed(shown)
        calls = [(c.name, json.loads(c.arguments)) for c in parser.finish().calls]
        assert calls == [("tool_name", {"arg1": "some_value"})], (name, shown)

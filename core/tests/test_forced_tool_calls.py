"""Forced tool choice: ``required`` and a named function constrain even a random-weight
model's answer to a call of a declared function, for the formats whose wire form wraps a
JSON object in fixed markup (Hermes here, the test checkpoint's ChatML template; Mistral
Nemo and Llama 3 through their grammars on the engine)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from apphelpers import forced_answers
from mlxcel.engine.constraints import ConstraintCompiler
from mlxcel.lazy import resolve
from mlxcel.plugins import load_plugins
from mlxcel.testing.engine import engine_for, run
from mlxcel.types import GenerationRequest
from mlxcel.types.messages import Tool
from mlxcel.types.toolcalls import ParseResult

CHAT = "/v1/chat/completions"
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "unit": {"type": "string", "enum": ["C", "F"]}}, "required": ["city", "unit"]}
TIME = {"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["tz"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
BODY = {"messages": [{"role": "user", "content": "What is the weather?"}], "tools": TOOLS,
        "max_tokens": 400, "temperature": 1.0}


def check_call(name: str, arguments: str, allowed: set[str]) -> None:
    assert name in allowed
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_required_yields_a_call_of_a_declared_function(client, seed):
    r = client.post(CHAT, json={**BODY, "tool_choice": "required", "seed": seed})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    assert choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    check_call(call["function"]["name"], call["function"]["arguments"], set(SCHEMAS))


def test_a_named_choice_yields_that_function(client):
    named = {"type": "function", "function": {"name": "get_time"}}
    r = client.post(CHAT, json={**BODY, "tool_choice": named, "seed": 4})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    check_call(call["function"]["name"], call["function"]["arguments"], {"get_time"})


def test_streamed_calls_leak_no_markup_and_fragments_join_to_the_arguments(client):
    r = client.post(CHAT, json={**BODY, "tool_choice": "required", "seed": 5, "stream": True})
    frames = [json.loads(line[6:]) for line in r.text.split("\n\n")
              if line.startswith("data: {")]
    deltas = [f["choices"][0]["delta"] for f in frames if f["choices"]]
    finish = [f["choices"][0]["finish_reason"] for f in frames if f["choices"]][-1]
    assert finish == "tool_calls"
    assert not "".join(d.get("content") or "" for d in deltas)
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    assert all(c["index"] == 0 for c in calls) and len(calls) > 2  # fragments streamed
    arguments = "".join(c["function"].get("arguments", "") for c in calls)
    check_call(calls[0]["function"]["name"], arguments, set(SCHEMAS))


def test_a_forced_choice_with_a_constrained_response_format_is_refused(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": TIME}}
    r = client.post(CHAT, json={**BODY, "tool_choice": "required", "response_format": fmt})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "tool_choice"


# what each answer starts with, and its markers that are added tokens of the checkpoint
START = {"hermes": ("<tool_call>", ("<tool_call>", "</tool_call>")),
         "mistral_nemo": ("[TOOL_CALLS]", ()), "llama3": ("{", ())}


@pytest.mark.parametrize("name", sorted(START))
def test_each_builtin_grammar_forces_a_call_its_parser_reads(tiny_checkpoint, name):
    """Each call's markers are written as the tokenizer's added tokens where it has them
    (the ChatML checkpoint's ``<tool_call>``), else spelled (``[TOOL_CALLS]``)."""
    fmt = load_plugins().tool_formats.get(name)
    tools = tuple(Tool(name=t["function"]["name"], definition=t) for t in TOOLS)
    tok, outputs = forced_answers(tiny_checkpoint, resolve(fmt.grammar)(tools, "required"), 400, "g")
    start, markers = START[name]
    for ids, last in outputs:
        assert last.finish_reason == "stop"
        text = tok.decode(ids, skip_special=False)
        assert text.startswith(start)
        for marker in markers:
            assert ids.count(tok.hf.token_to_id(marker)) == text.count(marker) == 1
        parser = resolve(fmt.parser)(tools)
        parser.feed(tok.decode(ids, skip_special=False))
        result: ParseResult = parser.finish()
        assert result.calls, tok.decode(ids)
        for call in result.calls:
            check_call(call.name, call.arguments, set(SCHEMAS))


def test_with_logprobs_every_token_behind_a_call_gets_a_placeholder_chunk(client):
    """The spec: one chunk with empty content and filled logprobs per token whose text
    went into a call, so logprob entries and SSE positions stay one to one."""
    r = client.post(CHAT, json={**BODY, "tool_choice": "required", "seed": 6, "stream": True,
                                "logprobs": True})
    frames = [json.loads(line[6:]) for line in r.text.split("\n\n")
              if line.startswith("data: {")]
    choices = [f["choices"][0] for f in frames if f["choices"]]
    entries = [e for c in choices if c.get("logprobs") for e in c["logprobs"]["content"]]
    usage = client.post(CHAT, json={**BODY, "tool_choice": "required", "seed": 6}).json()
    assert len(entries) == usage["usage"]["completion_tokens"]
    placeholders = [c for c in choices if c.get("logprobs") and c["delta"].get("content") == ""]
    assert placeholders and all("tool_calls" not in c["delta"] for c in placeholders)
    assert not "".join(c["delta"].get("content") or "" for c in choices)


def test_loop_detection_waits_for_the_constraint_to_match(tiny_checkpoint):
    """A constraint whose output is one character 30 times is a loop by any policy; the
    row still runs to the end of its match instead of being cut inside it."""
    from mlxcel.types import LoopPolicy
    from mlxcel.types.constraints import RegexConstraint

    engine = engine_for(tiny_checkpoint, 1)
    try:
        tok = engine.worker.checkpoint.tokenizer
        compiler = ConstraintCompiler.for_tokenizer(tok, eos_ids=set(tok.eos_ids))
        guide = compiler.compile(RegexConstraint(pattern="7{30}"))
        req = GenerationRequest(request_id="loop", prompt_tokens=(5, 6, 7), max_tokens=60,
                                guide=guide, loop=LoopPolicy(min_pattern_size=1,
                                                             max_pattern_size=4, min_count=3))
        (ids, last), = run(engine, [req])
    finally:
        engine.shutdown()
    assert tok.decode(ids) == "7" * 30 and last.finish_reason == "stop"

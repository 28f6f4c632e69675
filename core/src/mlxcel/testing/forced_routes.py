"""The forced-call runner: a tool format's grammar, through the server's routes.

A format with a ``grammar`` promises that ``tool_choice`` ``required`` or a named function
gives calls the parser reads, of a declared function (named: that one), with the schema's
required arguments and values of its types, streamed and whole. ``check_forced_routes``
drives an app (``mlxcel.testing.engine.app_client`` on a tiny checkpoint whose template
writes the format) through ``/v1/chat/completions`` and checks all of that;
``check_grammar_compiles`` runs ``conformance.check_grammar`` with the checkpoint's own
vocabulary and a schema grown with odd and deep properties. A distribution's grammar test
calls both, so every format is held to the same rules.
"""

from __future__ import annotations

import json
from typing import Any

from mlxcel.types.messages import Tool

CHAT = "/v1/chat/completions"

# a function's parameters that every forced-call test can use: a bounded string, an enum
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10},
    "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer"}}, "required": ["city", "unit"]}

# properties a client may add that stress a grammar: a free object, nested arrays, a union
DEEP_PROPERTIES = {
    "filters": {"type": "object"},
    "ids": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
    "mode": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
}


def tool(name: str, parameters: Any) -> Tool:
    """A function tool as the chat path hands it to a format."""
    return Tool(name=name, definition={"type": "function", "function": {
        "name": name, "parameters": parameters}})


def function_tools(schemas: dict[str, dict]) -> tuple[list[dict], tuple[Tool, ...]]:
    """``schemas`` (name -> parameters) as a request's wire ``tools`` and as ``Tool``s."""
    defs = [{"type": "function", "function": {"name": n, "parameters": s}}
            for n, s in schemas.items()]
    return defs, tuple(tool(d["function"]["name"], d["function"]["parameters"]) for d in defs)


def check_call(schemas: dict[str, dict], name: str, arguments: str, allowed: Any) -> None:
    """A call names one of ``allowed`` and its arguments are valid for its schema."""
    import jsonschema

    assert name in allowed, f"{name!r} is not one of {sorted(allowed)}"
    jsonschema.validate(json.loads(arguments), schemas[name])


def _post(client: Any, schemas: dict[str, dict], **extra: Any) -> Any:
    defs, _ = function_tools(schemas)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": defs, "max_tokens": 300, "temperature": 1.0, **extra}
    r = client.post(CHAT, json=body)
    assert r.status_code == 200, r.text
    return r


def check_forced_routes(client: Any, schemas: dict[str, dict], streamed: str,
                        seeds: tuple[int, ...] = (1, 2, 3)) -> list[dict]:
    """``required`` yields calls of declared functions (one request per seed), each named
    choice yields that function, and a streamed named call of ``streamed`` leaks no
    markup and its fragments join into valid arguments. Returns the streamed call's
    deltas, for the format's own checks of how it streams."""
    for seed in seeds:
        choice = _post(client, schemas, tool_choice="required", seed=seed).json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        assert choice["message"]["content"] is None
        assert choice["message"]["tool_calls"]
        for call in choice["message"]["tool_calls"]:
            assert call["type"] == "function" and call["id"].startswith("call_")
            check_call(schemas, call["function"]["name"], call["function"]["arguments"],
                       set(schemas))
    for name in sorted(schemas):
        named = {"type": "function", "function": {"name": name}}
        choice = _post(client, schemas, tool_choice=named, seed=4).json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        for call in choice["message"]["tool_calls"]:
            check_call(schemas, call["function"]["name"], call["function"]["arguments"],
                       {name})
    return _check_streamed(client, schemas, streamed)


def _check_streamed(client: Any, schemas: dict[str, dict], name: str) -> list[dict]:
    named = {"type": "function", "function": {"name": name}}
    r = _post(client, schemas, tool_choice=named, seed=5, stream=True)
    frames = [json.loads(line[6:]) for line in r.text.split("\n\n")
              if line.startswith("data: {")]
    deltas = [f["choices"][0]["delta"] for f in frames if f["choices"]]
    finishes = [f["choices"][0]["finish_reason"] for f in frames if f["choices"]]
    assert finishes[-1] == "tool_calls", finishes
    assert not "".join(d.get("content") or "" for d in deltas), "markup leaked as content"
    first = [c for d in deltas for c in d.get("tool_calls", []) if c["index"] == 0]
    assert first[0]["function"]["name"] == name
    check_call(schemas, name, "".join(c["function"].get("arguments", "") for c in first),
               {name})
    return first


def check_grammar_compiles(grammar: Any, checkpoint: Any, cache_dir: Any,
                           schema: dict) -> None:
    """``conformance.check_grammar`` with ``checkpoint``'s vocabulary, for ``schema``
    grown by ``DEEP_PROPERTIES``: odd and 40-deep tool schemas compile, and the pattern
    grows linearly with the tools."""
    from mlxcel.engine.constraints import TokenVocabulary
    from mlxcel.model.tokenizer import Tokenizer
    from mlxcel.testing.conformance import check_grammar

    vocabulary = TokenVocabulary.from_tokenizer(Tokenizer.from_dir(checkpoint))
    check_grammar(grammar, vocabulary, cache_dir, {
        **schema, "properties": {**schema.get("properties", {}), **DEEP_PROPERTIES}})

"""Structured output in process: ``response_format`` constrains the tiny random-weight
model's answer, constrained and free rows share a batch, seeded constrained sampling
repeats, a constraint can wait for a reasoning block's end, and every refusal is a 400
that does not echo the schema. (Every corpus schema, streamed and not, through the real
server: tests/test_e2e_structured_output.py.)"""

from __future__ import annotations

import json

import jsonschema
import pytest
from mlxcel.engine.constraints import ConstraintCompiler
from mlxcel.testing.engine import engine_for, run, solo_tokens
from mlxcel.types import GenerationRequest, SamplingParams
from mlxcel.types.constraints import JsonSchemaConstraint

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "Give me the JSON."}]
FORMATS = jsonschema.FormatChecker(formats=("email", "uuid"))


def fmt(schema) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "out", "strict": True,
                                                   "schema": schema}}


def valid(text: str, schema) -> None:
    jsonschema.validate(json.loads(text), schema, format_checker=FORMATS)


def test_legacy_completions_take_a_response_format(client):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 500, "seed": 1,
                                             "response_format": fmt(schema)})
    assert r.status_code == 200, r.text
    valid(r.json()["choices"][0]["text"], schema)


def test_text_or_no_format_is_free_generation(client):
    body = {"messages": USER, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    free = client.post(CHAT, json=body).json()["choices"][0]["message"]["content"]
    text = client.post(CHAT, json={**body, "response_format": {"type": "text"}}).json()
    assert text["choices"][0]["message"]["content"] == free


SECRET = "do-not-echo-me"


def nested(depth: int) -> dict:
    schema: dict = {"type": "string", "description": SECRET}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


REFUSED = [
    ({"type": "json_object"}, "json_object"),
    ({"type": "regex"}, "response_format.type"),
    ({"type": "json_schema"}, "json_schema"),
    (fmt({"type": "string", "description": SECRET * 8000}), "64 KiB"),
    (fmt(nested(40)), "deep"),
    (fmt({"$defs": {"s": {"type": "string", "description": SECRET}},
          "type": "array", "prefixItems": [{"$ref": "#/$defs/s"}] * 70}), "$ref"),
    (fmt({"not": {"type": "string", "description": SECRET}}), "not"),
    (fmt({"if": {"type": "string"}, "then": {"description": SECRET}}), "if"),
]


@pytest.mark.parametrize("response_format,words", REFUSED)
def test_refusals_are_400s_that_do_not_echo_the_schema(client, response_format, words):
    r = client.post(CHAT, json={"messages": USER, "response_format": response_format})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert words in error["message"], error["message"]
    assert SECRET not in r.text


SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                           "days": {"type": "integer"}},
          "required": ["city", "days"], "additionalProperties": False}


def test_constrained_and_free_rows_share_a_batch(tiny_checkpoint):
    """Free rows decode exactly as they do alone; constrained rows hold their schema; a
    seeded constrained request gives the same answer twice."""
    engine = engine_for(tiny_checkpoint, 4)
    try:
        tok = engine.worker.checkpoint.tokenizer
        compiler = ConstraintCompiler.for_tokenizer(tok, eos_ids=set(tok.eos_ids))
        guide = compiler.compile(JsonSchemaConstraint.from_schema(SCHEMA))

        def req(i, guided, seed=None):
            sampling = SamplingParams(temperature=1.0 if guided else 0.0, seed=seed)
            return GenerationRequest(request_id=f"r{i}", prompt_tokens=(5, 6, 7 + i),
                                     max_tokens=400 if guided else 12, sampling=sampling,
                                     ignore_eos=not guided, guide=guide if guided else None)

        reqs = [req(0, False), req(1, True, 3), req(2, False), req(3, True, 4)]
        first = run(engine, reqs)
        again = run(engine, [req(1, True, 3)])
    finally:
        engine.shutdown()
    alone = solo_tokens(tiny_checkpoint, [reqs[0], reqs[2]])
    assert [first[0][0], first[2][0]] == alone
    for ids, last in (first[1], first[3]):
        assert last.finish_reason == "stop"
        valid(tok.decode(ids), SCHEMA)
    assert again[0][0] == first[1][0]


def test_a_constraint_can_wait_for_the_end_of_a_reasoning_block(tiny_checkpoint):
    """``guide_after``: tokens are free until the output holds the marker (here split
    over several tokens), then the constraint applies from its first state."""
    from mlxcel.engine.sequence import Sequence
    from mlxcel.testing.engine import ListSink, worker_for

    worker = worker_for(tiny_checkpoint)
    tok = worker.checkpoint.tokenizer
    compiler = ConstraintCompiler.for_tokenizer(tok, eos_ids=set(tok.eos_ids))
    guide = compiler.compile(JsonSchemaConstraint.from_schema({"type": "integer"}))
    req = GenerationRequest(request_id="r", prompt_tokens=(5, 6), max_tokens=50, guide=guide,
                            guide_after="</answer-starts>")
    seq = Sequence(req, ListSink(), tok, set(tok.eos_ids), 0)
    for token in tok.encode("free text, not a number </answer-"):
        seq.accept(token)
    assert not seq.matcher.active
    for token in tok.encode("starts>"):
        seq.accept(token)
    assert seq.matcher.active
    digit = tok.encode("7")[0]
    letter = tok.encode("x")[0]
    seq.accept(digit)
    with pytest.raises(RuntimeError, match="outside the output constraint"):
        seq.accept(letter)


def test_serving_without_a_schema_never_imports_outlines_core():
    from mlxcel.testing.imports import imported_by

    serving = "import mlxcel.app, mlxcel.engine.worker, mlxcel.engine.batch"
    assert imported_by(serving, ("outlines_core",)) == []

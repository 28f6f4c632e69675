"""Every schema of the corpus (data/constraint_schemas.json), walked token by token.

Each walk drives a matcher with seeded random choices among the tokens its mask allows,
on a tiny checkpoint's real tokenizer, then finishes along the shortest way to an
accepting state that outlines-core's own transition table gives; the tokens are decoded
by the tokenizer and the text must parse and validate with the ``jsonschema`` package.
Formats are checked as docs/explanation/structured-output.md says they are enforced.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import random
from collections import deque

import jsonschema
import numpy as np
import pytest
from mlxcel.engine.constraints import ConstraintCompiler, TokenVocabulary, mask_words
from mlxcel.types.constraints import JsonSchemaConstraint

CORPUS = json.loads((pathlib.Path(__file__).parent / "data" / "constraint_schemas.json")
                    .read_text(encoding="utf-8"))
SEEDS = (0, 1, 2)
RANDOM_STEPS = 40
MAX_STEPS = 2000
FORMATS = jsonschema.FormatChecker(formats=("email", "uuid"))


@FORMATS.checks("date", raises=ValueError)
def _date(value: str) -> bool:
    """An ISO date Python parses; February 29 of any year is the documented gap."""
    if value[4:] == "-02-29":
        value = "2024" + value[4:]
    return len(value) == 10 and datetime.date.fromisoformat(value) is not None


@FORMATS.checks("date-time", raises=ValueError)
def _date_time(value: str) -> bool:
    """RFC 3339: a date, ``T``, a time with its UTC offset (``Z`` or ``+hh:mm``)."""
    head, sep, _ = value.partition("T")
    if not sep or not _date(head):
        return False
    if head[4:] == "-02-29":
        value = "2024" + value[4:]
    return datetime.datetime.fromisoformat(value).tzinfo is not None


@pytest.fixture(scope="module")
def eos_ids(tokenizer):
    """Two EOS ids (the template's end of turn and the end of text): both must count."""
    ids = {tokenizer.hf.token_to_id("<|endoftext|>"), tokenizer.hf.token_to_id("<|im_end|>")}
    assert None not in ids and len(ids) == 2
    return ids


@pytest.fixture(scope="module")
def compiler(tokenizer, eos_ids, tmp_path_factory):
    vocabulary = TokenVocabulary.from_tokenizer(tokenizer, eos_ids)
    return ConstraintCompiler(vocabulary, cache_dir=tmp_path_factory.mktemp("constraints"))


def _distances(index) -> dict[int, int]:
    """Tokens needed from each state to an accepting one (outlines-core's table)."""
    back: dict[int, set[int]] = {}
    for state, moves in index.get_transitions().items():
        for nxt in moves.values():
            back.setdefault(nxt, set()).add(state)
    dist = {s: 0 for s in index.get_final_states()}
    queue = deque(dist)
    while queue:
        state = queue.popleft()
        for prev in back.get(state, ()):
            if prev not in dist:
                dist[prev] = dist[state] + 1
                queue.append(prev)
    return dist


def _allowed(row: np.ndarray, size: int) -> np.ndarray:
    return np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")[:size])


def walk(compiled, eos_ids: set[int], size: int, seed: int) -> list[int]:
    """The tokens of one seeded walk to an accepted EOS (the EOS not included)."""
    rng, dist = random.Random(seed), _distances(compiled.index)
    transitions = compiled.index.get_transitions()
    matcher, row, out = compiled.matcher(), np.zeros(mask_words(size) + 1, np.int32), []
    for step in range(MAX_STEPS):
        matcher.write_mask_into(row)
        allowed = set(_allowed(row, size).tolist())
        assert row[-1] == 0, "words past the vocabulary stay zero"
        assert (eos_ids <= allowed) == matcher.accepting and (allowed & eos_ids) in (set(), eos_ids)
        choices = sorted(allowed - eos_ids)
        if matcher.accepting and (not choices or rng.random() < 0.3 or step >= RANDOM_STEPS):
            assert matcher.advance(rng.choice(sorted(eos_ids))) and matcher.finished
            return out
        if step >= RANDOM_STEPS:  # finish: the allowed token that leads closest to the end
            moves = transitions[matcher.state]
            token = min(choices, key=lambda t: (dist[moves[t]], t))
        else:
            token = rng.choice(choices)
        assert matcher.advance(token)
        out.append(token)
    raise AssertionError("no accepting state within the step bound")


@pytest.mark.parametrize("case", CORPUS, ids=[c["name"] for c in CORPUS])
def test_every_walk_of_every_schema_decodes_to_a_valid_instance(case, compiler, tokenizer,
                                                                 eos_ids):
    compiled = compiler.compile(JsonSchemaConstraint.from_schema(case["schema"]))
    size = compiler.vocabulary().size
    validator = jsonschema.Draft202012Validator(case["schema"], format_checker=FORMATS)
    texts = set()
    for seed in SEEDS:
        text = tokenizer.decode(walk(compiled, eos_ids, size, seed))
        validator.validate(json.loads(text))
        texts.add(text)
    assert texts


def test_the_corpus_covers_what_the_issue_lists():
    assert len(CORPUS) >= 30
    text = json.dumps([c["schema"] for c in CORPUS])
    for needle in ('"enum"', '"minItems"', '"maxItems"', '"integer"', '"number"', '"boolean"',
                   '"null"', '"pattern"', '"date"', '"date-time"', '"email"', '"uuid"',
                   '"$ref"', '"$defs"', '"anyOf"', '"additionalProperties": false',
                   '"required"'):
        assert needle in text, needle
    assert any(c["schema"].get("type") == "array" for c in CORPUS)
    assert any(ord(ch) > 127 for c in CORPUS for ch in json.dumps(c["schema"],
                                                                  ensure_ascii=False))


def test_a_seeded_walk_repeats_and_another_seed_differs(compiler, tokenizer, eos_ids):
    case = next(c for c in CORPUS if c["name"] == "nested_object")
    compiled = compiler.compile(JsonSchemaConstraint.from_schema(case["schema"]))
    size = compiler.vocabulary().size
    runs = [walk(compiled, eos_ids, size, seed) for seed in (7, 7, 8)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_eos_is_refused_before_the_value_is_complete(compiler, eos_ids):
    compiled = compiler.compile(JsonSchemaConstraint.from_schema({"enum": ["on", "off"]}))
    matcher = compiled.matcher()
    assert not matcher.accepting
    for eos in eos_ids:
        assert not matcher.advance(eos) and not matcher.finished

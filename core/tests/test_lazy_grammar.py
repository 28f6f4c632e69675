"""A lazy grammar (llama-server's ``grammar_lazy``) on the real engine: the output is free
until a trigger, then the grammar holds from the trigger's start, the trigger's own text
fed through it (a word that begins inside a token replays that token's tail), and a
grammar that refuses the trigger's text fails the row."""

from __future__ import annotations

import json
import re

import msgspec
import pytest
from mlxcel.engine.constraints import ConstraintCompiler
from mlxcel.testing.engine import ListSink, request, run_until_done, worker_for
from mlxcel.types import SamplingParams
from mlxcel.types.constraints import GrammarConstraint
from mlxcel.types.requests import LazyStart

PROMPT = [5, 6, 7, 8, 9, 10]
# seeded: the same tokens each run up to the trigger (greedy repeats one letter here)
SEEDED = SamplingParams(temperature=1.0, seed=1)
WORD = re.compile(r"[A-Za-z]{2,}")


@pytest.fixture(scope="module")
def worker(tiny_checkpoint):
    return worker_for(tiny_checkpoint, parallel=2)


@pytest.fixture(scope="module")
def compile_(worker, tmp_path_factory):
    tok = worker.checkpoint.tokenizer
    compiler = ConstraintCompiler.for_tokenizer(tok, eos_ids=set(tok.eos_ids),
                                                cache_dir=tmp_path_factory.mktemp("g"))
    return lambda grammar: compiler.compile(GrammarConstraint(grammar=grammar))


def generate(worker, max_tokens: int, **kw) -> ListSink:
    """A seeded answer that may end at EOS (after a grammar's end, it must)."""
    sink = ListSink()
    worker.enqueue(msgspec.structs.replace(request(PROMPT, max_tokens, SEEDED, **kw),
                                           ignore_eos=False), sink)
    run_until_done(worker, [sink])
    return sink


@pytest.fixture(scope="module")
def free(worker):
    """The seeded free answer, token by token: [(token, its text)]."""
    sink = generate(worker, 32)
    return [(e.token_ids[0], e.text) for e in sink.events if e.token_ids]


def text_of(sink: ListSink) -> str:
    return "".join(e.text for e in sink.events)


def word_across_tokens(free) -> tuple[str, int]:
    """A word that begins inside one token and ends with the next, first seen there:
    the word and where the free text ends after it."""
    texts = [t for _, t in free]
    for k in range(1, len(texts)):
        prev, cur = texts[k - 1], texts[k]
        if WORD.fullmatch(cur) and re.search(r"[A-Za-z]{2,}$", prev):
            word = prev[1:] + cur if len(prev) > 1 and prev[0].isalpha() else prev[-2:] + cur
            end = len("".join(texts[:k + 1]))
            if "".join(texts[:k + 1]).find(word) == end - len(word):
                return word, end
    pytest.skip("the free answer has no word across two letter tokens")


def literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def test_free_until_a_word_then_the_grammar_from_the_words_start(worker, compile_, free):
    word, end = word_across_tokens(free)
    guide = compile_(f'root ::= {literal(word)} "aaaaa"')
    sink = generate(worker, 48, guide=guide,
                    guide_lazy=LazyStart(patterns=(re.escape(word),)))
    free_text = "".join(t for _, t in free)
    assert sink.last.finish_reason == "stop", sink.last.error
    assert text_of(sink) == free_text[:end] + "aaaaa"


def test_a_trigger_token_starts_the_grammar_at_that_token(worker, compile_, free):
    k = next((i for i, (_, t) in enumerate(free) if i and WORD.fullmatch(t)), None)
    if k is None:
        pytest.skip("the free answer has no letter token")
    token, piece = free[k]
    guide = compile_(f'root ::= {literal(piece)} "aaaaa"')
    sink = generate(worker, 48, guide=guide, guide_lazy=LazyStart(tokens=(token,)))
    before = "".join(t for _, t in free[:k])
    assert sink.last.finish_reason == "stop", sink.last.error
    assert text_of(sink) == before + piece + "aaaaa"


def test_no_trigger_leaves_the_answer_free(worker, compile_, free):
    guide = compile_('root ::= "aaaaa"')
    sink = generate(worker, 32, guide=guide,
                    guide_lazy=LazyStart(patterns=("never-in-this-output",)))
    assert [e.token_ids[0] for e in sink.events if e.token_ids] == [t for t, _ in free]


def test_a_grammar_that_refuses_the_trigger_fails_the_row(worker, compile_, free):
    word, _ = word_across_tokens(free)
    guide = compile_('root ::= "0" "aaaaa"')
    sink = generate(worker, 48, guide=guide,
                    guide_lazy=LazyStart(patterns=(re.escape(word),)))
    assert sink.last.finish_reason == "error" and "trigger" in sink.last.error

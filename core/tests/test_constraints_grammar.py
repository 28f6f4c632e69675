"""GBNF grammars through the llguidance backend: the compiler routes them there, the
matcher keeps the protocol's rules (EOS only where the grammar may end, a refused token
leaves the state alone), and a bad grammar is a 400 that says where."""

from __future__ import annotations

import numpy as np
import pytest
from mlxcel.engine.constraints import ConstraintCompiler, mask_words
from mlxcel.engine.constraints.llguidance import MAX_GRAMMAR_BYTES, LLGuidanceBackend
from mlxcel.errors import ConstraintTooComplex, UnsupportedSchema
from mlxcel.types.constraints import GrammarConstraint, JsonSchemaConstraint


@pytest.fixture(scope="module")
def compiler(vocabulary, tmp_path_factory):
    return ConstraintCompiler(vocabulary, cache_dir=tmp_path_factory.mktemp("grammars"))


def allowed(matcher, size: int) -> list[int]:
    row = np.zeros(mask_words(size), np.int32)
    matcher.write_mask_into(row)
    return np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")).tolist()


def walk(matcher, vocabulary, seed: int, limit: int = 64) -> tuple[bytes, bool]:
    """A random walk through the allowed tokens: the bytes and whether it ended."""
    rng = np.random.default_rng(seed)
    out = b""
    for _ in range(limit):
        choices = allowed(matcher, vocabulary.size)
        token = int(rng.choice(choices))
        assert matcher.advance(token)
        if matcher.finished:
            return out, True
        out += vocabulary.tokens[token]
    return out, False


@pytest.mark.parametrize("grammar", ['root ::= "aaaaa"', 'root ::= "a"{5}',
                                     'root ::= a a a a a\na ::= "a"'])
def test_five_as_and_nothing_else(compiler, vocabulary, grammar):
    compiled = compiler.compile(GrammarConstraint(grammar=grammar))
    for seed in range(4):
        assert walk(compiled.matcher(), vocabulary, seed) == (b"aaaaa", True)


def test_eos_only_where_the_grammar_may_end(compiler, vocabulary):
    compiled = compiler.compile(GrammarConstraint(grammar='root ::= "ab" | "abab"'))
    matcher = compiled.matcher()
    eos = min(vocabulary.eos_ids)
    assert eos not in allowed(matcher, vocabulary.size) and not matcher.accepting
    assert matcher.advance(eos) is False and not matcher.finished
    for byte in b"ab":
        assert matcher.advance(next(t for t, raw in vocabulary.tokens.items()
                                    if raw == bytes([byte])))
    assert matcher.accepting and eos in allowed(matcher, vocabulary.size)


def test_a_refused_token_leaves_the_state_alone(compiler, vocabulary):
    matcher = compiler.compile(GrammarConstraint(grammar='root ::= "a"{5}')).matcher()
    b = next(t for t, raw in vocabulary.tokens.items() if raw == b"b")
    assert matcher.advance(b) is False
    assert walk(matcher, vocabulary, 0) == (b"aaaaa", True)


def test_an_inactive_matcher_allows_everything_until_started(compiler, vocabulary):
    matcher = compiler.compile(GrammarConstraint(grammar='root ::= "x"')).matcher(
        active=False)
    assert len(allowed(matcher, vocabulary.size)) == mask_words(vocabulary.size) * 32
    assert matcher.advance(5) and not matcher.finished
    matcher.start()
    assert walk(matcher, vocabulary, 0) == (b"x", True)


def test_special_tokens_are_never_grammar_text(compiler, vocabulary):
    """An added token (``<think>``) is not the text it spells: a grammar over that text
    is written in ordinary pieces, as the JSON-schema backend does."""
    compiled = compiler.compile(GrammarConstraint(grammar='root ::= "<think>"'))
    seen = set()
    matcher = compiled.matcher()
    for _ in range(16):
        choices = allowed(matcher, vocabulary.size)
        seen.update(choices)
        token = choices[0]
        assert matcher.advance(token)
        if matcher.finished:
            break
    assert not seen & set(vocabulary.added.values())


@pytest.mark.parametrize("grammar,words", [
    ("root ::= (", "line 1"),
    ("root ::= foo", "foo"),
    ('start ::= "a"', "root"),
])
def test_invalid_grammars_are_400s_that_say_where(compiler, grammar, words):
    with pytest.raises(UnsupportedSchema) as err:
        compiler.compile(GrammarConstraint(grammar=grammar))
    assert err.value.status == 400 and err.value.param == "grammar"
    assert words in err.value.message


def test_limits_are_checked_before_any_compile(compiler):
    with pytest.raises(UnsupportedSchema, match="empty"):
        compiler.submit(GrammarConstraint(grammar="  "))
    with pytest.raises(ConstraintTooComplex, match="KiB"):
        compiler.submit(GrammarConstraint(grammar='root ::= "' + "a" * MAX_GRAMMAR_BYTES
                                          + '"'))


def test_each_kind_goes_to_its_backend(compiler):
    assert isinstance(compiler.backend_for(GrammarConstraint(grammar='root ::= "a"')),
                      LLGuidanceBackend)
    assert compiler.backend_for(JsonSchemaConstraint(schema="{}")) is compiler.backend
    with pytest.raises(UnsupportedSchema):
        LLGuidanceBackend().check(JsonSchemaConstraint(schema="{}"))


def test_a_compiled_grammar_comes_back_from_disk(vocabulary, tmp_path):
    grammar = GrammarConstraint(grammar='root ::= "yes" | "no"')
    ConstraintCompiler(vocabulary, cache_dir=tmp_path).compile(grammar)
    again = ConstraintCompiler(vocabulary, cache_dir=tmp_path)
    compiled = again.compile(grammar)
    assert again.stats.disk_hits == 1 and again.stats.compiled == 0
    assert walk(compiled.matcher(), vocabulary, 1)[1]

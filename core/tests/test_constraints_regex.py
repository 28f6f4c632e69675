"""The regex constraint kind: compiled by the same compiler as a JSON schema (memory and
disk caches, the timeout, the index bound, the cheap limits), with its markers written as
the tokenizer's added token where there is one and as their text where there is not."""

from __future__ import annotations

import numpy as np
import pytest
from mlxcel.engine.constraints import CacheBudget, ConstraintCompiler, TokenVocabulary, mask_words
from mlxcel.engine.constraints.limits import MAX_PATTERN_BYTES, MAX_REPEAT
from mlxcel.errors import ConstraintTooComplex, UnsupportedSchema
from mlxcel.types.constraints import (
    MARKS,
    MAX_MARKERS,
    JsonSchemaConstraint,
    RegexConstraint,
    WrappedJsonConstraint,
    literal,
    mark,
)

SECRET = "zq_private_rule_5521"  # must never show in an error message
# <tool_call> is an added token of the test tokenizer, [CALL] is not
CALL = RegexConstraint(pattern=f"{mark(0)}(?:get|set)_[a-z]{{1,6}}:[0-9]{{1,3}}{mark(1)}",
                       markers=("<tool_call>", "</tool_call>"))


def allowed(matcher, size: int) -> set[int]:
    row = np.zeros(mask_words(size), np.int32)
    matcher.write_mask_into(row)
    return set(np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")).tolist())


def accepts(compiled, ids: list[int]) -> bool:
    matcher = compiled.matcher()
    return all(matcher.advance(t) for t in ids) and matcher.accepting


def test_a_marker_with_an_added_token_is_that_token_alone(tmp_path, tokenizer, vocabulary):
    compiled = ConstraintCompiler(vocabulary, cache_dir=tmp_path).compile(CALL)
    open_id, close_id = (tokenizer.hf.token_to_id(t) for t in CALL.markers)
    matcher = compiled.matcher()
    assert allowed(matcher, vocabulary.size) == {open_id}, "never '<' and the rest in pieces"
    text = "<tool_call>get_ab:12</tool_call>"
    ids = tokenizer.encode(text)
    assert ids[0] == open_id and ids[-1] == close_id and accepts(compiled, ids)
    assert not accepts(compiled, tokenizer.encode("<tool_call>put_ab:12</tool_call>"))
    spelled = [t for ch in "<tool_call>" for t in tokenizer.encode(ch)]
    assert not accepts(compiled, spelled + ids[1:])


def test_a_marker_without_a_token_is_its_text(tmp_path, tokenizer, vocabulary):
    assert "[CALL]" not in vocabulary.added
    constraint = RegexConstraint(pattern=f"{mark(0)}[a-z]{{1,4}}", markers=("[CALL]",))
    compiled = ConstraintCompiler(vocabulary, cache_dir=tmp_path).compile(constraint)
    assert accepts(compiled, tokenizer.encode("[CALL]abc"))
    assert not accepts(compiled, tokenizer.encode("abc"))


def test_free_text_without_the_marks_never_holds_a_marker_token(tmp_path, tokenizer,
                                                                 vocabulary):
    """The rule a pattern's author follows: a class that excludes ``MARKS`` keeps the
    marker tokens out of free text; one that does not would let them in."""
    close_id = tokenizer.hf.token_to_id("</tool_call>")
    compiler = ConstraintCompiler(vocabulary, cache_dir=tmp_path)
    markers = ("<tool_call>", "</tool_call>")
    kept = compiler.compile(RegexConstraint(pattern=f"[^{MARKS}]*{mark(1)}", markers=markers))
    loose = compiler.compile(RegexConstraint(pattern=f"[^x]*{mark(1)}", markers=markers))
    text = tokenizer.encode("abc")
    after_kept, after_loose = kept.matcher(), loose.matcher()
    assert all(after_kept.advance(t) and after_loose.advance(t) for t in text)
    assert close_id in allowed(after_kept, vocabulary.size)
    assert after_kept.advance(close_id) and after_kept.accepting
    assert close_id not in allowed(after_kept, vocabulary.size)  # nothing after the end
    assert accepts(loose, [*text, close_id, close_id]), "the loose class took a marker in"
    assert not accepts(kept, [*text, close_id, close_id])


def test_model_tokens_holding_a_mark_byte_are_never_allowed(tmp_path, vocabulary):
    tokens = {**vocabulary.tokens, 400: b"\x01", 401: b"a\x03b"}
    shaped = TokenVocabulary(tokens=tokens, eos_ids=vocabulary.eos_ids, size=vocabulary.size,
                             fingerprint=vocabulary.fingerprint + "-marks")
    compiled = ConstraintCompiler(shaped, cache_dir=tmp_path).compile(
        RegexConstraint(pattern="[\\x00-\\x7F]{1,3}"))
    assert not {400, 401} & allowed(compiled.matcher(), shaped.size)


def test_eos_only_where_the_pattern_is_complete(tmp_path, tokenizer, vocabulary):
    compiled = ConstraintCompiler(vocabulary, cache_dir=tmp_path).compile(CALL)
    matcher = compiled.matcher()
    ids = tokenizer.encode("<tool_call>set_x:7</tool_call>")
    for t in ids:
        assert not (vocabulary.eos_ids & allowed(matcher, vocabulary.size))
        assert matcher.advance(t)
    assert vocabulary.eos_ids <= allowed(matcher, vocabulary.size)
    assert matcher.advance(min(vocabulary.eos_ids)) and matcher.finished


def test_a_wrapped_schema_writes_its_markers_as_their_tokens(tmp_path, tokenizer, vocabulary):
    wrapped = WrappedJsonConstraint.around("<tool_call>\n", {"enum": [1, 2]}, "\n</tool_call>",
                                           markers=("<tool_call>", "</tool_call>"))
    plain = WrappedJsonConstraint.around("<tool_call>\n", {"enum": [1, 2]}, "\n</tool_call>")
    compiler = ConstraintCompiler(vocabulary, cache_dir=tmp_path)
    open_id = tokenizer.hf.token_to_id("<tool_call>")
    assert allowed(compiler.compile(wrapped).matcher(), vocabulary.size) == {open_id}
    assert open_id not in allowed(compiler.compile(plain).matcher(), vocabulary.size)
    assert wrapped.cache_text != plain.cache_text


def test_markers_and_kinds_are_part_of_the_key(tmp_path, vocabulary):
    compiler = ConstraintCompiler(vocabulary, cache_dir=tmp_path)
    compiler.compile(CALL)
    compiler.compile(RegexConstraint(pattern=CALL.pattern, markers=("<think>", "</think>")))
    compiler.compile(RegexConstraint(pattern="[0-9]"))
    compiler.compile(JsonSchemaConstraint.from_schema({"enum": [1, 2, 3, 4, 5, 6, 7, 8, 9]}))
    assert compiler.stats.compiled == 4 and len(list(tmp_path.rglob("*.idx"))) == 4


def test_the_timeout_and_the_index_bound_apply(tmp_path, vocabulary):
    slow = RegexConstraint(pattern=f"[a-z {SECRET[:2]}]{{0,{MAX_REPEAT}}}x")
    with pytest.raises(ConstraintTooComplex, match="tool-call grammar did not compile within"):
        ConstraintCompiler(vocabulary, cache_dir=tmp_path / "t", timeout=0.05).compile(slow)
    small = ConstraintCompiler(vocabulary, cache_dir=tmp_path / "b",
                               budget=CacheBudget(index_bytes=1 << 20))
    with pytest.raises(ConstraintTooComplex, match="compiles to more than 1 MiB"):
        small.compile(slow)
    assert not list((tmp_path / "b").rglob("*.idx"))


REFUSED = [  # (name, constraint, error class, what the message says)
    ("too large", RegexConstraint(pattern="a" * (MAX_PATTERN_BYTES + 1)),
     ConstraintTooComplex, "larger than 1 MiB"),
    ("a huge count", RegexConstraint(pattern=f"(?:{SECRET}){{{MAX_REPEAT + 1}}}"),
     ConstraintTooComplex, f"more than {MAX_REPEAT} times"),
    ("empty", RegexConstraint(pattern=""), UnsupportedSchema, "empty"),
    ("too many markers", RegexConstraint(pattern=SECRET, markers=tuple(
        f"<m{i}>" for i in range(MAX_MARKERS + 1))), UnsupportedSchema, "at most 8"),
    ("an empty marker", RegexConstraint(pattern=SECRET, markers=("",)), UnsupportedSchema,
     "non-empty"),
    ("not a regex", RegexConstraint(pattern=f"({SECRET}"), UnsupportedSchema,
     "not a valid regular expression"),
    ("unreachable", RegexConstraint(pattern=f"{SECRET}\\x02"), UnsupportedSchema,
     "no output this model's tokenizer can write"),
]


@pytest.mark.parametrize("name,constraint,error,says", REFUSED, ids=[r[0] for r in REFUSED])
def test_each_refusal_is_a_400_that_does_not_echo_the_pattern(tmp_path, vocabulary, name,
                                                             constraint, error, says):
    with pytest.raises(error) as caught:
        ConstraintCompiler(vocabulary, cache_dir=tmp_path).compile(constraint)
    assert caught.value.status == 400 and says in caught.value.message
    assert SECRET not in caught.value.message


def test_a_count_at_the_bound_and_escaped_braces_pass_the_checks(vocabulary):
    compiler = ConstraintCompiler(vocabulary)
    compiler.check(RegexConstraint(pattern=f"a{{{MAX_REPEAT}}}"))
    compiler.check(RegexConstraint(pattern="\\{99999\\}[{]99999[}]"))


def test_literal_escapes_what_the_regex_syntax_reads_and_marks_stay_apart():
    assert literal("[TOOL_CALLS]") == r"\[TOOL_CALLS\]"
    assert literal("<tool_call>\n") == r"<tool_call>\n"  # < and > stay literal in Rust
    assert literal("a\x01b\tc") == r"a\x01b\x09c" and mark(0) not in literal(mark(0))
    with pytest.raises(ValueError):
        mark(MAX_MARKERS)

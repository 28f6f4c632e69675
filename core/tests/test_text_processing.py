"""Incremental detokenization and stop-string matching on the tiny tokenizer."""

from __future__ import annotations

import random

import pytest
from mlxcel.model.detokenizer import IncrementalDetokenizer
from mlxcel.model.tokenizer import Tokenizer
from mlxcel.text import StopMatcher

MULTIBYTE = "naïve café 日本語のテキスト 한국어 😀🎉 ok ∑∫ end"


@pytest.fixture(scope="module")
def tok(tiny_checkpoint):
    return Tokenizer.from_dir(tiny_checkpoint)


def test_tokenizer_splits_multibyte_characters_across_tokens(tok):
    ids = tok.encode(MULTIBYTE)
    # the premise of the next test: some single tokens decode to partial UTF-8
    assert any("\ufffd" in tok.decode([i]) for i in ids)


def test_incremental_detokenizer_never_splits_utf8(tok):
    ids = tok.encode(MULTIBYTE)
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.add(i)[0] for i in ids] + [detok.flush()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == MULTIBYTE == tok.decode(ids)


def test_incremental_detokenizer_keeps_special_tokens_and_says_where(tok):
    end = tok.hf.token_to_id("<|im_end|>")
    detok = IncrementalDetokenizer(tok)
    out = [detok.add(i) for i in [*tok.encode("hello"), end, *tok.encode(" world")]]
    text = "".join(t for t, _ in out) + detok.flush()
    assert text == "hello<|im_end|> world"
    spans = [(t, span) for t, span in out if span is not None]
    assert len(spans) == 1
    piece, (start, end_) = spans[0]
    assert piece[start:end_] == "<|im_end|>" and end_ == len(piece)


def test_a_special_token_releases_an_incomplete_character_before_it(tok):
    ids = tok.encode(MULTIBYTE)
    partial = next(i for i in range(1, len(ids)) if "\ufffd" in tok.decode(ids[:i]))
    end = tok.hf.token_to_id("<|im_end|>")
    detok = IncrementalDetokenizer(tok)
    out = [detok.add(i) for i in [*ids[:partial], end]]
    assert out[-1][1] is not None
    assert out[-1][0].endswith("<|im_end|>")
    assert "".join(t for t, _ in out) == tok.decode([*ids[:partial], end], skip_special=False)


def test_non_special_added_tokens_are_plain_text(tok):
    think = tok.hf.token_to_id("<think>")
    detok = IncrementalDetokenizer(tok)
    assert detok.add(think) == ("<think>", None)


@pytest.mark.parametrize("seed", range(5))
def test_stop_matcher_across_any_chunking(seed):
    text = "The answer is 42. STOP here and never after"
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), 8))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    matcher, out, hit = StopMatcher(("STOP", "never")), [], False
    for chunk in chunks:
        emitted, hit = matcher.feed(chunk)
        out.append(emitted)
        if hit:
            break
    assert hit
    assert "".join(out) == "The answer is 42. "


def test_stop_matcher_holds_back_a_possible_prefix_then_releases_it():
    matcher = StopMatcher(("</end>",))
    assert matcher.feed("abc</e") == ("abc", False)
    assert matcher.feed("x") == ("</ex", False)
    assert matcher.feed("</") == ("", False)
    assert matcher.flush() == "</"


def test_stop_matcher_without_stops_passes_through():
    assert StopMatcher(()).feed("anything") == ("anything", False)

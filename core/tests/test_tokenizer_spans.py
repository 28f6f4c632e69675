"""A prompt's token spans are read from its encoding on demand (``model.tokenizer.Spans``):
every one is the span ``tokenizers`` gives in its ``offsets``, including tokens across
multi-byte characters and the tokens a post-processor adds, and the message boundaries
found through them are those the full list gives."""

from __future__ import annotations

import pytest
from mlxcel.chat.cache_marks import token_positions
from mlxcel.model.tokenizer import Spans

TEXT = ("<|im_start|>system\nYou are terse. ünïcödé 日本語 🎉🎉<|im_end|>\n"
        "<|im_start|>user\nHi there — what's up?<|im_end|>\n<|im_start|>assistant\n")


def test_spans_are_the_encodings_offsets(tokenizer):
    ids, spans = tokenizer.encode_spans(TEXT)
    offsets = tokenizer.hf.encode(TEXT, add_special_tokens=False).offsets
    assert isinstance(spans, Spans) and len(spans) == len(ids) == len(offsets)
    assert list(spans) == offsets
    assert spans[-1] == offsets[-1] and spans[2:7] == offsets[2:7]
    with pytest.raises(IndexError):
        spans[len(offsets)]


def test_tokens_a_post_processor_adds_have_their_offsets(tokenizer):
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    hf = Tokenizer.from_str(tokenizer.hf.to_str())
    bos, eos = "<|im_start|>", "<|im_end|>"
    hf.post_processor = TemplateProcessing(
        single=f"{bos} $A {eos}", special_tokens=[(bos, hf.token_to_id(bos)),
                                                 (eos, hf.token_to_id(eos))])
    encoding = hf.encode("hello world", add_special_tokens=True)
    assert encoding.token_to_chars(0) is None  # what Spans falls back from
    assert list(Spans(encoding)) == encoding.offsets


def test_boundaries_through_spans_are_those_of_the_whole_list(tokenizer):
    _, spans = tokenizer.encode_spans(TEXT)
    offsets = list(spans)
    chars = [(i, "turn") for i in range(len(TEXT) + 1)]
    found = token_positions(spans, chars)
    assert found == token_positions(offsets, chars)
    assert len(found) > 10  # many offsets fall on token boundaries

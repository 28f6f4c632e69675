"""The constraint vocabulary's raw-byte keys, checked against the real tokenizers.

Byte-level BPE comes from the tiny checkpoint; SentencePiece-style vocabularies (Metaspace,
``▁`` replaced by a space, ``<0xNN>`` byte fallback) are trained here with ``tokenizers``
and saved as a ``tokenizer.json``, then loaded the way the server loads one.
"""

from __future__ import annotations

import json

import numpy as np
import outlines_core
import pytest
from mlxcel.engine.constraints import ConstraintCompiler, OutlinesBackend, TokenVocabulary
from mlxcel.engine.constraints.vocabulary import byte_level_bytes
from mlxcel.errors import InvalidRequest, UnsupportedTokenizer
from mlxcel.model.tokenizer import Tokenizer
from mlxcel.types.constraints import JsonSchemaConstraint

TEXTS = ["hello world", "  two  spaces", "tab\tand\nnewline", "café naïve", "日本語 🙂",
         '{"key": [1, 2.5, true, null]}', "Ωmega -> ∞"]
CORPUS = ["the quick brown fox jumps over the lazy dog", "hello world, hello there",
          "a schema is a description of the shape of data", "the end of the line"] * 4


def _lossy(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def test_every_byte_level_key_is_what_the_tokenizer_decodes(tokenizer):
    vocab = TokenVocabulary.from_tokenizer(tokenizer)
    assert len(vocab.tokens) > 400
    for token, raw in vocab.tokens.items():
        assert tokenizer.decode([token], skip_special=False) == _lossy(raw), token
    single = {raw for raw in vocab.tokens.values() if len(raw) == 1}
    assert single == {bytes([b]) for b in range(256)}, "every byte has its token"


def test_byte_level_keys_concatenate_to_the_encoded_text(tokenizer):
    vocab = TokenVocabulary.from_tokenizer(tokenizer)
    for text in TEXTS:
        ids = tokenizer.encode(text)
        assert b"".join(vocab.tokens[i] for i in ids) == text.encode(), text


def test_added_tokens_and_eos_are_not_keys(tokenizer):
    vocab = TokenVocabulary.from_tokenizer(tokenizer, eos_ids={3})
    added = set(tokenizer.hf.get_added_tokens_decoder())
    assert added and not added & set(vocab.tokens)
    assert 3 not in vocab.tokens and vocab.eos_ids == {3}
    assert set(vocab.tokens) | added | {3} == set(range(vocab.size))


def test_a_space_prefixed_token_is_reachable_and_symbol_string_keys_would_lose_it(tokenizer):
    """The failure the issue names: keys like "Ġthe" are not the bytes " the"."""
    vocab = TokenVocabulary.from_tokenizer(tokenizer)
    word, token = next((raw, t) for t, raw in sorted(vocab.tokens.items())
                       if raw[:1] == b" " and raw[1:].isalpha() and len(raw) > 3)
    value = "x" + word.decode()
    constraint = JsonSchemaConstraint.from_schema({"type": "string", "enum": [value]})
    prefix = [t for t, raw in vocab.tokens.items() if raw in (b'"', b"x")]
    matcher = OutlinesBackend().compile(constraint, vocab).matcher()
    for raw in (b'"', b"x"):
        assert matcher.advance(next(t for t in prefix if vocab.tokens[t] == raw))
    row = np.zeros((vocab.size + 31) // 32, np.int32)
    matcher.write_mask_into(row)
    assert row.view(np.uint32)[token // 32] >> (token % 32) & 1, "the space token is allowed"
    assert matcher.advance(token)
    symbols = {s: [i] for s, i in tokenizer.hf.get_vocab(with_added_tokens=False).items()
               if i not in tokenizer.eos_ids}
    naive = outlines_core.Vocabulary(min(tokenizer.eos_ids), symbols)
    regex = outlines_core.json_schema.build_regex_from_schema(constraint.schema)
    with pytest.raises(ValueError, match="incompatible"):  # no key holds the byte " "
        outlines_core.Index(regex, naive)


def _sentencepiece_dir(tmp_path, byte_fallback: bool):
    """A BPE with Metaspace pre-tokenization saved as tokenizer.json: with ``<0xNN>``
    byte fallback and Llama 2's decoder, or without, with the ``Metaspace`` decoder."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, pre_tokenizers, trainers

    trained = HF(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=160, show_progress=False)
    trained.train_from_iterator(CORPUS + TEXTS, trainer)
    spec = json.loads(trained.to_str())["model"]
    vocab = {f"<0x{b:02X}>": b for b in range(256)} if byte_fallback else {}
    vocab.update({piece: len(vocab) + i for i, piece in enumerate(spec["vocab"])})
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["merges"]]
    hf = HF(models.BPE(vocab=vocab, merges=merges, byte_fallback=byte_fallback))
    hf.pre_tokenizer = pre_tokenizers.Metaspace()
    hf.decoder = decoders.Sequence([
        decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(" ", 1, 0)]) if byte_fallback else decoders.Metaspace()
    hf.add_special_tokens(["</s>"])
    hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return tmp_path


@pytest.mark.parametrize("byte_fallback", [True, False], ids=["byte_fallback", "metaspace"])
def test_sentencepiece_keys_are_what_the_tokenizer_decodes(tmp_path, byte_fallback):
    tok = Tokenizer.from_dir(_sentencepiece_dir(tmp_path, byte_fallback))
    vocab = TokenVocabulary.from_tokenizer(tok)
    space = next(t for t, raw in vocab.tokens.items() if raw.startswith(b" ") and len(raw) > 2)
    anchor = tok.hf.token_to_id("a")
    assert vocab.tokens[anchor] == b"a" and vocab.tokens[space][1:].isalpha()
    for token, raw in vocab.tokens.items():
        assert tok.decode([anchor, token], skip_special=False) == "a" + _lossy(raw), token
    for text in TEXTS + (["Zürich costs €5"] if byte_fallback else []):
        ids = tok.encode(text)
        expected = text if text.startswith(" ") else " " + text  # Metaspace's prefix
        assert b"".join(vocab.tokens[i] for i in ids) == expected.encode(), text
    assert tok.hf.token_to_id("</s>") not in vocab.tokens
    if byte_fallback:
        assert vocab.tokens[tok.hf.token_to_id("<0xE2>")] == b"\xe2"


def test_a_sentencepiece_vocabulary_compiles_and_reaches_unicode(tmp_path):
    tok = Tokenizer.from_dir(_sentencepiece_dir(tmp_path, byte_fallback=True))
    compiler = ConstraintCompiler.for_tokenizer(tok, cache_dir=tmp_path / "cache")
    compiled = compiler.compile(JsonSchemaConstraint.from_schema({"enum": ["é ∞"]}))
    vocab = compiler.vocabulary()
    matcher, out = compiled.matcher(), []
    for byte in '"é ∞"'.encode():
        token = next(t for t, raw in vocab.tokens.items() if raw == bytes([byte]))
        assert matcher.advance(token)
        out.append(token)
    assert matcher.accepting and tok.decode(out) == '"é ∞"'


def test_a_tokenizer_that_is_not_a_tokenizer_json_is_unsupported(tmp_path):
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models

    wordpiece = HF(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    wordpiece.decoder = decoders.WordPiece()
    wordpiece.save(str(tmp_path / "tokenizer.json"))
    for tok in (Tokenizer.from_dir(tmp_path), object()):
        with pytest.raises(UnsupportedTokenizer, match="^UnsupportedTokenizer") as caught:
            TokenVocabulary.from_tokenizer(tok)
        assert isinstance(caught.value, InvalidRequest) and caught.value.status == 400


def test_the_compiler_answers_unsupported_tokenizer_for_every_request(tmp_path):
    compiler = ConstraintCompiler.for_tokenizer(object(), cache_dir=tmp_path)
    for _ in range(2):
        with pytest.raises(UnsupportedTokenizer, match="UnsupportedTokenizer"):
            compiler.compile(JsonSchemaConstraint.from_schema({"type": "integer"}))


def test_a_symbol_outside_the_byte_alphabet_stands_for_its_own_text():
    assert byte_level_bytes("\u0120S") == b" S"
    assert byte_level_bytes("x\u20ac") == "x\u20ac".encode()

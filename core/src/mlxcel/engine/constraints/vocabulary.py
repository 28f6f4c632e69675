"""Each token's raw bytes, read offline from the tokenizer's own ``tokenizer.json``.

A constraint backend matches bytes, so a token's key must be the bytes it adds to the
output, not its stored symbol string: in a byte-level BPE the stored ``"ĠS"`` stands for
``b" S"``, and a symbol-string key would make every space-prefixed token unreachable. The
mapping follows the tokenizer's decoder, which is what turns the model's tokens into the
text a client reads:

- ``ByteLevel`` (GPT-2 and its heirs): each symbol maps back to one byte; a token with a
  symbol outside that alphabet stands for its own UTF-8 text, as the decoder does.
- SentencePiece-style (``Metaspace``, or ``Replace("▁", " ")`` with ``ByteFallback``,
  ``Fuse`` and ``Strip``): ``▁`` is a space and ``<0xNN>`` is the byte ``NN``. The bytes
  are what the token adds in the middle of a text; ``Strip`` only trims a text's start.

Added tokens (special or not: ``<|im_end|>``, ``<think>``, ``<tool_call>``), the EOS ids
and the unknown token are not keys: a constrained output holds no control marker but the
ones its constraint names (``markers``, ``mlxcel.types.constraints``), which the backend
looks up in ``added``, and the EOS ids are the backend's to allow in accepting states. Any other
tokenizer (WordPiece, a decoder this module does not know, or no ``tokenizer.json`` at
all) is ``UnsupportedTokenizer``, since its bytes could not be trusted.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mlxcel.errors import UnsupportedTokenizer

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_SENTENCEPIECE_STEPS = frozenset({"Replace", "ByteFallback", "Fuse", "Strip", "Metaspace"})
_MODELS = frozenset({"BPE", "Unigram"})
FINGERPRINT_VERSION = "2"  # bump when the mapping rules change: old cache entries expire


@dataclass(frozen=True, eq=False)
class TokenVocabulary:
    """The tokens a constraint may emit, as raw bytes, and the ids that end the output.

    ``size`` is one past the tokenizer's highest id; a logits row may be wider (padded
    embeddings), and ids at or past ``size`` are never allowed. ``fingerprint`` names
    this exact mapping, so a compiled index is reused only with the tokenizer it was
    built for. ``added``: each added token's text and id (the lowest, if two share a
    text), but the EOS and unknown tokens': a constraint's markers are written as these.
    """

    tokens: Mapping[int, bytes]
    eos_ids: frozenset[int]
    size: int
    fingerprint: str
    added: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, eos_ids: set[int] | None = None) -> TokenVocabulary:
        """From an ``mlxcel.model.tokenizer.Tokenizer``; ``eos_ids`` defaults to its own
        (the engine passes the model's: ``generation_config.json`` may add more)."""
        hf = getattr(tokenizer, "hf", None)
        if hf is None or not hasattr(hf, "to_str"):
            raise UnsupportedTokenizer(
                "UnsupportedTokenizer: constrained decoding needs a Hugging Face "
                "tokenizer.json")
        ends = frozenset(tokenizer.eos_ids if eos_ids is None else eos_ids)
        spec = json.loads(hf.to_str())
        tokens, size = raw_token_bytes(spec, excluded=ends)
        added = added_tokens(spec, excluded=ends)
        return cls(tokens=tokens, eos_ids=ends, size=size, added=added,
                   fingerprint=_fingerprint(tokens, ends, size, added))


def raw_token_bytes(spec: dict, excluded: frozenset[int] = frozenset()) -> tuple[dict[int, bytes], int]:
    """Id -> raw bytes for the model vocabulary of a parsed ``tokenizer.json``, without
    the added tokens, the unknown token and ``excluded``; and one past the highest id."""
    model = spec.get("model") or {}
    if model.get("type") not in _MODELS:
        raise _unsupported(f"a {model.get('type') or 'missing'} model")
    to_bytes = _decoder(spec.get("decoder"))
    vocab = _model_vocab(model)
    added = {int(t["id"]) for t in spec.get("added_tokens") or ()}
    skip = added | set(excluded) | _unknown_ids(model, vocab)
    size = max([*vocab.values(), *added, *excluded], default=-1) + 1
    return {i: to_bytes(text) for text, i in vocab.items() if i not in skip}, size


def added_tokens(spec: dict, excluded: frozenset[int] = frozenset()) -> dict[str, int]:
    """Text -> id of a parsed ``tokenizer.json``'s added tokens, without the unknown
    token and ``excluded``."""
    model = spec.get("model") or {}
    skip = set(excluded) | _unknown_ids(model, _model_vocab(model))
    out: dict[str, int] = {}
    for token in sorted(spec.get("added_tokens") or (), key=lambda t: int(t["id"])):
        if int(token["id"]) not in skip and token.get("content"):
            out.setdefault(token["content"], int(token["id"]))
    return out


def _model_vocab(model: dict) -> dict[str, int]:
    vocab = model.get("vocab")
    if model["type"] == "Unigram":  # a list of [piece, score], id = position
        return {piece: i for i, (piece, _score) in enumerate(vocab or ())}
    return dict(vocab or {})


def _unknown_ids(model: dict, vocab: dict[str, int]) -> set[int]:
    if model.get("unk_id") is not None:
        return {int(model["unk_id"])}
    unk = model.get("unk_token")
    return {vocab[unk]} if unk in vocab else set()


def _steps(decoder: dict | None) -> list[dict]:
    if decoder is None:
        return []
    if decoder.get("type") == "Sequence":
        return [s for d in decoder.get("decoders") or () for s in _steps(d)]
    return [decoder]


def _decoder(decoder: dict | None) -> Any:
    """The function token text -> raw bytes that the tokenizer's decoder implies."""
    steps = _steps(decoder)
    kinds = {s.get("type") for s in steps}
    if "ByteLevel" in kinds:
        return byte_level_bytes
    if not steps or not kinds <= _SENTENCEPIECE_STEPS:
        raise _unsupported("a decoder that is neither byte-level nor SentencePiece-style")
    replace: list[tuple[str, str]] = []
    for step in steps:
        if step["type"] == "Metaspace":
            replace.append((step.get("replacement", "\u2581"), " "))
        elif step["type"] == "Replace":
            pattern = step.get("pattern") or {}
            if "String" not in pattern:
                raise _unsupported("a decoder that replaces a regular expression")
            replace.append((pattern["String"], step.get("content", "")))
    return _sentencepiece(replace, byte_fallback="ByteFallback" in kinds)


def _sentencepiece(replace: list[tuple[str, str]], byte_fallback: bool) -> Any:
    def to_bytes(text: str) -> bytes:
        match = _BYTE_TOKEN.match(text) if byte_fallback else None
        if match:
            return bytes([int(match.group(1), 16)])
        for old, new in replace:
            text = text.replace(old, new)
        return text.encode("utf-8")

    return to_bytes


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte -> printable symbol table, inverted: symbol -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    symbols = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in symbols:
            symbols[b] = chr(256 + shifted)
            shifted += 1
    return {s: b for b, s in symbols.items()}


_BYTE_OF = _byte_alphabet()


def byte_level_bytes(text: str) -> bytes:
    """A byte-level token's bytes; one symbol outside the alphabet makes the whole token
    stand for its UTF-8 text, as the ``ByteLevel`` decoder does."""
    try:
        return bytes(_BYTE_OF[ch] for ch in text)
    except KeyError:
        return text.encode("utf-8")


def _fingerprint(tokens: Mapping[int, bytes], eos_ids: frozenset[int], size: int,
                 added: Mapping[str, int]) -> str:
    digest = hashlib.sha256(f"v{FINGERPRINT_VERSION}:{size}:{sorted(eos_ids)}:".encode()
                            + json.dumps(sorted(added.items())).encode())
    for i in sorted(tokens):
        raw = tokens[i]
        digest.update(i.to_bytes(4, "little") + len(raw).to_bytes(4, "little") + raw)
    return digest.hexdigest()


def _unsupported(what: str) -> UnsupportedTokenizer:
    return UnsupportedTokenizer(
        f"UnsupportedTokenizer: constrained decoding needs a byte-level BPE or "
        f"SentencePiece-style tokenizer.json; this model's tokenizer has {what}")

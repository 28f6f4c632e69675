"""``/tokenize`` with ``with_pieces``: each token as ``{"id", "piece"}``, as llama-server
answers it.

A piece is the text the token stands for on its own, leading space included (llama.cpp's
``common_token_to_piece``): a string when its bytes are valid UTF-8, else the array of its
byte values (a byte-fallback token, or one half of a character that several tokens
spell). The bytes come from the tokenizer's own vocabulary
(``engine.constraints.vocabulary.raw_token_bytes``, read once per tokenizer); an added
token (``<|im_end|>``, ...) is its text. A tokenizer whose bytes cannot be read that way
gives each token's decoded text, which is the same wherever the token is whole
characters.
"""

from __future__ import annotations

import json
import threading
import weakref
from typing import Any

from mlxcel.engine.constraints.vocabulary import raw_token_bytes
from mlxcel.errors import UnsupportedTokenizer

_cache: weakref.WeakKeyDictionary[Any, dict[int, bytes] | None] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _vocabulary(tokenizer: Any) -> dict[int, bytes] | None:
    """Id -> bytes of the model vocabulary, or None when the tokenizer's bytes cannot be
    read (``UnsupportedTokenizer``)."""
    with _lock:
        if tokenizer in _cache:
            return _cache[tokenizer]
    try:
        table: dict[int, bytes] | None = raw_token_bytes(json.loads(tokenizer.hf.to_str()))[0]
    except (UnsupportedTokenizer, AttributeError, KeyError, TypeError, ValueError):
        table = None
    with _lock:
        _cache[tokenizer] = table
    return table


def piece(raw: bytes) -> str | list[int]:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def with_pieces(tokenizer: Any, ids: list[int]) -> list[dict[str, Any]]:
    """``[{"id": id, "piece": ...}]`` for ``ids`` (blocking: run it through ``prepare``)."""
    table = _vocabulary(tokenizer) or {}
    out = []
    for i in ids:
        raw = table.get(i)
        if raw is None:  # an added token, or no byte table: the token's own text
            raw = tokenizer.decode([i], skip_special=False).encode("utf-8")
        out.append({"id": i, "piece": piece(raw)})
    return out

"""Tokenizer on top of the `tokenizers` library, with the checkpoint's special tokens."""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from mlxcel.errors import StartupError

# Texts at least this long are encoded through ``encode_batch``, which releases the GIL.
GIL_FREE_CHARS = 4096
# Normalizers that can delete input text: with one, no byte bound on the token count holds.
_DELETING_NORMALIZERS = frozenset({"BertNormalizer", "Strip", "StripAccents", "Precompiled"})


class TooManyTokens(Exception):
    """A text encodes to more tokens than the caller's limit (``count`` says how many)."""

    def __init__(self, count: int, limit: int) -> None:
        super().__init__(f"{count} tokens, more than {limit}")
        self.count, self.limit = count, limit


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _may_delete(node: Any) -> bool:
    """Whether a ``tokenizer.json`` normalizer (or one in its sequence) can remove text."""
    if not isinstance(node, dict):
        return False
    kind = node.get("type")
    if kind in _DELETING_NORMALIZERS or (kind == "Replace" and not node.get("content")):
        return True
    return any(_may_delete(child) for child in node.get("normalizers") or ())


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except (OSError, ValueError) as exc:
        raise StartupError(f"cannot read {path}: {exc}") from exc


class Spans(Sequence):
    """Each token's ``(start, end)`` character span of one encoding (its ``offsets``), read
    from it when asked: a prompt's message boundaries need a few dozen of a long prompt's
    spans, and the whole list as Python tuples would be made on every request. A token
    the post-processor added (BOS) has no span of its own to read: for those the list is
    made once."""

    def __init__(self, encoding: Any) -> None:
        self._encoding = encoding
        self._n = len(encoding)
        self._all: list[tuple[int, int]] | None = None

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("token index out of range")
        span = self._encoding.token_to_chars(i)
        if span is None:
            if self._all is None:
                self._all = self._encoding.offsets
            span = self._all[i]
        return span


class Tokenizer:
    """Encode/decode plus the special tokens a server needs (BOS, EOS ids, template)."""

    def __init__(self, hf: HFTokenizer, config: dict, eos_ids: set[int]) -> None:
        self.hf = hf
        self.config = config
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.eos_ids = set(eos_ids)
        if self.eos_token is not None:
            eos = hf.token_to_id(self.eos_token)
            if eos is not None:
                self.eos_ids.add(eos)
        self.vocab_size = hf.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_dir(cls, path: Path, eos_ids: set[int] | None = None) -> Tokenizer:
        file = path / "tokenizer.json"
        if not file.exists():
            raise StartupError(f"{path} has no tokenizer.json (a fast tokenizer is required)")
        hf = HFTokenizer.from_file(str(file))
        return cls(hf, _read_json(path / "tokenizer_config.json"), eos_ids or set())

    def encode(self, text: str, add_special: bool = False,
               max_tokens: int | None = None) -> list[int]:
        """Long texts go through ``encode_batch`` so that other threads (the event loop)
        keep running while the Rust side works. Past ``max_tokens`` it raises
        ``TooManyTokens`` before building the Python list, whose creation and release hold
        the GIL for as long as the list is long."""
        return self._encoding(text, add_special, max_tokens).ids

    def encode_spans(self, text: str, add_special: bool = False,
                     max_tokens: int | None = None) -> tuple[list[int], Spans]:
        """``encode``, with each token's ``(start, end)`` character span in ``text``
        (``Spans``: read on demand)."""
        encoding = self._encoding(text, add_special, max_tokens)
        return encoding.ids, Spans(encoding)

    def _encoding(self, text: str, add_special: bool, max_tokens: int | None) -> Any:
        if len(text) >= GIL_FREE_CHARS:
            encoding = self.hf.encode_batch([text], add_special_tokens=add_special)[0]
        else:
            encoding = self.hf.encode(text, add_special_tokens=add_special)
        if max_tokens is not None and len(encoding) > max_tokens:
            raise TooManyTokens(len(encoding), max_tokens)
        return encoding

    @cached_property
    def max_token_bytes(self) -> int | None:
        """An upper bound on the input bytes one token can stand for, or None when the
        normalizer may delete text (then no such bound exists).

        A text of N UTF-8 bytes encodes to at least ``N / max_token_bytes`` tokens, so a text
        too long for the context can be refused without tokenizing it. Each vocabulary entry
        counts as the longer of its stored form (byte-level or metaspace characters are at
        least as long as the bytes they encode) and its decoded text.
        """
        if _may_delete(json.loads(self.hf.to_str()).get("normalizer")):
            return None
        vocab = self.hf.get_vocab(with_added_tokens=True)
        decoded = self.hf.decode_batch([[i] for i in vocab.values()], skip_special_tokens=False)
        longest = max((len(t.encode("utf-8")) for t in (*vocab, *decoded)), default=1)
        return max(1, longest)

    @cached_property
    def special_texts(self) -> dict[int, str]:
        """Id -> text of every special added token (those ``skip_special`` drops): the
        markers the detokenizer keeps and tags, so tool and reasoning parsers see them."""
        return {tid: tok.content for tid, tok in self.hf.get_added_tokens_decoder().items()
                if tok.special}

    @cached_property
    def special_markers(self) -> tuple[str, ...]:
        """The special tokens' texts, once each (what answer text must never show)."""
        return tuple(sorted(set(self.special_texts.values())))

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.hf.decode(ids, skip_special_tokens=skip_special)

    def first_invalid_id(self, ids: list[int]) -> int | None:
        """The first id outside ``[0, vocab_size)``, in request order."""
        for i in ids:
            if i < 0 or i >= self.vocab_size:
                return i
        return None

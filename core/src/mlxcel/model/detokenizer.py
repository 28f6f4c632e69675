"""Incremental detokenization that never splits a UTF-8 character and keeps special tokens."""

from __future__ import annotations

from mlxcel.model.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Decode a growing token list, emitting only text that is complete.

    Keeps a small window (``prefix``..end) so each step decodes a few tokens, not the whole
    sequence. Text ending in U+FFFD means a multi-byte character is still incomplete: it is
    held back until the next token completes it (or flushed as is at the end).

    Special tokens are decoded too (their text ends the piece their token completes), and
    ``add`` reports where: the chat layer parses markers such as ``<|python_tag|>`` and
    drops them from what a user sees. The window runs across them, as with the special
    tokens skipped, so a decoder's rule for a sequence's first token (SentencePiece's
    leading space) does not apply again after each one.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._specials = tokenizer.special_texts
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special=False)

    def add(self, token_id: int) -> tuple[str, tuple[int, int] | None]:
        """The text this token completes, and the span of the special token's text in it
        (None for an ordinary token)."""
        self._ids.append(token_id)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        marker = self._specials.get(token_id)
        if marker is not None and after.endswith(marker) and len(after) >= len(before) + len(marker):
            self._prefix, self._read = self._read, len(self._ids)
            text = after[len(before) :]
            return text, (len(text) - len(marker), len(text))
        if len(after) > len(before) and not after.endswith(_REPLACEMENT):
            self._prefix, self._read = self._read, len(self._ids)
            return after[len(before) :], None
        return "", None

    def flush(self) -> str:
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return after[len(before) :] if len(after) > len(before) else ""

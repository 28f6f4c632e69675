"""Prompt lookup: the tokens that followed the context's last n-gram where it last
occurred before, copied as the draft (no model, any target).

Agents and editors repeat what is already in the prompt: a file being edited, a quoted
tool result, code being refactored. Where the output copies, the continuation of the most
recent earlier occurrence of its last few tokens is the likeliest next run. Longer
n-grams are tried first (``NGRAM_MAX`` down to ``NGRAM_MIN``): a longer match is a more
specific context. One-token matches are not used: almost every token has occurred before,
and such proposals are rarely right.

A match close to the end overlaps the context's own tail (a repeating run): its
continuation is then continued with itself, one period at a time, up to the draft length.

Each row keeps an index from n-gram to the position after its latest occurrence, grown
by the tokens appended since the last round, so a proposal costs a few dict lookups
whatever the context's length.
"""

from __future__ import annotations

from typing import Any

from mlxcel.drafters.api import DraftOptions, DraftRow

NGRAM_MAX = 4
NGRAM_MIN = 2


class RowIndex:
    """n-gram -> the position just after its latest occurrence whose next token exists."""

    def __init__(self) -> None:
        self.after: dict[tuple[int, ...], int] = {}
        self.upto = 0  # tokens[:upto] are indexed

    def grow(self, tokens: list[int]) -> None:
        if len(tokens) < self.upto:  # the context was replaced: start again
            self.after.clear()
            self.upto = 0
        for j in range(max(1, self.upto), len(tokens)):
            # tokens[j] now follows every n-gram that ends at j - 1
            for n in range(NGRAM_MIN, NGRAM_MAX + 1):
                if j - n < 0:
                    break
                self.after[tuple(tokens[j - n:j])] = j
        self.upto = len(tokens)

    def propose(self, tokens: list[int], limit: int) -> list[int]:
        for n in range(NGRAM_MAX, NGRAM_MIN - 1, -1):
            if len(tokens) <= n:
                continue
            at = self.after.get(tuple(tokens[-n:]))
            if at is not None:
                draft = tokens[at:at + limit]
                period = len(tokens) - at  # the match overlaps the end: a repeating run
                while len(draft) < limit:
                    draft.append(draft[len(draft) - period])
                return draft
        return []


class PromptLookup:
    """A ``DraftSession`` (``mlxcel.drafters.api``) over each row's own context."""

    def __init__(self, options: DraftOptions) -> None:
        self.options = options
        self.rows: dict[int, RowIndex] = {}

    def propose(self, rows: list[DraftRow], limits: list[int]) -> list[list[int]]:
        out = []
        for row, limit in zip(rows, limits, strict=True):
            index = self.rows.get(row.key)
            if index is None:
                index = self.rows[row.key] = RowIndex()
            index.grow(row.tokens)
            out.append(index.propose(row.tokens, limit) if limit > 0 else [])
        return out

    def commit(self, rows: list[DraftRow], accepted: list[int]) -> None:
        """Nothing to roll back: the index grows from the context itself."""

    def release(self, keys: list[int]) -> None:
        for key in keys:
            self.rows.pop(key, None)


def new_session(target: Any, options: DraftOptions) -> PromptLookup:
    return PromptLookup(options)

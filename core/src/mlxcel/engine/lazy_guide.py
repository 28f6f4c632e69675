"""A lazy constraint's trigger (``GenerationRequest.guide_lazy``, llama-server's
``grammar_lazy`` with ``grammar_triggers``), watched over one row's output.

The rules are llama-server's (``llama_grammar_accept_impl``): until the trigger, every
token is free and its text is kept. A trigger token starts the constraint at that token.
Otherwise, after each token, the patterns are tried on all the text so far (one anchored
``^...$`` must match all of it, the others anywhere); the first match starts the
constraint where it begins (its first non-empty group, else its start), and the tokens
from there are replayed through the constraint: whole where a token's text starts at or
after that place, and the tail of the one it cuts, re-encoded. A token whose text has not
come yet (an incomplete UTF-8 sequence) goes with the token that completes it.
"""

from __future__ import annotations

import re
from typing import Any

from mlxcel.types.requests import LazyStart


class LazyTrigger:
    """One row's watch for its constraint's trigger; ``see`` each generated token."""

    def __init__(self, start: LazyStart, tokenizer: Any) -> None:
        self.tokens = frozenset(start.tokens)
        self.patterns = [(re.compile(p), p.startswith("^") and p.endswith("$"))
                         for p in start.patterns]
        self.tokenizer = tokenizer
        self.text = ""
        self.units: list[tuple[list[int], int, int]] = []  # tokens, their text's span
        self._pending: list[int] = []

    def see(self, token: int, text: str) -> list[int] | None:
        """The tokens to feed the constraint from its start, once ``token`` (whose
        decoded text is ``text``) triggers it; None while it does not."""
        if token in self.tokens:
            return [token]
        self._pending.append(token)
        if not text:
            return None
        begin = len(self.text)
        self.text += text
        self.units.append((self._pending, begin, len(self.text)))
        self._pending = []
        at = self._match()
        return None if at is None else self._replay(at)

    def _match(self) -> int | None:
        """Where the first pattern that matches the text begins, or None."""
        for regex, whole in self.patterns:
            found = regex.fullmatch(self.text) if whole else regex.search(self.text)
            if found is None:
                continue
            for group in range(1, regex.groups + 1):
                if found.group(group):
                    return found.start(group)
            return found.start()
        return None

    def _replay(self, at: int) -> list[int]:
        out: list[int] = []
        for tokens, begin, end in self.units:
            if end <= at:
                continue
            out += tokens if begin >= at else self.tokenizer.encode(self.text[at:end])
        return out

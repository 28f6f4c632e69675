"""Drafters for the engine's speculation tests: proposals the test chooses, with no model.

A drafter factory is called once per engine and returns its session; a stub is both, so
the test keeps the object it passes in and can read what it proposed. ``KnownOutputs``
proposes each row's known output (the row found by its prompt), which a subclass may
spoil on purpose to get drafts kept whole, in part or not at all, as ``OneWrong`` does.
"""

from __future__ import annotations

from typing import Any


class StubDrafter:
    """The factory and its session at once; ``commit`` and ``release`` do nothing. A
    subclass gives ``propose``."""

    def __call__(self, target: Any, options: Any) -> StubDrafter:
        return self

    def propose(self, rows: Any, limits: Any) -> list[list[int]]:
        raise NotImplementedError

    def commit(self, rows: Any, accepted: Any) -> None:
        pass

    def release(self, keys: Any) -> None:
        pass


class KnownOutputs(StubDrafter):
    """Proposes each row's next tokens of ``outputs`` (prompt tuple -> the tokens that
    follow it), through ``draft``; ``proposed`` counts the tokens proposed."""

    def __init__(self, outputs: dict[tuple[int, ...], list[int]]) -> None:
        self.outputs = outputs
        self.proposed = 0

    def propose(self, rows: Any, limits: Any) -> list[list[int]]:
        out = []
        for row, limit in zip(rows, limits, strict=True):
            prompt = next(p for p in self.outputs if tuple(row.tokens[:len(p)]) == p)
            out.append(self.draft(prompt, len(row.tokens) - len(prompt), limit))
            self.proposed += len(out[-1])
        return out

    def draft(self, prompt: tuple[int, ...], done: int, limit: int) -> list[int]:
        """At most ``limit`` tokens for a row of ``prompt`` that has ``done`` tokens
        after it; the known ones unchanged."""
        return list(self.outputs[prompt][done:done + limit])


class OneWrong(KnownOutputs):
    """``KnownOutputs`` with one token of each draft changed, at a position that moves
    from round to round and row to row (sometimes past the draft's end): drafts are kept
    whole, in part or not at all, differently per row (ragged acceptance)."""

    def draft(self, prompt: tuple[int, ...], done: int, limit: int) -> list[int]:
        draft = super().draft(prompt, done, limit)
        wrong = (done * 5 + len(prompt)) % (limit + 2)  # past the end: none wrong
        if wrong < len(draft):
            draft[wrong] = (draft[wrong] + 1) % 512
        return draft

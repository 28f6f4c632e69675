"""``check_drafter``: what a drafter (``mlxcel.drafters.api``) must do to be served.

Its session keeps to the contract (drafts within their limits, token ids of the
vocabulary, rows' contexts left as they were, ``commit`` and ``release`` taken; a session
that reads hidden states gets them as the engine gives them), and the
engine's greedy outputs with it drafting equal those without it, for a batch whose rows
join at different times and draft different amounts.
"""

from __future__ import annotations

from typing import Any

from mlxcel.drafters.api import DraftOptions, DraftRow, TargetCache
from mlxcel.engine.config import EngineConfig
from mlxcel.testing.drafting import draft_target
from mlxcel.testing.engine import request, run_joining

PROMPTS = ([5, 6, 7, 8, 9, 10, 11, 12] * 4, [20, 21, 22, 23] * 3, list(range(30, 61)),
           [100, 200, 100, 200, 100, 200], [7, 7, 7, 7, 7, 7, 7, 7, 7])


def _outputs(checkpoint: Any, config: EngineConfig | None, max_tokens: int
             ) -> tuple[list[list[int]], list[Any]]:
    reqs = [request(prompt, max_tokens + 3 * i) for i, prompt in enumerate(PROMPTS)]
    tokens, usages, _ = run_joining(checkpoint, reqs, config)
    return tokens, usages


def _row(model: Any, session: Any, key: int, tokens: list[int]) -> DraftRow:
    """A row as the engine offers it: with the target's hidden state (the final norm's,
    or the joined outputs of the session's ``hidden_layers``) and caches for a session
    that reads them (``needs_hidden``), from a forward of all but its last token on
    caches of its own."""
    if not getattr(session, "needs_hidden", False):
        return DraftRow(key, tokens)
    import mlx.core as mx

    from mlxcel.drafters.hidden import tap_for
    from mlxcel.engine.spec_probe import make_caches

    states = tap_for(model, session)
    cache = make_caches(model)
    model(mx.array([tokens[:-1]], dtype=mx.uint32), cache)
    return DraftRow(key, tokens, states.take()[0, -1:], TargetCache(cache, 0))


def check_drafter(new_session: Any, checkpoint: Any, kind: str = "prompt-lookup",
                  max_tokens: int = 24) -> list[Any]:
    """Raise ``AssertionError`` naming what ``new_session`` (a drafter's factory) does
    wrong on ``checkpoint`` (a tiny text checkpoint's path); the speculative run's usages
    (their ``draft_*`` counters) when it passes."""
    target = draft_target(checkpoint)
    vocab = target.tokenizer.vocab_size
    session = new_session(target, DraftOptions(draft_max=4))
    rows = [_row(target.model, session, i, list(p)) for i, p in enumerate(PROMPTS)]
    before = [list(r.tokens) for r in rows]
    limits = [4, 1, 0, 3, 2]
    drafts = session.propose(rows, limits)
    assert len(drafts) == len(rows), "propose must return one draft per row"
    for draft, limit in zip(drafts, limits, strict=True):
        assert len(draft) <= limit, f"a draft of {len(draft)} tokens for a limit of {limit}"
        assert all(isinstance(t, int) and 0 <= t < vocab for t in draft), \
            f"draft {draft} holds ids outside the vocabulary"
    assert [r.tokens for r in rows] == before, "propose changed a row's tokens"
    session.commit(rows, [min(1, len(d)) for d in drafts])
    session.release([r.key for r in rows])
    plain, _ = _outputs(checkpoint, None, max_tokens)
    config = EngineConfig(drafter=new_session, drafter_kind=kind, prompt_lookup="on",
                          draft_max=4)
    fast, usages = _outputs(checkpoint, config, max_tokens)
    for i, (a, b) in enumerate(zip(plain, fast, strict=True)):
        assert a == b, f"prompt {i}: greedy output with the drafter differs:\n{a}\n{b}"
    return usages

"""The startup exactness probe of a (target, drafter) pairing.

Verification keeps a draft token only where it equals the target's own choice, so a
correct verify step gives the target's output whatever the drafter proposes. What can
still differ is the arithmetic: a verify forward reads 1 + k positions at once where a
decode step reads one, and another kernel or reduction order can flip a greedy choice
that is nearly tied; a drafter can also break its contract (ids outside the vocabulary,
changed contexts). The probe runs a short greedy generation of the target on a fixed
prompt twice -- one token per forward, then through the drafter's proposals and
multi-token verify forwards on the same kind of caches -- and compares the tokens. It
costs a handful of small forwards at startup.

Prompt lookup copies from the context and calls no model of its own, so the pairing needs
no probe; what decides its exactness is the arithmetic alone. ``verify_deviation`` measures
that directly: the same tokens through one-token steps and through verify-wide forwards,
and the largest difference between their logits. In float32 on the CPU it is reordering
noise; where a wider forward takes other kernels in bf16 (CUDA, and quantized or bf16
matmuls generally) it is whole roundings, which flip near-tied greedy choices. A session
that reads the target's hidden states and cache (``needs_hidden``) gets them from the
probe's own forwards, as the engine gives them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import mlx.core as mx

from mlxcel.drafters import hidden as hidden_states
from mlxcel.drafters.api import DraftOptions, DraftRow, TargetCache

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"
PROMPT_TOKENS = 12  # the most prompt tokens the probe feeds
NEW_TOKENS = 16  # greedy tokens generated each way
DRAFT_MAX = 4  # the widest verify forward the probe builds
KEY = -1  # the probe's row key in the drafter's session
# The largest verify-against-step logit difference, as a share of the logits' scale, that
# counts as exact: far above float32's reordering noise, below one bf16 rounding (2**-8).
TOLERANCE = 1e-4


class ProbeResult(NamedTuple):
    """``plain``: the target's tokens one forward each; ``speculative``: the same through
    the drafter (equal when ``exact``); ``drafted`` / ``accepted``: the drafter's tokens
    over the probe's verify rounds."""

    exact: bool
    plain: list[int]
    speculative: list[int]
    drafted: int
    accepted: int


def make_caches(model: Any) -> list[Any]:
    if hasattr(model, "make_cache"):
        return model.make_cache()
    from mlx_lm.models.cache import make_prompt_cache

    return make_prompt_cache(model)


def prompt_ids(tokenizer: Any) -> list[int]:
    """The probe's prompt in the target's ids (some ids of the vocabulary if the text
    encodes to fewer than two tokens)."""
    ids = list(tokenizer.encode(PROMPT))[:PROMPT_TOKENS]
    if len(ids) < 2:
        ids = [i % tokenizer.vocab_size for i in range(5, 5 + PROMPT_TOKENS)]
    return ids


def _greedy(logits: mx.array) -> list[int]:
    return mx.argmax(logits[0], axis=-1).tolist()


def plain_tokens(model: Any, prompt: list[int], n: int) -> list[int]:
    """``n`` greedy tokens after ``prompt``, one forward each."""
    cache = make_caches(model)
    out = [_greedy(model(mx.array([prompt], dtype=mx.uint32), cache)[:, -1:])[0]]
    while len(out) < n:
        out.append(_greedy(model(mx.array([[out[-1]]], dtype=mx.uint32), cache))[0])
    return out


def verify_deviation(model: Any, tokenizer: Any) -> float:
    """How far a verify forward's logits are from one-token steps' over the same tokens,
    as a share of the logits' largest magnitude (at least 1): the probe's greedy tokens
    fed one per forward, then again after the same prompt in forwards ``1 + DRAFT_MAX``
    wide, as a verify step feeds a row whose drafts were all kept."""
    prompt = prompt_ids(tokenizer)
    cache = make_caches(model)
    steps = [model(mx.array([prompt], dtype=mx.uint32), cache)[0, -1]]
    tokens = [_greedy(steps[-1][None, None])[0]]
    while len(tokens) < NEW_TOKENS:
        steps.append(model(mx.array([[tokens[-1]]], dtype=mx.uint32), cache)[0, -1])
        tokens.append(_greedy(steps[-1][None, None])[0])
    cache = make_caches(model)
    model(mx.array([prompt], dtype=mx.uint32), cache)
    fed, width = tokens[:-1], 1 + DRAFT_MAX  # the outputs of ``fed`` are ``steps[1:]``
    wide = mx.concatenate([model(mx.array([fed[i:i + width]], dtype=mx.uint32), cache)[0]
                           for i in range(0, len(fed), width)])
    plain = mx.stack(steps[1:]).astype(mx.float32)
    diff = mx.abs(wide.astype(mx.float32) - plain).max()
    scale = mx.maximum(mx.abs(plain).max(), 1.0)
    return float((diff / scale).item())


def _forget(model: Any, cache: list[Any], context: list[int], n: int) -> list[Any]:
    """``cache`` without its last ``n`` positions: trimmed, or (a window or a recurrent
    state) rebuilt from ``context``, the tokens it must then hold."""
    from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

    if not n:
        return cache
    if can_trim_prompt_cache(cache):
        trim_prompt_cache(cache, n)
        return cache
    cache = make_caches(model)
    if context:
        model(mx.array([context], dtype=mx.uint32), cache)
    return cache


def speculative_tokens(model: Any, session: Any, prompt: list[int], n: int,
                       draft_max: int) -> tuple[list[int], int, int]:
    """``n`` greedy tokens after ``prompt`` through ``session``'s drafts and verify
    forwards; with the tokens drafted and accepted."""
    tap = hidden_states.tap_for(model, session)
    cache = make_caches(model)
    first = _greedy(model(mx.array([prompt], dtype=mx.uint32), cache)[:, -1:])[0]
    last = tap.take()[0, -1:] if tap is not None else None  # the state that gave ``first``
    out, drafted, accepted = [first], 0, 0
    try:
        while len(out) < n:
            context = prompt + out
            limit = min(draft_max, n - len(out) - 1)
            row = DraftRow(KEY, list(context), last,
                           TargetCache(cache, 0) if tap is not None else None)
            draft = [int(t) for t in session.propose([row], [limit])[0][:limit]] \
                if limit else []
            got = _greedy(model(mx.array([[out[-1], *draft]], dtype=mx.uint32), cache))
            states = tap.take()[0] if tap is not None else None  # [1 + len(draft), H]
            kept = 0
            while kept < len(draft) and got[kept] == draft[kept]:
                kept += 1
            drafted, accepted = drafted + len(draft), accepted + kept
            out += draft[:kept] + [got[kept]]
            if draft:
                session.commit([DraftRow(KEY, list(prompt + out), states[:kept + 1]
                                         if states is not None else None)], [kept])
            last = states[kept:kept + 1] if states is not None else None
            cache = _forget(model, cache, (prompt + out)[:-1], len(draft) - kept)
    finally:
        session.release([KEY])
    return out[:n], drafted, accepted


def probe(model: Any, tokenizer: Any, session: Any, options: DraftOptions) -> ProbeResult:
    """The probe's verdict on ``session`` drafting for ``model`` (see the module
    docstring); exceptions are the caller's to report."""
    prompt = prompt_ids(tokenizer)
    plain = plain_tokens(model, prompt, NEW_TOKENS)
    spec, drafted, accepted = speculative_tokens(
        model, session, prompt, NEW_TOKENS, max(1, min(DRAFT_MAX, options.draft_max)))
    return ProbeResult(spec == plain, plain, spec, drafted, accepted)


def check_pairing(model: Any, tokenizer: Any, session: Any, options: DraftOptions,
                  kind: str, force: bool) -> None:
    """Probe ``session`` (a drafter of ``kind``) on ``model`` at startup and log the
    outcome; an inexact pairing, or a probe that fails, is refused unless ``force``
    (``--draft-force``)."""
    import structlog

    from mlxcel.errors import StartupError

    log = structlog.get_logger("mlxcel.engine")
    try:
        result = probe(model, tokenizer, session, options)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
        log.warning("speculation_probe", drafter=kind, exact=None, error=reason, forced=force)
        if force:
            return
        raise StartupError(f"the {kind} drafter failed its startup exactness probe "
                           f"({reason[:200]}); pass --draft-force to serve with it "
                           "anyway") from exc
    log.info("speculation_probe", drafter=kind, exact=result.exact, tokens=len(result.plain),
             drafted=result.drafted, accepted=result.accepted, forced=force)
    if result.exact or force:
        return
    pairs = zip(result.plain, result.speculative, strict=True)
    at = next(i for i, (a, b) in enumerate(pairs) if a != b)
    raise StartupError(f"the {kind} drafter is inexact with this model: greedy token {at} of "
                       f"the startup probe is {result.speculative[at]} with it and "
                       f"{result.plain[at]} without; pass --draft-force to serve with it "
                       "anyway")

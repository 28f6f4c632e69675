"""Draft model (``-md`` / ``--model-draft``): a smaller checkpoint with the target's
tokenizer proposes each row's next tokens greedily.

Each row keeps the draft model's cache and the tokens that cache covers. A round first
forgets what the row's context no longer agrees with (the drafts the target rejected),
feeds what the context gained since (the accepted drafts and the target's own token),
then drafts up to the row's limit, one token per forward. The drafted positions are
forgotten at the end of the round: the next round feeds back those the target kept, so a
row's cache always covers a prefix of its context and ``commit`` has nothing to do.

Every row of a round drafts in the same forward per draft position: the rows share one
batched cache per layer (``mlxcel.engine.cache.kvcache.BatchCache`` in absolute
positions: each row's RoPE positions are its own, rows left-padded to one write index);
a row forgets its last tokens by moving right into padding of its own (``_drop``). Rows of different catch-up
lengths are fed right-padded in one forward and their padding rolled back; rows in the
batch that do not draft this round ride along and forget all they were fed. A row that
joins is prefilled with the other rows that join, in a group of its own, then appended.
A draft model whose caches are not plain KV caches (sliding windows, recurrent layers)
cannot share that cache: it drafts row by row on mlx-lm's own caches, trimmed where they
can be and rebuilt where they cannot.

The draft model never reads nor changes the target's state: it has its own weights and
caches, and only token ids cross over.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import structlog

from mlxcel.drafters.api import DraftOptions, DraftRow, DraftTarget
from mlxcel.errors import StartupError

log = structlog.get_logger("mlxcel.drafters")

CHUNK = 512  # columns of one catch-up or prefill forward
PAD = 0  # the id fed where a row has nothing to feed (its position is rolled back)


def _make_cache(model: Any) -> list[Any]:
    from mlx_lm.models.cache import make_prompt_cache

    return make_prompt_cache(model)


def _common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _drop(caches: list[Any], drops: list[int]) -> None:
    """Forget the last ``drops[r]`` tokens of row r in every layer's ``BatchCache``
    (absolute positions). What every row drops moves the write index back; each row is
    then moved right by the rest of its drop, into padding of its own, so that every row
    ends at the write index again: one gather per layer and side for the whole batch
    (``BatchCache.rollback`` writes row by row, a copy of the buffer for each)."""
    from mlx_lm.models.cache import dynamic_roll

    common = min(drops, default=0)
    extra = [d - common for d in drops]
    shifts = mx.array(extra)[:, None] if any(extra) else None
    for c in caches:
        c._idx -= common
        if shifts is None or c.keys is None:
            continue
        c.keys = dynamic_roll(c.keys, shifts, axis=2)
        c.values = dynamic_roll(c.values, shifts, axis=2)
        c._set_pads([p + e for p, e in zip(c.pads, extra, strict=True)])


class BatchedDraft:
    """A ``DraftSession`` whose rows share one ``BatchCache`` per layer (see the module
    docstring). ``vocab``: ids at or past it (a draft model's padded embedding rows) are
    never proposed."""

    def __init__(self, model: Any, vocab: int) -> None:
        self.model = model
        self.vocab = vocab
        self.layers = len(_make_cache(model))
        self.order: list[int] = []  # row keys in cache order
        self.covered: dict[int, list[int]] = {}  # key -> the tokens its cache holds
        self.cache: list[Any] | None = None

    # -- the session -------------------------------------------------------------------------
    def propose(self, rows: list[DraftRow], limits: list[int]) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in rows]
        live = [(i, r, n) for i, (r, n) in enumerate(zip(rows, limits, strict=True))
                if n > 0 and r.tokens]
        if not live:
            return out
        # a row whose cache holds less than half of its context (the context was replaced,
        # its key was a departed row's, or it sat out many rounds) starts again: prefilled
        # with the rows that join, not fed beside every row of the batch
        self.release([r.key for _, r, _ in live if r.key in self.covered
                      and 2 * _common(self.covered[r.key], r.tokens) < len(r.tokens)])
        self._admit([r for _, r, _ in live if r.key not in self.covered])
        want = {r.key: r for _, r, _ in live}
        rests, drops = [], []
        for key in self.order:
            row = want.get(key)
            if row is None:  # rides along: fed nothing, forgets nothing it holds
                rests.append([])
                drops.append(0)
                continue
            have = self.covered[key]
            keep = min(_common(have, row.tokens), len(row.tokens) - 1)
            drops.append(len(have) - keep)
            rests.append(row.tokens[keep:])
            self.covered[key] = list(row.tokens)
        self._rollback(drops)
        first = self._feed(self.cache, rests)
        steps = max(n for _, _, n in live)
        drafted = [first]
        for _ in range(steps - 1):
            logits = self.model(drafted[-1][:, None], self.cache)
            drafted.append(self._pick(logits[:, -1, :]))
        if steps > 1:
            self._rollback([steps - 1] * len(self.order))
        tokens = mx.stack(drafted, axis=1).tolist()  # [B, steps]: the round's one read
        at = {key: j for j, key in enumerate(self.order)}
        for i, row, limit in live:
            out[i] = [int(t) for t in tokens[at[row.key]][:limit]]
        return out

    def commit(self, rows: list[DraftRow], accepted: list[int]) -> None:
        """Nothing to do: the next ``propose`` keeps what the context still agrees with."""

    def release(self, keys: list[int]) -> None:
        gone = {k for k in keys if k in self.covered}
        if not gone:
            return
        keep = [j for j, key in enumerate(self.order) if key not in gone]
        self.order = [self.order[j] for j in keep]
        for key in gone:
            del self.covered[key]
        if not keep:
            self.cache = None
            return
        for c in self.cache:
            c.filter(keep)

    # -- the batch ---------------------------------------------------------------------------
    def _new_cache(self, rows: int) -> list[Any]:
        from mlxcel.engine.cache.kvcache import BatchCache

        return [BatchCache([0] * rows) for _ in range(self.layers)]

    def _admit(self, rows: list[DraftRow]) -> None:
        """Prefill joining rows (all of each context but its last token) as a group of
        their own, then append them to the batch."""
        if not rows:
            return
        group = self._new_cache(len(rows))
        self._feed(group, [r.tokens[:-1] for r in rows], logits=False)
        if self.cache is None:
            self.cache = group
        else:
            for mine, theirs in zip(self.cache, group, strict=True):
                mine.extend(theirs)
        for r in rows:
            self.order.append(r.key)
            self.covered[r.key] = list(r.tokens[:-1])

    def _rollback(self, drops: list[int]) -> None:
        if self.cache is not None:
            _drop(self.cache, drops)

    def _feed(self, cache: list[Any], rests: list[list[int]],
              logits: bool = True) -> mx.array | None:
        """Feed each row its ``rests`` (right-padded, in chunks of ``CHUNK`` columns) and
        roll the padding back; with ``logits``, each row's greedy token after its last
        fed one (a row fed nothing gets a meaningless id)."""
        width = max(len(r) for r in rests)
        picked = None
        for lo in range(0, width, CHUNK):
            hi = min(width, lo + CHUNK)
            cols = [r[lo:hi] + [PAD] * (hi - lo - len(r[lo:hi])) for r in rests]
            out = self.model(mx.array(cols, dtype=mx.uint32), cache)
            if not logits:
                mx.eval([c.state for c in cache])
                continue
            last = [min(max(len(r) - 1 - lo, 0), hi - lo - 1) for r in rests]
            ends = [lo <= len(r) - 1 < hi for r in rests]
            here = self._pick(out[mx.arange(len(rests)), mx.array(last)])
            picked = here if picked is None else mx.where(mx.array(ends), here, picked)
        _drop(cache, [width - len(r) for r in rests])
        return picked

    def _pick(self, logits: mx.array) -> mx.array:
        return mx.argmax(logits[..., :self.vocab], axis=-1).astype(mx.uint32)


class RowDraft:
    """A ``DraftSession`` that drafts row by row on mlx-lm's caches (``make_prompt_cache``), for
    draft models whose caches cannot be batched here, and as the reference the batched
    session is measured against."""

    def __init__(self, model: Any, vocab: int) -> None:
        self.model = model
        self.vocab = vocab
        self.rows: dict[int, tuple[list[Any], list[int]]] = {}  # key -> (cache, covered)

    def propose(self, rows: list[DraftRow], limits: list[int]) -> list[list[int]]:
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        out = []
        for row, limit in zip(rows, limits, strict=True):
            if limit <= 0 or not row.tokens:
                out.append([])
                continue
            cache, have = self.rows.get(row.key) or (_make_cache(self.model), [])
            keep = min(_common(have, row.tokens), len(row.tokens) - 1)
            if keep < len(have):
                if can_trim_prompt_cache(cache):
                    trim_prompt_cache(cache, len(have) - keep)
                else:  # a window or a recurrent state cannot forget: start again
                    cache, keep = _make_cache(self.model), 0
            rest = row.tokens[keep:]
            for lo in range(0, len(rest) - 1, CHUNK):
                self.model(mx.array([rest[lo:min(lo + CHUNK, len(rest) - 1)]],
                                    dtype=mx.uint32), cache)
            y = self._pick(self.model(mx.array([rest[-1:]], dtype=mx.uint32), cache))
            drafted = [y]
            for _ in range(limit - 1):
                drafted.append(self._pick(self.model(drafted[-1][None], cache)))
            covered = list(row.tokens)
            if limit > 1:
                if can_trim_prompt_cache(cache):
                    trim_prompt_cache(cache, limit - 1)
                else:
                    covered += [-1] * (limit - 1)  # never matches: the next round rebuilds
            self.rows[row.key] = (cache, covered)
            out.append([int(t) for t in mx.concatenate(drafted).tolist()])
        return out

    def commit(self, rows: list[DraftRow], accepted: list[int]) -> None:
        """Nothing to do: the next ``propose`` keeps what the context still agrees with."""

    def release(self, keys: list[int]) -> None:
        for key in keys:
            self.rows.pop(key, None)

    def _pick(self, logits: mx.array) -> mx.array:
        return mx.argmax(logits[:, -1, :self.vocab], axis=-1).astype(mx.uint32)


def batchable(model: Any) -> bool:
    """Whether every layer's cache is mlx-lm's plain ``KVCache`` (what ``BatchCache``
    replaces)."""
    from mlx_lm.models.cache import KVCache

    return all(type(c) is KVCache for c in _make_cache(model))


# -- loading and the vocabulary check -------------------------------------------------------

SAMPLE = 64  # ids compared across the vocabulary, besides every added token


def vocab_difference(target: Any, draft: Any) -> str | None:
    """What differs between two ``mlxcel.model.tokenizer.Tokenizer``s, in a few words, or
    None. Drafts are token ids: a draft model whose ids mean other text than the target's
    would propose tokens the target almost never keeps, so its size, its special tokens
    and a sample of ids spread over the vocabulary must agree."""
    if target.vocab_size != draft.vocab_size:
        return f"vocabulary size {target.vocab_size} (target) vs {draft.vocab_size} (draft)"
    for name in ("bos_token", "eos_token"):
        a, b = getattr(target, name), getattr(draft, name)
        if a != b:
            return f"{name} {a!r} (target) vs {b!r} (draft)"
    ta, da = target.hf.get_added_tokens_decoder(), draft.hf.get_added_tokens_decoder()
    for tid in sorted(set(ta) | set(da)):
        a, b = ta.get(tid), da.get(tid)
        if (a and a.content) != (b and b.content):
            return (f"special token id {tid}: {a and a.content!r} (target) vs "
                    f"{b and b.content!r} (draft)")
    n = target.vocab_size
    for tid in sorted({min(n - 1, i * n // SAMPLE) for i in range(SAMPLE)} | {n - 1}):
        a, b = target.hf.id_to_token(tid), draft.hf.id_to_token(tid)
        if a != b:
            return f"token id {tid}: {a!r} (target) vs {b!r} (draft)"
    return None


def load_draft(model: str, dtype: str | None = None) -> tuple[Any, Any, Path]:
    """The draft checkpoint's (model, tokenizer, path), from a local directory or a
    Hugging Face id; anything that stops it loading is one ``StartupError`` line.
    ``dtype`` (the target's compute dtype): an unquantized draft computes in it too, so it
    takes the same matmul paths as the target (``--dtype`` on a CPU casts bfloat16 to
    float32, whose matmuls are the fast ones there)."""
    from mlx_lm.utils import load_model

    from mlxcel.model.loader import resolve_model_path
    from mlxcel.model.tokenizer import Tokenizer

    try:
        path = resolve_model_path(model)
        tokenizer = Tokenizer.from_dir(path)
        loaded, config = load_model(path)
        if dtype in ("float32", "float16", "bfloat16") and "quantization" not in config:
            loaded.set_dtype(getattr(mx, dtype))
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StartupError(f"--model-draft {model}: cannot load the draft model: "
                           f"{reason[:300]}") from exc
    return loaded, tokenizer, path


def new_session(target: DraftTarget, options: DraftOptions) -> BatchedDraft | RowDraft:
    """The draft model's session: loaded, its vocabulary checked against the target's."""
    if not options.model:
        raise StartupError("the draft-model drafter needs a checkpoint: -md / --model-draft")
    from mlxcel.backend import model_dtype

    model, tokenizer, path = load_draft(
        options.model, model_dtype(getattr(target.model, "model", target.model)))
    if (diff := vocab_difference(target.tokenizer, tokenizer)) is not None:
        raise StartupError(f"--model-draft {options.model}: its tokenizer differs from the "
                           f"target's ({diff}); a draft model must share the target's "
                           "vocabulary")
    session = (BatchedDraft if batchable(model) else RowDraft)(model, target.tokenizer.vocab_size)
    log.info("draft_model_loaded", path=str(path), batched=isinstance(session, BatchedDraft),
             layers=len(_make_cache(model)))
    return session

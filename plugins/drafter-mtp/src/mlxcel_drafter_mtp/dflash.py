"""DFlash block drafters (``-md`` a DFlash checkpoint, kind ``dflash``), through mlx-vlm.

A DFlash checkpoint (the Qwen3 and Gemma 4 ones mlx-vlm loads: ``model_type`` ``qwen3``
or ``gemma4`` with a ``dflash_config``, ``qwen3_dflash`` / ``gemma4_dflash`` as mlx-vlm
names them) is a few non-causal decoder layers that read the outputs of chosen target
layers (``target_layer_ids``), joined and projected into a KV cache of their own: the
context. A round feeds the block ``[last token, mask, mask, ...]`` after that context and
reads one guess per mask position, all in one forward; the block's own keys are not
kept. mlx-vlm's ``DFlashDraftModel`` (its
loader, its ``draft_block``) does the work, bound to the target's embeddings and LM head;
the engine gives the target layers' outputs (``hidden_layers``, ``DraftRow.hidden``).

Each row keeps its own drafter cache (``_Row``):

* ``propose`` feeds the context the row gained since its last round (the states
  ``commit`` kept, and the state before the row's last token where no commit gave it)
  with the block, and returns the block's guesses: at most ``limits[i]`` and one less
  than the block width (``--draft-block-size``, else the checkpoint's own), greedy;
* ``commit`` keeps the states at the positions the target confirmed, to be fed with the
  row's next block.

A row's context starts at its first drafting round, not at its prefill: the engine
computes prefill states only for the part of a prompt the prompt cache did not hold, in
chunks shared by rows, and keeping them would cost every row, drafting or not. Where a
row decoded without drafting (its governor backed off) those positions are absent; the
context keeps its order and the block still follows the latest state, so a gap costs
acceptance, never exactness (verification keeps the target's tokens). Positions in the
drafter's cache count from the row's first round: attention under RoPE reads only the
distances between positions, so the offset changes nothing.
"""

from __future__ import annotations

import pathlib
from typing import Any

import mlx.core as mx
import structlog
from mlxcel.drafters.api import DraftOptions, DraftRow, DraftTarget
from mlxcel.errors import StartupError

from mlxcel_drafter_mtp.plugin import DFLASH_TYPES

log = structlog.get_logger("mlxcel.drafters")


class _Row:
    """One row's drafter cache; ``pending``: context states not fed yet; ``upto``: the
    position of the latest state fed or pending (-1: none); ``start``: the position of
    the block the row last proposed from, until its commit."""

    __slots__ = ("cache", "pending", "start", "upto")

    def __init__(self, cache: list[Any]) -> None:
        self.cache = cache
        self.pending: list[mx.array] = []
        self.upto = -1
        self.start: int | None = None


class DFlashSession:
    """A ``DraftSession`` over mlx-vlm's DFlash draft model (the module docstring)."""

    needs_hidden = True

    def __init__(self, head: Any, vocab: int, block: int) -> None:
        self.head = head
        self.vocab = vocab
        self.block = block  # the block's width: its last token and block - 1 masks
        self.hidden_layers = tuple(int(i) for i in head.config.target_layer_ids)
        self.rows: dict[int, _Row] = {}

    def propose(self, rows: list[DraftRow], limits: list[int]) -> list[list[int]]:
        drafts: list[Any] = []
        for row, limit in zip(rows, limits, strict=True):
            ready = limit > 0 and row.hidden is not None and len(row.tokens) > 1
            drafts.append(self._draft(row, min(limit, self.block - 1)) if ready else None)
        mx.eval([d for d in drafts if d is not None])
        return [[] if d is None else [int(t) for t in d[0].tolist()] for d in drafts]

    def _draft(self, row: DraftRow, width: int) -> mx.array | None:
        state = self.rows.get(row.key)
        if state is None:
            state = self.rows[row.key] = _Row(self.head.make_cache())
        position = len(row.tokens) - 2  # the state that gave the row's last token
        if state.upto < position:
            state.pending.append(row.hidden)
            state.upto = position
        state.start = None
        if not state.pending:
            return None
        context = mx.concatenate(state.pending, axis=0)[None]
        state.pending = []
        state.start = position + 1
        return self.head.draft_block(int(row.tokens[-1]), context, state.cache, width + 1,
                                     self._pick)

    def _pick(self, logits: mx.array) -> mx.array:
        return mx.argmax(logits[..., :self.vocab], axis=-1)

    def commit(self, rows: list[DraftRow], accepted: list[int]) -> None:
        for row, n in zip(rows, accepted, strict=True):
            state = self.rows.get(row.key)
            if state is None or state.start is None or row.hidden is None:
                continue
            kept = min(n + 1, row.hidden.shape[0])
            state.pending.append(row.hidden[:kept])
            state.upto, state.start = state.start + kept - 1, None

    def release(self, keys: list[int]) -> None:
        for key in keys:
            self.rows.pop(key, None)


def _refuse(model: str, why: str) -> StartupError:
    return StartupError(f"--model-draft {model}: {why}")


def load_drafter(model: str) -> tuple[Any, pathlib.Path]:
    """mlx-vlm's DFlash model from the checkpoint ``model`` (a directory or a Hugging Face
    id) and its path; one ``StartupError`` line for what stops it."""
    from mlx_vlm.speculative.drafters import DFlashDraftModel
    from mlx_vlm.speculative.drafters import load_drafter as vlm_load
    from mlxcel.drafters.hidden import first_line
    from mlxcel.drafters.select import draft_model_type
    from mlxcel.model.loader import resolve_model_path

    kind = draft_model_type(model)
    if kind not in DFLASH_TYPES:
        raise _refuse(model, f"not a DFlash checkpoint (model_type {kind!r}; the DFlash "
                             f"drafter serves {', '.join(DFLASH_TYPES)})")
    try:
        path = resolve_model_path(model)
        head, _ = vlm_load(str(path), kind="dflash")
    except Exception as exc:
        raise _refuse(model, f"cannot load the DFlash drafter: {first_line(exc)}") from exc
    if not isinstance(head, DFlashDraftModel):
        raise _refuse(model, f"mlx-vlm loads it as {type(head).__name__}, not a DFlash "
                             "draft model")
    return head, pathlib.Path(path)


def check_fit(model: str, head: Any, path: pathlib.Path, target: DraftTarget) -> None:
    """Refuse, in one line, a drafter trained for another target: its layer count and
    ``target_layer_ids``, its hidden size, its vocabulary (and its tokenizer, where the
    checkpoint has one)."""
    from mlxcel.drafters.hidden import decoder_layers

    cfg = head.config
    text = target.config.get("text_config") or target.config
    layers = decoder_layers(target.model)
    count = len(layers) if layers is not None else text.get("num_hidden_layers")
    ids = list(cfg.target_layer_ids)
    if count != cfg.num_target_layers or not ids or not all(0 <= i < count for i in ids):
        raise _refuse(model, f"it drafts for a target of {cfg.num_target_layers} layers "
                             f"(it reads layers {ids}); this target has {count}")
    if text.get("hidden_size") != cfg.hidden_size:
        raise _refuse(model, f"hidden size {cfg.hidden_size} (draft) vs "
                             f"{text.get('hidden_size')} (target)")
    if text.get("vocab_size") != cfg.vocab_size:
        raise _refuse(model, f"vocabulary size {cfg.vocab_size} (draft) vs "
                             f"{text.get('vocab_size')} (target): it drafts another "
                             "model's tokens")
    if not 0 <= cfg.mask_token_id < cfg.vocab_size:
        raise _refuse(model, f"mask_token_id {cfg.mask_token_id} is outside its vocabulary")
    if (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file():
        from mlxcel.drafters.model import vocab_difference
        from mlxcel.model.tokenizer import Tokenizer

        diff = vocab_difference(target.tokenizer, Tokenizer.from_dir(path))
        if diff is not None:
            raise _refuse(model, f"its tokenizer differs from the target's ({diff})")


def new_session(target: DraftTarget, options: DraftOptions) -> DFlashSession:
    """The DFlash drafter's session: its checkpoint loaded, checked against ``target``
    and bound to its embeddings and LM head."""
    if not options.model:
        raise StartupError("the DFlash drafter needs its checkpoint: -md / --model-draft")
    from mlx_vlm.speculative.common import _dflash_block_total
    from mlxcel.drafters.hidden import bind_head

    head, path = load_drafter(options.model)
    check_fit(options.model, head, path, target)
    block = _dflash_block_total(head, options.block_size or None)
    if block < 2:
        raise StartupError(f"--draft-block-size {block}: a DFlash block holds the row's "
                           "last token and at least one mask: 2 or more")
    head = bind_head(head, target.model)
    log.info("dflash_drafter_loaded", path=str(path), block=block,
             target_layers=list(head.config.target_layer_ids), layers=len(head.layers))
    return DFlashSession(head, target.tokenizer.vocab_size, block)

"""Qwen3.5/3.6's MTP heads (the ``mtp.*`` weights inside the target), kind ``mtp``.

The target is core's (mlx-lm's ``qwen3_5``, whose loader drops ``mtp.*``); this module
reads those tensors from the checkpoint itself and builds mlx-vlm's MTP module from them
(``mlx_vlm.speculative.drafters``: the splitter that selects and sanitizes ``mtp.*``, and
``Qwen3_5MTPDraftModel``), bound to the target's embeddings and LM head.

The head is one decoder layer with a KV cache of its own. Its entry at position ``p``
reads the pair (the target's hidden state at ``p``, the token at ``p + 1``) and predicts
the token at ``p + 2``; fed its own output and prediction it drafts the one after, as
mlx-vlm's ``draft_block`` does. Each row keeps its own cache (``_Row``), in the engine's
terms (``DraftSession.needs_hidden``):

* ``propose`` feeds the pair (``DraftRow.hidden``, the row's last token), then its own
  drafts, and trims what it fed: the drafts' entries are guesses;
* ``commit`` feeds the pairs the target confirmed: the proposed-from pair, then each
  kept draft with the verify forward's hidden state before it (``DraftRow.hidden``).

So the cache holds only the target's own states, at their true positions (RoPE), from
the row's first drafting round on; positions a row decoded without drafting are simply
absent, which costs acceptance, never exactness (verification keeps the target's
tokens). Proposals are greedy.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import mlx.core as mx
import structlog
from mlxcel.drafters.api import DraftOptions, DraftRow, DraftTarget
from mlxcel.errors import StartupError

log = structlog.get_logger("mlxcel.drafters")
DISTRIBUTION = "mlxcel-drafter-mtp"


class _Row:
    """One row's head cache, and the round it proposed from: ``pair`` (position,
    hidden [1, 1, H], token) and ``draft`` (the tokens it proposed)."""

    __slots__ = ("cache", "draft", "pair")

    def __init__(self, cache: list[Any]) -> None:
        self.cache = cache
        self.pair: tuple[int, mx.array, int] | None = None
        self.draft: list[int] = []


class MTPSession:
    """A ``DraftSession`` over mlx-vlm's Qwen3.5 MTP module (the module docstring)."""

    needs_hidden = True

    def __init__(self, head: Any, vocab: int) -> None:
        self.head = head
        self.vocab = vocab
        self.rows: dict[int, _Row] = {}

    def propose(self, rows: list[DraftRow], limits: list[int]) -> list[list[int]]:
        out = []
        for row, limit in zip(rows, limits, strict=True):
            ready = row.hidden is not None and len(row.tokens) > 1
            out.append(self._draft(row, limit) if limit > 0 and ready else [])
        return out

    def _draft(self, row: DraftRow, limit: int) -> list[int]:
        state = self.rows.get(row.key)
        if state is None:
            state = self.rows[row.key] = _Row(self.head.make_cache())
        position, hidden = len(row.tokens) - 2, row.hidden[None]
        state.pair = (position, hidden, int(row.tokens[-1]))
        token = mx.array([[row.tokens[-1]]], dtype=mx.int32)
        drafted = []
        for step in range(limit):
            hidden = self._forward(state.cache, token, hidden, position + step)
            token = mx.argmax(self.head._lm_head_fn(hidden)[..., :self.vocab], axis=-1)
            drafted.append(token)
        for cache in state.cache:
            cache.trim(limit)
        state.draft = [int(t) for t in mx.concatenate(drafted, axis=1)[0].tolist()]
        return state.draft

    def _forward(self, cache: list[Any], tokens: mx.array, hidden: mx.array,
                 position: int) -> mx.array:
        """The head over ``tokens`` [1, L] and the hidden states before them [1, L, H],
        at positions ``position``..., appended to ``cache``; its outputs [1, L, H]."""
        head = self.head
        embed = head._input_embed(tokens) * head._input_embed_scale
        positions = mx.arange(position, position + tokens.shape[1], dtype=mx.int32)[None]
        return head._forward_hidden(embed, hidden.astype(embed.dtype), cache, positions)

    def commit(self, rows: list[DraftRow], accepted: list[int]) -> None:
        for row, n in zip(rows, accepted, strict=True):
            state = self.rows.get(row.key)
            if state is None or state.pair is None or row.hidden is None:
                continue
            position, hidden, token = state.pair
            n = min(n, len(state.draft), row.hidden.shape[0])
            tokens = mx.array([[token, *state.draft[:n]]], dtype=mx.int32)
            hiddens = mx.concatenate([hidden, row.hidden[None, :n]], axis=1)
            self._forward(state.cache, tokens, hiddens, position)
            state.pair, state.draft = None, []

    def release(self, keys: list[int]) -> None:
        for key in keys:
            self.rows.pop(key, None)


def load_heads(target: DraftTarget) -> Any:
    """mlx-vlm's MTP module from the ``mtp.*`` tensors of the target's checkpoint, bound
    to the target, in its compute dtype; one ``StartupError`` line for what stops it."""
    from mlx_vlm.speculative.drafters import validate_drafter_compatibility
    from mlx_vlm.speculative.drafters.mtp_split import detect_mtp_splitter, get_mtp_splitter
    from mlxcel.drafters.hidden import bind_head, first_line, network

    path = pathlib.Path(target.path)
    try:
        config = json.loads((path / "config.json").read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise StartupError(f"--spec-type draft-mtp: cannot read {path}/config.json "
                           f"({type(exc).__name__})") from exc
    if get_mtp_splitter(source_config=config) is None:
        raise StartupError(f"--spec-type draft-mtp: {DISTRIBUTION} reads no MTP heads "
                           f"inside a {config.get('model_type')!r} target")
    splitter = detect_mtp_splitter(path)
    if splitter is None:
        raise StartupError(f"--spec-type draft-mtp: {path.name} has no mtp.* weights "
                           "(its conversion dropped them): use a checkpoint that keeps "
                           "them, or serve without --spec-type draft-mtp")
    try:
        head = splitter.load(path, source_config=config)
        validate_drafter_compatibility(network(target.model), head, "mtp")
    except Exception as exc:
        raise StartupError(f"--spec-type draft-mtp: cannot build the MTP heads of "
                           f"{path.name}: {first_line(exc)}") from exc
    return bind_head(head, target.model)


def new_session(target: DraftTarget, options: DraftOptions) -> MTPSession:
    """The MTP heads' session for ``target`` (they need no checkpoint but its own)."""
    if options.model:
        raise StartupError("the Qwen3.5 MTP drafter reads the target's own heads: "
                           "drop -md / --model-draft")
    head = load_heads(target)
    log.info("mtp_heads_loaded", model=target.path, layers=len(head.layers))
    return MTPSession(head, target.tokenizer.vocab_size)

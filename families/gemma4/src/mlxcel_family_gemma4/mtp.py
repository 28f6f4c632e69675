"""Gemma 4's assistant drafter (``gemma4_assistant``, kind ``mtp``), through mlx-vlm.

An assistant checkpoint is a few decoder layers that own no keys or values: each attends
to the target's own (the last layer with a cache of each attention type, sliding and
full), reads the target's last hidden state and the embedding of the row's last token,
and proposes the next token; fed its own output, it proposes the one after, at the same
position, as mlx-vlm's ``Gemma4AssistantDraftModel.draft_block`` does. The model class,
its masks and its weights loading are mlx-vlm's (``mlx_vlm.speculative.drafters``); what
this module adds is the engine's side: each row's hidden state and its keys and values
come from the engine (``DraftSession.needs_hidden``: ``DraftRow.hidden``,
``DraftRow.cache`` read with ``mlxcel.drafters.target.row_kv``), in mlx-vlm's single-row
layout (the row's tokens but its last, oldest first; the drafter's position the last of
them), so rows of any lengths draft one after another, each as mlx-vlm drafts a lone
row. Proposals are greedy: verification keeps the target's own tokens either way.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import structlog
from mlxcel.drafters.api import DraftOptions, DraftRow, DraftTarget
from mlxcel.errors import StartupError

log = structlog.get_logger("mlxcel.drafters")
EXTRA = "mlxcel-family-gemma4[mtp]"
TARGET_TYPES = ("gemma4", "gemma4_text")


def _text_config(config: dict) -> dict:
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def cache_owners(model: Any, layers: int) -> dict[str, int]:
    """Per attention type, the index of the last layer of the target that has a cache of
    its own: the keys and values every KV-shared layer of that type reads, and the ones
    mlx-vlm hands the assistant."""
    from mlxcel.drafters.hidden import text_model

    inner = text_model(model)
    owners: dict[str, int] = {}
    for i, layer in enumerate(inner.layers[:layers]):
        owners[layer.layer_type] = i
    return owners


class AssistantSession:
    """A ``DraftSession`` over mlx-vlm's assistant model (see the module docstring)."""

    needs_hidden = True

    def __init__(self, drafter: Any, target: Any, vocab: int) -> None:
        self.drafter = drafter
        self.target = target
        self.vocab = vocab

    def propose(self, rows: list[DraftRow], limits: list[int]) -> list[list[int]]:
        out = []
        for row, limit in zip(rows, limits, strict=True):
            ready = row.hidden is not None and row.cache is not None and len(row.tokens) > 1
            out.append(self._draft(row, limit) if limit > 0 and ready else [])
        return out

    def _draft(self, row: DraftRow, limit: int) -> list[int]:
        from mlxcel.drafters.target import row_kv

        layers, index = row.cache
        shared = {}
        for kind, i in cache_owners(self.target, len(layers)).items():
            kv = row_kv(layers[i], index)
            if kv is None:
                return []
            shared[kind] = kv
        held = len(row.tokens) - 1  # the target's cache holds all but the last token
        self.drafter.set_shared_kv(shared, held, position=max(held - 1, 0),
                                   kv_valid_len=held)
        drafted = self.drafter.draft_block(
            row.tokens[-1], row.hidden[None], None, limit + 1, self._pick, mx.int32,
            greedy=True)
        tokens = [int(t) for t in drafted[0].tolist()]
        cut = next((j for j, t in enumerate(tokens) if not 0 <= t < self.vocab), len(tokens))
        return tokens[:cut]

    def _pick(self, logits: mx.array) -> mx.array:
        return mx.argmax(logits[..., :self.vocab], axis=-1)

    def commit(self, rows: list[DraftRow], accepted: list[int]) -> None:
        """Nothing to keep: each round reads the target's state afresh."""

    def release(self, keys: list[int]) -> None:
        """Nothing per row."""


def load(model: str, target: DraftTarget) -> Any:
    """mlx-vlm's assistant model for ``model`` (a directory or a Hugging Face id), bound
    to the target, in the target's compute dtype; one ``StartupError`` line for anything
    that stops it."""
    try:
        from mlx_vlm.speculative.drafters import load_drafter, validate_drafter_compatibility
    except ImportError as exc:
        raise StartupError(f"--model-draft {model}: the Gemma 4 assistant drafter needs "
                           f"mlx-vlm: pip install '{EXTRA}'") from exc
    from mlxcel.drafters.hidden import bind_head, first_line, network
    from mlxcel.model.loader import resolve_model_path

    try:
        drafter, kind = load_drafter(str(resolve_model_path(model)), kind="mtp")
        if kind != "mtp":
            raise ValueError(f"it is a {kind} drafter, not an MTP assistant")
        _check_target(drafter, target)
        validate_drafter_compatibility(network(target.model), drafter, "mtp")
    except StartupError:
        raise
    except Exception as exc:
        raise StartupError(f"--model-draft {model}: cannot use it as a Gemma 4 assistant: "
                           f"{first_line(exc)}") from exc
    return bind_head(drafter, target.model)


def _check_target(drafter: Any, target: DraftTarget) -> None:
    """The assistant reads the target's keys and values and its hidden state: the target
    must be Gemma 4 with the head sizes and hidden size the assistant was made for."""
    if target.config.get("model_type") not in TARGET_TYPES:
        raise ValueError(f"the target is {target.config.get('model_type')!r}, not Gemma 4")
    mine, theirs = drafter.config.text_config, _text_config(target.config)
    hidden = theirs.get("hidden_size")
    if hidden is not None and drafter.config.backbone_hidden_size != hidden:
        raise ValueError(f"it reads hidden states of size "
                         f"{drafter.config.backbone_hidden_size}, the target's are {hidden}")
    for name in ("num_key_value_heads", "head_dim", "global_head_dim"):
        want = theirs.get(name)
        if want is not None and getattr(mine, name, want) != want:
            raise ValueError(f"its {name} is {getattr(mine, name)}, the target's {want}")


def new_session(target: DraftTarget, options: DraftOptions) -> AssistantSession:
    """The assistant's session for ``target`` (``options.model``: its checkpoint)."""
    if not options.model:
        raise StartupError("the Gemma 4 assistant drafter needs its checkpoint: -md")
    drafter = load(options.model, target)
    log.info("mtp_assistant_loaded", model=options.model,
             layers=len(drafter.model.layers), block_size=drafter.config.block_size)
    return AssistantSession(drafter, target.model, target.tokenizer.vocab_size)

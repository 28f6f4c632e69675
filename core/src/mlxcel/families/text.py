"""The text family kit: what a family of mlx-lm text decoders names in its ``Family``.

``load`` loads a checkpoint with mlx-lm's own loading code, ``decoder`` is the
``generate`` task's attr, and ``check`` declines the checkpoints a text decoder family must
not take: sentence-transformers embedders and sequence classifiers, whose ``model_type``
(``qwen3``, ``gemma3_text``) is a chat model's too. Core's text families use these; a
separately installed family of mlx-lm models (``mlxcel-family-gemma4``) names them as
``"mlxcel.families.text:load"`` and so on. Importing this module imports no MLX.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LOAD = "mlxcel.families.text:load"
DECODER = "mlxcel.families.text:decoder"
CHECK = "mlxcel.families.text:check"
TASKS = {"generate": DECODER}


def load(path: Path, options: Any) -> Any:
    """mlx-lm's model for the checkpoint, as ``Loaded`` (``mlxcel.builtin.text_loader``)."""
    from mlxcel.builtin.text_loader import load as text_load

    return text_load(path, options)


def decoder(loaded: Any) -> Any:
    """The ``generate`` task: the model the continuous batch drives."""
    return loaded.model


def side_model_reason(path: Path, config: dict) -> str | None:
    """Why the checkpoint is not a text decoder's, or None: a sentence-transformers
    pooling module, a sequence-classification head, or encoder-only architectures."""
    modules = path / "modules.json"
    if modules.is_file():
        try:
            listed = json.loads(modules.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            listed = []
        if any("Pooling" in str(m.get("type", "")) for m in listed if isinstance(m, dict)):
            return "a sentence-transformers embedder (modules.json names a Pooling module)"
    archs = [str(a) for a in config.get("architectures") or []]
    if any(a.endswith("ForSequenceClassification") for a in archs):
        return f"a sequence classifier ({archs[0]}), not a text decoder"
    if archs and all(a.endswith("Model") for a in archs):
        return f"an encoder without a language-model head ({archs[0]})"
    return None


def check(path: Path, config: dict) -> bool | str:
    """A text decoder's checkpoint, not an embedder's or a classifier's."""
    return side_model_reason(path, config) or True

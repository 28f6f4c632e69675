"""Load a Gemma 4 checkpoint: with its vision tower through mlx-vlm where it has one and
the ``vision`` extra is installed, else its text model through mlx-lm.

A ``gemma4`` checkpoint whose ``config.json`` has a ``vision_config`` is loaded by
``mlxcel_family_vlm.load.load`` (``mlx_vlm.utils.load``: vision tower, projector,
language model and processor), and its decoder (``vision.Gemma4Vision``) takes images in
chat requests. Without mlx-vlm or mlxcel-family-vlm, or for a checkpoint without a vision
tower (``gemma4_text``), core's text kit loads mlx-lm's Gemma 4, which serves text only;
for a checkpoint that has a tower, a startup log line names the extra that adds image
input, since a request with an image part then gets 501.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import structlog
from mlxcel.families import text

log = structlog.get_logger("mlxcel.loader")
EXTRA = "mlxcel-family-gemma4[vision]"


def vision_available() -> bool:
    """Whether the ``vision`` extra's packages are installed (found, not imported)."""
    return all(importlib.util.find_spec(name) is not None
               for name in ("mlx_vlm", "mlxcel_family_vlm"))


def has_tower(config: dict) -> bool:
    return isinstance(config.get("vision_config"), dict)


def load(path: Path, options: Any) -> Any:
    """mlx-vlm's model and processor for a checkpoint with a vision tower, where the
    extra is installed; else mlx-lm's text model (the module docstring)."""
    config = _config(Path(path))
    if has_tower(config):
        if vision_available():
            from mlxcel_family_vlm.load import load as vlm_load

            return vlm_load(path, options)
        log.info("family_hint", model_type=config.get("model_type"), family="gemma4",
                 install=EXTRA, adds="image input needs mlx-vlm (without it the checkpoint "
                                     f"serves text only): pip install '{EXTRA}'")
    return text.load(path, options)


def decoder(loaded: Any) -> Any:
    """The ``generate`` task: Gemma 4 with images where mlx-vlm loaded it, else the text
    model."""
    if loaded.processor is None:
        return text.decoder(loaded)
    from mlxcel_family_gemma4.vision import Gemma4Vision

    return Gemma4Vision(loaded.model, loaded.processor, loaded.config)


def _config(path: Path) -> dict:
    import json

    try:
        data = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}

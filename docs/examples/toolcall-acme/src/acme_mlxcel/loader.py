"""The acme family's loader: acme_lm checkpoints are Llama-architecture weights.

mlx-lm has no ``acme_lm`` module, so the loader hands it mlx-lm's Llama classes; the rest
(weights, quantization, the cache) is mlx-lm's own. It is imported only when an acme_lm
checkpoint is served, so importing the plugin stays cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.models import llama
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model
from mlxcel.families.api import Loaded, LoadOptions


class AcmeModel:
    """What the engine drives (``LoadedModel``): called on token ids with the caches it
    made, it returns logits; ``model`` is the mlx-lm module itself."""

    def __init__(self, model: Any, config: dict, path: Path) -> None:
        self.model, self.config, self.path = model, config, path

    def make_cache(self) -> list[Any]:
        return make_prompt_cache(self.model)

    def __call__(self, inputs: mx.array, cache: list[Any]) -> mx.array:
        return self.model(inputs, cache=cache)


def load(path: Path, options: LoadOptions) -> Loaded:
    """``Family.load``: load the checkpoint, cast to ``options.dtype`` unless "auto"."""
    model, config = load_model(Path(path), lazy=options.lazy,
                               trust_remote_code=options.trust_remote_code,
                               get_model_classes=lambda config: (llama.Model, llama.ModelArgs))
    if options.dtype != "auto":
        model.set_dtype(getattr(mx, options.dtype))
    model.eval()
    return Loaded(model=AcmeModel(model, config, Path(path)), tasks=("generate",),
                  config=config)


def decoder(loaded: Loaded) -> AcmeModel:
    """``Family.tasks["generate"]``: the model the continuous batch drives."""
    return loaded.model

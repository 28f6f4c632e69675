"""Load an mlx-lm text checkpoint (plain or quantized) with mlx-lm's own loading code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from mlxcel.builtin.weight_reads import load_in_threads
from mlxcel.families.api import Loaded, LoadOptions

_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


class TextModel:
    """An mlx-lm ``nn.Module`` plus what the engine needs to drive it."""

    def __init__(self, model: Any, config: dict, path: Path) -> None:
        self.model = model
        self.config = config
        self.path = path

    def make_cache(self) -> list[Any]:
        return make_prompt_cache(self.model)

    def __call__(self, inputs: mx.array, cache: list[Any]) -> mx.array:
        return self.model(inputs, cache=cache)


def load(path: Path, options: LoadOptions) -> Loaded:
    """mlx-lm's model for the checkpoint. A model module that calls ``sys.exit`` on import
    (mlx-lm's olmo does when its optional package is missing) fails the load as an error,
    since SystemExit would end the engine thread without a word. ``options.read_threads``
    above 1 reads the weights in that many threads (``mlxcel.builtin.weight_reads``)."""
    threaded = options.read_threads > 1 and not options.lazy
    try:
        model, config = load_model(Path(path), lazy=options.lazy or threaded,
                                   trust_remote_code=options.trust_remote_code)
    except SystemExit as exc:
        raise RuntimeError(f"mlx-lm's module for this checkpoint's model_type exited on import "
                           f"(status {exc.code}); it needs a package that is not installed, "
                           "named in the message it printed") from None
    if threaded and not load_in_threads(model, Path(path), options.read_threads):
        mx.eval(model.parameters())  # mlx-lm's own reads, as its load_model would run them
    dtype = _DTYPES.get(options.dtype)  # "auto": keep the checkpoint's dtype
    if dtype is not None:
        # Floating-point parameters only: in a quantized model that is the scales, biases
        # and unquantized layers (norms); the packed uint32 weights stay as they are.
        # mx.quantized_matmul runs with float32 scales/biases on CPU and GPU.
        model.set_dtype(dtype)
    model.eval()
    return Loaded(model=TextModel(model, config, Path(path)), tasks=("generate",),
                  config=config)

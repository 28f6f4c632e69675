"""Load a Whisper checkpoint with mlx-audio's model class, in either layout (``detect``).

The steps are mlx-audio's own loader's (``mlx_audio.stt.utils.load_model``): its
``Model`` for the config's dimensions, the weights through its ``sanitize`` (transformers'
key names mapped, conv kernels transposed), its quantization, and its post-load hook that
reads the processor (tokenizer) and the alignment heads. They are called one by one here
so that the model is built in the dtype asked for: mlx-audio's loader always builds it in
float16, which would round a float32 checkpoint served on the CPU.

A checkpoint without the processor files mlx-audio needs is refused before any weight is
read, in one line naming the files and the openai repo they come from; a checkpoint whose
weights miss some of the model's parameters is refused too, since mlx-audio's loader
would leave them at their random initial values.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_audio.stt.models.whisper.whisper import Model, ModelDimensions
from mlx_audio.utils import apply_quantization, load_weights
from mlxcel.errors import StartupError
from mlxcel.families.api import Loaded, LoadOptions

from mlxcel_family_whisper import detect

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
# ``auto``: Whisper decodes in float16, as mlx-audio and openai-whisper run it on a GPU
# (the server asks for float32 itself on the CPU)
AUTO_DTYPE = mx.float16


def check_files(path: Path, config: dict) -> None:
    """Raise ``StartupError`` when the checkpoint lacks its processor files or weights."""
    missing = detect.missing_files(path)
    if missing:
        raise StartupError(
            f"the Whisper checkpoint {path} has no {'/'.join(missing)}, which mlx-audio's "
            f"Whisper needs (weights-only MLX repos lack them): copy them from "
            f"{detect.origin(config)}")
    if not detect.has_weights(path):
        raise StartupError(f"the Whisper checkpoint {path} has no *.safetensors or *.npz "
                           "weights")


def build(path: Path, config: dict, dtype: mx.Dtype, lazy: bool = False) -> Model:
    """mlx-audio's Whisper ``Model`` with the checkpoint's weights, in ``dtype``."""
    model = Model(ModelDimensions.from_dict(config), dtype=dtype)
    weights = model.sanitize(load_weights(path))
    apply_quantization(model, config, weights, getattr(model, "model_quant_predicate", None))
    missing = sorted(k for k, _ in tree_flatten(model.parameters()) if k not in weights)
    if missing:
        raise StartupError(f"the Whisper checkpoint {path} lacks {len(missing)} of the "
                           f"model's weights (first: {missing[0]})")
    model.load_weights(list(weights.items()), strict=False)
    if not lazy:
        mx.eval(model.parameters())
    model.eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = Model.post_load_hook(model, path)
    if getattr(model, "_processor", None) is None:
        said = "; ".join(str(w.message) for w in caught) or "no reason given"
        raise StartupError(f"the Whisper checkpoint {path}: its processor did not load: "
                           f"{said.splitlines()[0]}")
    return model


def load(path: Path, options: LoadOptions) -> Loaded:
    """The checkpoint ready for ``transcribe``."""
    path = Path(path)
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    check_files(path, config)
    dtype = DTYPES.get(options.dtype, AUTO_DTYPE)
    model = build(path, config, dtype, lazy=options.lazy)
    return Loaded(model=model, tasks=("transcribe",), config=config,
                  processor=model._processor)

"""Load a Kokoro checkpoint: the model through mlx-audio's own loader (its ``sanitize``
maps the converted PyTorch names and layouts, its quantization config is applied), and the
voice packs' files from ``voices/``, read when a voice is first spoken.

The loader is given ``model_type="kokoro"`` so that it never guesses the architecture from
the folder's name (Kokoro's config may not name it), and a local ``Path`` so that it never
reaches the Hub.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxcel.families.api import Loaded, LoadOptions

from mlxcel_family_kokoro import detect

SAMPLE_RATE = 24000


@dataclass
class KokoroCheckpoint:
    """What the ``speak`` runner drives: mlx-audio's ``Model``, the voice packs' files and
    the output rate."""

    module: Any
    path: Path
    voices: dict[str, Path] = field(default_factory=dict)
    sample_rate: int = SAMPLE_RATE


def load(path: Path, options: LoadOptions) -> Loaded:
    import mlx.core as mx
    from mlx_audio.tts.utils import load_model

    path = Path(path)
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    module = load_model(path, lazy=options.lazy, strict=True, model_type=detect.MODEL_TYPE)
    dtype = {"float32": mx.float32, "float16": mx.float16,
             "bfloat16": mx.bfloat16}.get(options.dtype)
    if dtype is not None:
        module.set_dtype(dtype)
    module.eval()
    model = KokoroCheckpoint(module=module, path=path, voices=detect.voice_files(path),
                             sample_rate=int(config.get("sample_rate") or SAMPLE_RATE))
    return Loaded(model=model, tasks=("speak",), config=config)

"""A tiny target checkpoint that carries its own MTP heads (Qwen3.5's ``mtp.*``).

Built from one of mlxcel's tiny checkpoints (``mlxcel.testing.checkpoint``): its files,
with the seeded weights of mlx-vlm's own head class (``Qwen3_5MTPDraftModel``) added
under ``mtp.`` to its safetensors, as an MLX conversion that keeps the heads writes them
(the norms already in MLX's convention), and the head count in its config.json.
"""

from __future__ import annotations

import json
import pathlib
import shutil


def with_mtp_heads(path: pathlib.Path, target: pathlib.Path, layers: int = 1,
                   seed: int = 3) -> pathlib.Path:
    """Write ``target``'s checkpoint plus ``layers`` random MTP layers into ``path``."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.speculative.drafters import qwen3_5_mtp

    path.mkdir(parents=True, exist_ok=True)
    for file in target.iterdir():
        shutil.copy(file, path / file.name)
    config = {**json.loads((target / "config.json").read_text()),
              "mtp_num_hidden_layers": layers}
    mx.random.seed(seed)
    head = qwen3_5_mtp.Model(qwen3_5_mtp.ModelConfig.from_dict({"text_config": config}))
    head.set_dtype(mx.float32)
    weights = dict(mx.load(str(target / "model.safetensors")))
    weights.update({f"mtp.{k}": v for k, v in tree_flatten(head.parameters())})
    mx.save_safetensors(str(path / "model.safetensors"), dict(sorted(weights.items())),
                        metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(dict(sorted(config.items())), indent=2))
    return path

"""Which checkpoints this family owns: read from the checkpoint's files only (``config.json``
and the names in its folder), with no MLX import and no weight read, since it runs in the
CLI before the server forks."""

from __future__ import annotations

from pathlib import Path

# the fields of Kokoro's own config.json that no other model's has together
KOKORO_FIELDS = ("istftnet", "plbert", "vocab")
MODEL_TYPE = "kokoro"
MLX_CONVERSION = "mlx-community/Kokoro-82M-bf16"


def is_kokoro_config(config: dict) -> bool:
    """Kokoro's config: no ``model_type`` or ``kokoro``, and its own fields."""
    return config.get("model_type") in (None, MODEL_TYPE) and \
        all(isinstance(config.get(f), dict) for f in KOKORO_FIELDS)


def voice_files(path: Path) -> dict[str, Path]:
    """The voice packs in ``voices/``: name -> ``<name>.safetensors``, sorted by name."""
    folder = Path(path) / "voices"
    if not folder.is_dir():
        return {}
    return {f.stem: f for f in sorted(folder.glob("*.safetensors")) if f.is_file()}


def check(path: Path, config: dict) -> bool | str:
    """A Kokoro checkpoint mlx-audio loads: safetensors weights and voice packs. The
    PyTorch original (``kokoro-v1_0.pth``, ``voices/*.pt``) is declined with where to
    find the MLX conversion, since loading it would need torch."""
    if not is_kokoro_config(config):
        model_type = config.get("model_type")
        return f"model_type '{model_type}' is not Kokoro's" if model_type is not None \
            else "not a Kokoro config (no istftnet, plbert and vocab)"
    path = Path(path)
    if not any(path.glob("*.safetensors")):
        torch_files = sorted(p.name for p in path.glob("*.pth"))
        if torch_files:
            return (f"Kokoro in PyTorch layout ({torch_files[0]}); serve an MLX conversion "
                    f"such as {MLX_CONVERSION}")
        return "a Kokoro config with no .safetensors weights beside it"
    if not voice_files(path):
        if any((path / "voices").glob("*.pt")):
            return (f"Kokoro's voices are PyTorch .pt packs; serve an MLX conversion such as "
                    f"{MLX_CONVERSION} (voices/*.safetensors)")
        return "a Kokoro checkpoint with no voice packs (voices/*.safetensors)"
    return True

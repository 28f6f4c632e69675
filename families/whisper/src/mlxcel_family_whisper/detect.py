"""Which checkpoints this family owns, read from ``config.json`` and the file names only
(no MLX import, no weight read), since it runs in the CLI before the server forks.

A Whisper checkpoint comes in two layouts, both with ``model_type`` ``whisper``:
transformers' (openai/whisper-*: ``d_model``, ``encoder_layers``, ``num_mel_bins``, ...,
weights in ``model.safetensors``) and MLX's (mlx-community/whisper-*: ``n_mels``,
``n_audio_ctx``, ..., weights in ``weights.safetensors`` or ``weights.npz``). mlx-audio
reads both; its decoding needs the processor files too, which weights-only MLX repos lack
(mlx-whisper brings its own tokenizer), so ``missing_files`` names them for the loader.
"""

from __future__ import annotations

from pathlib import Path

HF_FIELDS = ("d_model", "encoder_layers", "decoder_layers", "num_mel_bins", "vocab_size")
MLX_FIELDS = ("n_mels", "n_audio_ctx", "n_audio_state", "n_audio_layer", "n_vocab",
              "n_text_ctx", "n_text_layer")
# (encoder layers, width) -> the openai checkpoint of that size
SIZES = {(4, 384): "tiny", (6, 512): "base", (12, 768): "small", (24, 1024): "medium",
         (32, 1280): "large"}


def layout(config: dict) -> str | None:
    """``hf``, ``mlx``, or None when the config has neither layout's fields."""
    if all(f in config for f in MLX_FIELDS):
        return "mlx"
    if all(f in config for f in HF_FIELDS):
        return "hf"
    return None


def check(path: Path, config: dict) -> bool | str:
    """A ``whisper`` config in either layout."""
    if config.get("model_type") != "whisper":
        return f"model_type '{config.get('model_type')}' is not Whisper"
    if layout(config) is None:
        return ("a whisper config.json with neither transformers' fields (d_model, "
                "encoder_layers, ...) nor MLX's (n_mels, n_audio_ctx, ...)")
    return True


def dims(config: dict) -> dict[str, int]:
    """The sizes that name a Whisper checkpoint, from either layout."""
    if layout(config) == "mlx":
        return {"layers": config["n_audio_layer"], "width": config["n_audio_state"],
                "mels": config["n_mels"], "vocab": config["n_vocab"],
                "decoder_layers": config["n_text_layer"]}
    return {"layers": config.get("encoder_layers", 0), "width": config.get("d_model", 0),
            "mels": config.get("num_mel_bins", 80), "vocab": config.get("vocab_size", 0),
            "decoder_layers": config.get("decoder_layers", 0)}


def origin(config: dict) -> str:
    """The openai repo whose processor files fit this checkpoint: its size, ``.en`` for an
    English-only vocabulary, ``-v3`` / ``-v3-turbo`` for 128 mel bins (4 decoder layers
    for turbo); ``openai/whisper-<size>`` when the sizes are no openai checkpoint's."""
    d = dims(config)
    size = SIZES.get((d["layers"], d["width"]))
    if size is None:
        return "openai/whisper-<size>"
    if size == "large":
        if d["mels"] == 128:
            size = "large-v3-turbo" if d["decoder_layers"] == 4 else "large-v3"
        else:
            size = "large-v2"
    english = 0 < d["vocab"] < 51865
    return f"openai/whisper-{size}{'.en' if english and size != 'large-v2' else ''}"


def missing_files(path: Path) -> list[str]:
    """The processor files mlx-audio's Whisper needs that ``path`` lacks: the feature
    extractor's ``preprocessor_config.json`` and a tokenizer (``tokenizer.json``, or
    ``vocab.json`` with ``merges.txt``)."""
    path = Path(path)
    missing = []
    if not (path / "tokenizer.json").is_file() and not all(
            (path / f).is_file() for f in ("vocab.json", "merges.txt")):
        missing.append("tokenizer.json")
    if not (path / "preprocessor_config.json").is_file():
        missing.append("preprocessor_config.json")
    return missing


def has_weights(path: Path) -> bool:
    path = Path(path)
    return any(path.glob("*.safetensors")) or any(path.glob("*.npz"))

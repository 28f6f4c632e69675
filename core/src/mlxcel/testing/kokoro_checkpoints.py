"""A tiny random-weight Kokoro-82M checkpoint, as the MLX conversions on the Hub have it.

``build_kokoro(out)`` writes ``config.json`` under Kokoro's own field names (``istftnet``,
``plbert``, ``vocab``, ``n_token``, ...), ``kokoro-v1_0.safetensors`` in float32 under
the PyTorch key names and layouts the conversions keep (LSTM ``weight_ih_l0``, conv
``weight_v`` as ``[out, in, k]``, the text encoder's LayerNorm ``gamma``/``beta``), so
that mlx-audio's loader runs its own ``sanitize`` on it as on the real file, and voice
packs ``voices/<name>.safetensors`` (``{"voice": [510, 1, 256]}``, one style row per
phoneme count). The weights are mlx-audio's ``Model`` with seeded random parameters;
the builder loads the file back through mlx-audio's loader and checks every parameter
round-trips, so a layout mistake fails here rather than in a test of the family.

Why it is ~224 MB: Kokoro's decoder has fixed widths (1024 and 512 channels, its
``asr_res`` reads 512: ``hidden_dim`` must be 512) whatever the config says, so only the
ALBERT, the predictor's depth and the generator's resblocks shrink. Build it once per
session (``cached_kokoro_checkpoint``) in a temp or cache dir; never commit it.

Synthesis is what is slow on a CPU (MLX's dilated and transposed convolutions), so the
defaults make little audio: ``max_dur`` 2 (a phoneme lasts one or two frames), and the
generator upsamples 2x2 instead of 10x6 with undilated resblocks, giving 40 samples a
frame instead of 600; a few phonemes take about half a second on 2 cores. The real
shapes are the overrides ``KOKORO_82M`` (``build_kokoro(out, **KOKORO_82M)``), for a
bench.

mlx-audio is not a dependency of core: it is imported inside the functions, so only a
distribution that has it (``mlxcel-family-kokoro``) calls them.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Any

from . import checkpoint as _ckpt

KOKORO_BUILDER_VERSION = 1
VOICES = ("af_heart", "bf_emma", "ff_siwis")
WEIGHTS_FILE = "kokoro-v1_0.safetensors"
STYLE_ROWS = 510  # a pack has one style per phoneme count (1..510)
# Kokoro's phoneme alphabet: punctuation, Latin letters (misaki's diphthong capitals),
# the IPA symbols misaki and espeak-ng give, and misaki's own (ᵊ, ʣ, ʦ, ʧ, ʤ)
SYMBOLS = (';:,.!?¡¿—…"«»“”() \u0303' + "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
           + "ɑɐɒæβɔɕçðʤəɚɛɜɟɡɥɨɪʝɯɰŋɳɲɴøɸθœɹɾɻʁɽʂʃʧʊʋʌɣɤχʎʒʔˈˌːʰʲ↓→↗↘ᵻᵊʣʦ")


def kokoro_config(**overrides: Any) -> dict[str, Any]:
    """Kokoro-82M's ``config.json`` shrunk where its model class allows."""
    vocab = {s: i + 1 for i, s in enumerate(dict.fromkeys(SYMBOLS))}
    config = {
        "model_type": "kokoro",
        "istftnet": {"upsample_kernel_sizes": [4, 4], "upsample_rates": [2, 2],
                     "gen_istft_hop_size": 5, "gen_istft_n_fft": 20,
                     "resblock_dilation_sizes": [[1, 1, 1]], "resblock_kernel_sizes": [3],
                     "upsample_initial_channel": 512},
        "dim_in": 64, "dropout": 0.2, "hidden_dim": 512, "max_conv_dim": 512, "max_dur": 2,
        "multispeaker": True, "n_layer": 1, "n_mels": 80, "n_token": 178, "style_dim": 128,
        "text_encoder_kernel_size": 3,
        "plbert": {"hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64,
                   "max_position_embeddings": 512, "num_hidden_layers": 1, "dropout": 0.1},
        "vocab": vocab,
    }
    config.update(overrides)
    if max(config["vocab"].values()) >= config["n_token"]:
        raise ValueError("n_token must exceed every vocab id")
    return config


# the overrides that give Kokoro-82M's own shapes (82M parameters), for a bench
KOKORO_82M = {
    "istftnet": {"upsample_kernel_sizes": [20, 12], "upsample_rates": [10, 6],
                 "gen_istft_hop_size": 5, "gen_istft_n_fft": 20,
                 "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
                 "resblock_kernel_sizes": [3, 7, 11], "upsample_initial_channel": 512},
    "max_dur": 50, "n_layer": 3, "text_encoder_kernel_size": 5,
    "plbert": {"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 2048,
               "max_position_embeddings": 512, "num_hidden_layers": 12, "dropout": 0.1},
}

_LSTM = {"Wx_forward": "weight_ih_l0", "Wh_forward": "weight_hh_l0",
         "bias_ih_forward": "bias_ih_l0", "bias_hh_forward": "bias_hh_l0",
         "Wx_backward": "weight_ih_l0_reverse", "Wh_backward": "weight_hh_l0_reverse",
         "bias_ih_backward": "bias_ih_l0_reverse", "bias_hh_backward": "bias_hh_l0_reverse"}


def _to_file(key: str, value: Any) -> tuple[str, Any]:
    """One MLX parameter as the converted checkpoint stores it: the inverse of mlx-audio's
    ``Model.sanitize`` / ``Decoder.sanitize`` for that key."""
    base, _, leaf = key.rpartition(".")
    if key.startswith(("text_encoder", "predictor")) and leaf in _LSTM:
        return f"{base}.{_LSTM[leaf]}", value
    if key.startswith("text_encoder.cnn.") and base.endswith(".1") and leaf in ("weight", "bias"):
        return f"{base}.{'gamma' if leaf == 'weight' else 'beta'}", value  # Kokoro's LayerNorm
    if leaf == "weight_v" or key.endswith(("F0_proj.weight", "N_proj.weight")) or \
            (key.startswith("decoder") and "noise_convs" in key and leaf == "weight"):
        return key, value.transpose(0, 2, 1)  # PyTorch's [out, in, k]
    return key, value


def _randomized(key: str, value: Any) -> Any:
    """mlx-audio's ``ConvWeighted`` starts every direction ``weight_v`` at ones (each
    output channel alike): draw them at random instead. With ``weight_g`` 1 a conv keeps
    its input's scale, so the activations stay finite through the decoder's stack."""
    import mlx.core as mx

    if key.endswith("weight_v"):
        return mx.random.normal(value.shape)
    return value


def _voice(seed: int) -> Any:
    import mlx.core as mx

    key = mx.random.key(seed)
    base = mx.random.normal((1, 1, 256), key=key) * 0.3
    drift = mx.random.normal((STYLE_ROWS, 1, 256), key=mx.random.split(key)[0]) * 0.02
    return (base + drift).astype(mx.float32)


def build_kokoro(path: str | os.PathLike, voices: tuple[str, ...] = VOICES, seed: int = 0,
                 **overrides: Any) -> pathlib.Path:
    """Write the checkpoint into ``path`` and return it (see the module docstring)."""
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten
    from mlx_audio.tts.models.kokoro import Model, ModelConfig

    out = pathlib.Path(path)
    (out / "voices").mkdir(parents=True, exist_ok=True)
    config = kokoro_config(**overrides)
    mx.random.seed(seed)
    model = Model(ModelConfig.from_dict(config))
    params = {k: _randomized(k, v) for k, v in tree_flatten(model.parameters())}
    weights = dict(_to_file(k, v.astype(mx.float32)) for k, v in params.items())
    mx.save_safetensors(str(out / WEIGHTS_FILE), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                                     encoding="utf-8")
    for i, name in enumerate(voices):
        mx.save_safetensors(str(out / "voices" / f"{name}.safetensors"),
                            {"voice": _voice(seed + 1 + i)})
    from mlx_audio.tts.utils import load_model

    loaded = dict(tree_flatten(load_model(out, model_type="kokoro").parameters()))
    bad = [k for k, v in params.items()
           if k not in loaded or not np.array_equal(np.array(v), np.array(loaded[k]))]
    if bad or set(loaded) != set(params):
        raise AssertionError(f"the Kokoro layout does not round-trip: {bad[:5]}")
    return out


def cached_kokoro_checkpoint(cache_dir: str | os.PathLike | None = None,
                             **kw: Any) -> pathlib.Path:
    """``build_kokoro(**kw)`` once under the checkpoint cache; safe across processes."""
    config = kokoro_config(**{k: v for k, v in kw.items() if k not in ("voices", "seed")})
    key = json.dumps({"v": KOKORO_BUILDER_VERSION, "config": config, **kw}, sort_keys=True,
                     default=str)
    root = pathlib.Path(cache_dir) if cache_dir is not None else _ckpt.default_cache_dir()
    final = root / f"kokoro-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    return _ckpt.build_once(final, lambda tmp: build_kokoro(tmp, **kw))

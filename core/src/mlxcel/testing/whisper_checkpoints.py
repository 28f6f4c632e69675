"""Tiny random-weight Whisper checkpoints, as the Hub has them, built offline.

``build_whisper(out, layout)`` writes a checkpoint mlx-audio loads:

- ``layout="hf"`` (openai/whisper-*): ``config.json`` under transformers' field names
  (openai/whisper-tiny's, with tiny sizes) and ``model.safetensors`` under
  ``WhisperForConditionalGeneration``'s key names and layouts (conv weights
  ``[out, in, kernel]``, the encoder's sinusoid positions stored);
- ``layout="mlx"`` (mlx-community/whisper-*): ``config.json`` with ``n_mels``,
  ``n_audio_ctx``, ... and ``weights.safetensors`` (or ``weights.npz``) under mlx-audio's
  own key names.

The weights are mlx-audio's ``Model`` with seeded random parameters (its decoder's
positions, zeros at initialisation, get seeded noise), saved through the inverse of its
``sanitize``, which the builder checks maps them back. The vocabulary has Whisper's id
layout, so language detection, task tokens and timestamps work as on a real checkpoint:
a byte-level BPE trained on the bundled corpus, padded with filler words to 50257 base
tokens (50256 for an English-only ``.en`` model), then ``<|endoftext|>``,
``<|startoftranscript|>``, the 99 language tokens, ``<|translate|>``, ``<|transcribe|>``,
``<|startoflm|>``, ``<|startofprev|>``, ``<|nocaptions|>``, ``<|notimestamps|>`` and the
1501 timestamps ``<|0.00|>`` .. ``<|30.00|>``. ``processor=False`` leaves out the
tokenizer and ``preprocessor_config.json``, as weights-only MLX repos do.

The encoder keeps Whisper's 1500 positions (a 30 s window of 3000 mel frames); the other
sizes are tiny, and the text context is short so a random decoder stops soon.

mlx-audio is not a dependency of core: it is imported inside the functions, so only a
distribution that has it (``mlxcel-family-whisper``) calls them.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import pathlib
from typing import Any

from . import checkpoint as _ckpt
from . import tokenizer as _tok

WHISPER_BUILDER_VERSION = 1
LAYOUTS = ("hf", "mlx")
N_AUDIO_CTX = 1500  # 3000 mel frames after the stride-2 conv: fixed by the audio window
N_TIMESTAMPS = 1501
TRAINED_BPE = 1024
SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
# mlx-audio's name -> transformers' name, the inverse of ``Model.sanitize``'s key map
MLX_TO_HF = [
    ("encoder.ln_post.", "encoder.layer_norm."), ("decoder.ln.", "decoder.layer_norm."),
    ("encoder.blocks.", "encoder.layers."), ("decoder.blocks.", "decoder.layers."),
    (".cross_attn_ln.", ".encoder_attn_layer_norm."), (".attn_ln.", ".self_attn_layer_norm."),
    (".mlp_ln.", ".final_layer_norm."), (".mlp1.", ".fc1."), (".mlp2.", ".fc2."),
    (".cross_attn.query.", ".encoder_attn.q_proj."), (".cross_attn.key.", ".encoder_attn.k_proj."),
    (".cross_attn.value.", ".encoder_attn.v_proj."), (".cross_attn.out.", ".encoder_attn.out_proj."),
    (".attn.query.", ".self_attn.q_proj."), (".attn.key.", ".self_attn.k_proj."),
    (".attn.value.", ".self_attn.v_proj."), (".attn.out.", ".self_attn.out_proj."),
    ("decoder.token_embedding.", "decoder.embed_tokens."),
    ("decoder.positional_embedding", "decoder.embed_positions.weight"),
]


def _write(path: pathlib.Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def specials() -> list[str]:
    """Whisper's special tokens after the base vocabulary, in id order."""
    from mlx_audio.stt.models.whisper.tokenizer import LANGUAGES

    languages = [f"<|{code}|>" for code in list(LANGUAGES)[:99]]
    return ["<|endoftext|>", "<|startoftranscript|>", *languages, "<|translate|>",
            "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>",
            "<|notimestamps|>"]


def base_size(multilingual: bool) -> int:
    """Regular tokens before ``<|endoftext|>``: 50257 multilingual, 50256 English-only."""
    return 50257 if multilingual else 50256


def vocab_size(multilingual: bool) -> int:
    return base_size(multilingual) + len(specials()) + N_TIMESTAMPS


def _fillers(taken: set[str]):
    """Distinct byte-level words (``Ġ`` + syllables) not already in the vocabulary."""
    for n in itertools.count(2):
        for parts in itertools.product(SYLLABLES, repeat=n):
            word = "\u0120" + "".join(parts)
            if word not in taken:
                yield word


def _tokenizer(out: pathlib.Path, multilingual: bool) -> dict[str, int]:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json; the ids of the
    special tokens."""
    from tokenizers import AddedToken, Tokenizer

    trained = json.loads(_tok._train_bpe(TRAINED_BPE).to_str())
    vocab: dict[str, int] = trained["model"]["vocab"]
    fill = _fillers(set(vocab))
    while len(vocab) < base_size(multilingual):
        vocab[next(fill)] = len(vocab)
    tok = Tokenizer.from_str(json.dumps(trained))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in specials()])
    stamps = [f"<|{i * 0.02:.2f}|>" for i in range(N_TIMESTAMPS)]
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in stamps])
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size(multilingual):
        raise RuntimeError("the Whisper vocabulary does not have its id layout")
    tok.save(str(out / "tokenizer.json"))
    eot = "<|endoftext|>"
    _write(out / "tokenizer_config.json", {
        "add_prefix_space": False, "bos_token": eot, "eos_token": eot, "pad_token": eot,
        "unk_token": eot, "clean_up_tokenization_spaces": False, "errors": "replace",
        "model_max_length": 1024, "processor_class": "WhisperProcessor",
        "tokenizer_class": "WhisperTokenizer"})
    _write(out / "special_tokens_map.json", {
        "additional_special_tokens": specials()[1:], "bos_token": eot,
        "eos_token": eot, "pad_token": eot, "unk_token": eot})
    return {t: tok.token_to_id(t) for t in specials()}


def _preprocessor(out: pathlib.Path, n_mels: int) -> None:
    _write(out / "preprocessor_config.json", {
        "chunk_length": 30, "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": n_mels, "hop_length": 160, "n_fft": 400, "n_samples": 480000,
        "nb_max_frames": 3000, "padding_side": "right", "padding_value": 0.0,
        "processor_class": "WhisperProcessor", "return_attention_mask": False,
        "sampling_rate": 16000})


def hf_config(multilingual: bool = True, d_model: int = 32, layers: int = 2, heads: int = 2,
              text_ctx: int = 32, n_mels: int = 80,
              decoder_layers: int | None = None) -> dict[str, Any]:
    """openai/whisper-tiny's ``config.json`` fields with tiny sizes (``layers`` encoder
    blocks, ``decoder_layers`` decoder blocks, ``layers`` unless given)."""
    eot = base_size(multilingual)
    decoder_layers = layers if decoder_layers is None else decoder_layers
    return {
        "_name_or_path": "tiny/whisper-tiny" + ("" if multilingual else ".en"),
        "activation_dropout": 0.0, "activation_function": "gelu",
        "architectures": ["WhisperForConditionalGeneration"], "attention_dropout": 0.0,
        "begin_suppress_tokens": [220, eot], "bos_token_id": eot, "d_model": d_model,
        "decoder_attention_heads": heads, "decoder_ffn_dim": 4 * d_model,
        "decoder_layerdrop": 0.0, "decoder_layers": decoder_layers,
        "decoder_start_token_id": eot + 1, "dropout": 0.0, "encoder_attention_heads": heads,
        "encoder_ffn_dim": 4 * d_model, "encoder_layerdrop": 0.0, "encoder_layers": layers,
        "eos_token_id": eot, "init_std": 0.02, "is_encoder_decoder": True,
        "max_length": text_ctx, "max_source_positions": N_AUDIO_CTX,
        "max_target_positions": text_ctx, "median_filter_width": 7, "model_type": "whisper",
        "num_hidden_layers": layers, "num_mel_bins": n_mels, "pad_token_id": eot,
        "scale_embedding": False, "torch_dtype": "float32", "use_cache": True,
        "vocab_size": vocab_size(multilingual)}


def mlx_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The same model under the MLX layout's field names (mlx-community's config.json)."""
    from mlx_audio.stt.models.whisper.whisper import ModelDimensions

    dims = ModelDimensions.from_dict(hf)
    return {**{k: getattr(dims, k) for k in dims.__dataclass_fields__}, "model_type": "whisper"}


def init_model(hf: dict[str, Any], seed: int = 0) -> Any:
    """mlx-audio's Whisper ``Model`` for ``hf`` (a config.json) in float32 with the
    builder's seeded random weights; ``build_whisper`` saves exactly this model."""
    import mlx.core as mx
    from mlx_audio.stt.models.whisper.whisper import Model, ModelDimensions

    mx.random.seed(seed)
    model = Model(ModelDimensions.from_dict(hf), dtype=mx.float32)
    pos = model.decoder.positional_embedding
    model.decoder.positional_embedding = 0.02 * mx.random.normal(pos.shape)
    mx.eval(model.parameters())
    return model


def hf_weights(model: Any) -> dict[str, Any]:
    """``model``'s parameters under transformers' names and layouts."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_audio.stt.models.whisper.whisper import sinusoids

    out = {}
    for key, value in tree_flatten(model.parameters()):
        for old, new in MLX_TO_HF:
            key = key.replace(old, new)
        if key.endswith(("conv1.weight", "conv2.weight")):
            value = value.transpose(0, 2, 1)
        out[f"model.{key}"] = mx.contiguous(value)
    dims = model.dims
    out["model.encoder.embed_positions.weight"] = sinusoids(dims.n_audio_ctx, dims.n_audio_state)
    return out


def build_whisper(path: str | os.PathLike, layout: str = "hf", multilingual: bool = True,
                  processor: bool = True, weights: str = "safetensors", seed: int = 0,
                  **dims: Any) -> pathlib.Path:
    """A tiny Whisper checkpoint in ``layout`` (``hf`` or ``mlx``; see the module
    docstring). ``weights``: ``safetensors`` or ``npz`` (the MLX layout's older files);
    ``dims``: ``hf_config``'s size arguments."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    if layout not in LAYOUTS:
        raise ValueError(f"unknown Whisper layout {layout!r}; expected one of {LAYOUTS}")
    out = pathlib.Path(path)
    out.mkdir(parents=True, exist_ok=True)
    hf = hf_config(multilingual, **dims)
    model = init_model(hf, seed)
    params = dict(tree_flatten(model.parameters()))
    if layout == "hf":
        saved = hf_weights(model)
        back = model.sanitize(dict(saved))
        if set(back) != set(params) or any(not mx.array_equal(back[k], v)
                                           for k, v in params.items()):
            raise RuntimeError("the HF key names do not map back through mlx-audio's sanitize")
        mx.save_safetensors(str(out / "model.safetensors"), saved, metadata={"format": "pt"})
        _write(out / "config.json", hf)
        _write(out / "generation_config.json", {
            "alignment_heads": [[hf["decoder_layers"] - 1, h]
                                for h in range(hf["decoder_attention_heads"])],
            "bos_token_id": hf["bos_token_id"], "eos_token_id": hf["eos_token_id"],
            "decoder_start_token_id": hf["decoder_start_token_id"],
            "is_multilingual": multilingual, "max_length": hf["max_target_positions"],
            "no_timestamps_token_id": vocab_size(multilingual) - N_TIMESTAMPS - 1,
            "pad_token_id": hf["pad_token_id"]})
    elif weights == "npz":
        mx.savez(str(out / "weights.npz"), **params)
        _write(out / "config.json", mlx_config(hf))
    else:
        mx.save_safetensors(str(out / "weights.safetensors"), params)
        _write(out / "config.json", mlx_config(hf))
    if processor:
        _tokenizer(out, multilingual)
        _preprocessor(out, hf["num_mel_bins"])
    return out


def cached_whisper_checkpoint(layout: str = "hf", multilingual: bool = True,
                              cache_dir: str | os.PathLike | None = None,
                              **kw: Any) -> pathlib.Path:
    """Build once and return ``build_whisper(layout=, multilingual=, **kw)`` under the
    checkpoint cache (``cache_dir``, else ``mlxcel.testing.default_cache_dir()``); safe
    across processes."""
    corpus = hashlib.sha256(_tok.corpus_text().encode()).hexdigest()
    key = json.dumps({"whisper": layout, "multilingual": multilingual, "corpus": corpus,
                      "v": WHISPER_BUILDER_VERSION, **kw}, sort_keys=True)
    root = pathlib.Path(cache_dir) if cache_dir is not None else _ckpt.default_cache_dir()
    final = root / f"whisper-{layout}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    return _ckpt.build_once(final, lambda tmp: build_whisper(
        tmp, layout=layout, multilingual=multilingual, **kw))

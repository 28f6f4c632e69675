"""Tiny random-weight vision-language checkpoints, as the Hub has them, built offline.

``build_vlm(out, shape)`` writes a checkpoint of ``shape`` (``SHAPES``: ``qwen2_vl``, the
M-RoPE case, ``qwen2_5_vl``, ``gemma3``, a SigLIP tower, and ``gemma4``; ``MORE_SHAPES``:
``llava_1_5``, ``smolvlm`` and ``mistral3``, whose processors expand images in the text) that
``mlx_vlm.utils.load`` loads offline and serves images with: ``config.json`` with a
``text_config`` and a ``vision_config`` under the model's own field names; safetensors
under the checkpoint's key names and layouts (mlx-vlm's model class with seeded random
weights, saved through the inverse of its ``sanitize``); ``tokenizer.json`` (a byte-level
BPE trained on the bundled corpus) with the model's special tokens, image tokens included;
``tokenizer_config.json`` naming them as the real one does; the model's own chat template
(``vlm_templates/``); and the real processor files (``preprocessor_config.json``,
``processor_config.json``, ``chat_template.json`` or ``.jinja``) with tiny image sizes, so
the processor turns a 56x56 image into a handful of image tokens (``vlm_recipes``).

The tokenizer class is ``PreTrainedTokenizerFast``, not the model's (``Qwen2Tokenizer``,
``GemmaTokenizer``): those rebuild their own pre-tokenizer in transformers 5 and would
split text unlike the trained ``tokenizer.json``.

mlx-vlm is not a dependency of core: it is imported inside the functions, so only a
distribution that has it (``mlxcel-family-vlm``) calls them.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from importlib import resources
from typing import Any

from . import checkpoint as _ckpt
from . import tokenizer as _tok
from .vlm_recipes import MORE_SHAPES, RECIPES, SHAPES, Dims, Recipe

__all__ = ["MORE_SHAPES", "SHAPES", "build_vlm", "cached_vlm_checkpoint", "chat_template_of",
           "init_model"]
VLM_BUILDER_VERSION = 1
NOISE = 0.02  # added to every parameter, so that no two weights of a kind are alike


def _write(path: pathlib.Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _recipe(shape: str) -> Recipe:
    if shape not in RECIPES:
        raise ValueError(f"unknown VLM shape {shape!r}; expected one of {tuple(RECIPES)}")
    return RECIPES[shape]


def chat_template_of(shape: str) -> str:
    """The model's own chat template, as the checkpoint of ``shape`` carries it."""
    name = _recipe(shape).template
    return resources.files(__package__).joinpath("vlm_templates", name).read_text("utf-8")


def _tokenizer(out: pathlib.Path, recipe: Recipe, vocab: int, template: str) -> dict[str, int]:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json; the special
    tokens' ids."""
    base = vocab - len(recipe.specials)
    if base < _tok.BYTE_ALPHABET_SIZE:
        least = _tok.BYTE_ALPHABET_SIZE + len(recipe.specials)
        raise ValueError(f"vocab_size must be at least {least}")
    tok = _tok._train_bpe(base)
    _tok._add_tokens(tok, [(t, True) for t in recipe.specials])
    missing = vocab - tok.get_vocab_size(with_added_tokens=True)
    _tok._add_tokens(tok, [(f"<|reserved_{i}|>", True) for i in range(missing)])
    ids = {t: tok.token_to_id(t) for t in recipe.specials}
    tok.post_processor = _tok._post_processor(recipe.bos, ids.get(recipe.bos or ""))
    tok.save(str(out / "tokenizer.json"))
    added = {str(i): {"content": t.content, "lstrip": False, "normalized": False,
                      "rstrip": False, "single_word": False, "special": True}
             for i, t in sorted(tok.get_added_tokens_decoder().items())}
    _write(out / "tokenizer_config.json", {
        "add_bos_token": recipe.bos is not None, "add_eos_token": False,
        "added_tokens_decoder": added, "bos_token": recipe.bos, "eos_token": recipe.eos[0],
        "pad_token": recipe.pad, "unk_token": "<unk>" if "<unk>" in ids else None,
        "chat_template": template, "clean_up_tokenization_spaces": False,
        "errors": "replace", "model_max_length": 32768, "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast", **recipe.tokenizer})
    named = {"eos_token": recipe.eos[0], "pad_token": recipe.pad}
    _write(out / "special_tokens_map.json", {**named, **({"bos_token": recipe.bos}
                                                        if recipe.bos else {})})
    return ids


def _model_class(config: dict[str, Any]) -> Any:
    from mlx_vlm.utils import get_model_and_args

    return get_model_and_args(config)[0]


def init_model(config: dict[str, Any], seed: int = 0, dtype: str = "float32") -> Any:
    """mlx-vlm's model for ``config`` (a checkpoint's config.json) with the builder's
    seeded random weights: its own initialisation, each parameter shifted by seeded noise,
    the output head set to the embeddings when the checkpoint ties them. ``build_vlm``
    saves exactly this model."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_vlm.utils import update_module_configs

    config = json.loads(json.dumps(config))  # mlx-vlm's config classes edit their input
    model_class = _model_class(config)
    for part in ("text_config", "vision_config", "audio_config"):
        config.setdefault(part, {})
    model_config = model_class.ModelConfig.from_dict(config)
    model_config = update_module_configs(
        model_config, model_class, config, ["text", "vision", "perceiver", "projector", "audio"])
    mx.random.seed(seed)
    model = model_class.Model(model_config)
    params = tree_flatten(model.parameters())
    noisy = [(k, v + NOISE * mx.random.normal(v.shape)) for k, v in params]
    model.update(tree_unflatten(noisy))
    language = model.language_model
    if getattr(language, "lm_head", None) is not None and _tied(config):
        language.lm_head.weight = language.model.embed_tokens.weight
    model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    return model


def _tied(config: dict[str, Any]) -> bool:
    text = config.get("text_config") or {}
    return bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", True)))


def _save(model: Any, out: pathlib.Path, recipe: Recipe) -> None:
    """The weights under the checkpoint's names and layouts (PyTorch's for convolutions)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    weights = {}
    for key, value in tree_flatten(model.parameters()):
        name = recipe.to_hub(key)
        if name is None:
            continue
        order = recipe.transposed.get(name)
        weights[name] = value.transpose(*order) if order else value
    mx.eval(list(weights.values()))
    mx.save_safetensors(str(out / "model.safetensors"), dict(sorted(weights.items())),
                        metadata={"format": "pt"})


def build_vlm(path: str | os.PathLike, shape: str = "qwen2_vl", *, seed: int = 0,
              dtype: str = "float32", **dims: Any) -> pathlib.Path:
    """Write a tiny random-weight VLM checkpoint of ``shape`` into ``path`` and return it.
    ``dims``: the text model's sizes (``hidden_size``, ``num_hidden_layers``,
    ``num_attention_heads``, ``num_key_value_heads``, ``intermediate_size``,
    ``vocab_size``); the vision tower's are the recipe's."""
    recipe = _recipe(shape)
    names = {"hidden_size": "hidden", "num_hidden_layers": "layers",
             "num_attention_heads": "heads", "num_key_value_heads": "kv_heads",
             "intermediate_size": "inter", "vocab_size": "vocab"}
    unknown = sorted(set(dims) - set(names))
    if unknown:
        raise ValueError(f"unknown dims {unknown}; expected some of {sorted(names)}")
    d = Dims(**{names[k]: v for k, v in dims.items()})
    out = pathlib.Path(path)
    out.mkdir(parents=True, exist_ok=True)
    template = chat_template_of(shape)
    ids = _tokenizer(out, recipe, d.vocab, template)
    config = {**recipe.config(ids, d), "torch_dtype": dtype}
    _write(out / "config.json", config)
    eos = [ids[t] for t in recipe.eos]
    _write(out / "generation_config.json", {
        "bos_token_id": ids[recipe.bos or recipe.pad], "pad_token_id": ids[recipe.pad],
        "eos_token_id": eos})
    for name, data in recipe.files.items():
        _write(out / name, data)
    if recipe.chat_template_file.endswith(".json"):
        _write(out / recipe.chat_template_file, {"chat_template": template})
    else:
        (out / recipe.chat_template_file).write_text(template, encoding="utf-8")
    _save(init_model(config, seed, dtype), out, recipe)
    return out


def cached_vlm_checkpoint(shape: str = "qwen2_vl", cache_dir: str | os.PathLike | None = None,
                          **kw: Any) -> pathlib.Path:
    """Build once and return ``build_vlm(shape, **kw)`` under the checkpoint cache
    (``cache_dir``, else ``mlxcel.testing.default_cache_dir()``); safe across processes."""
    _recipe(shape)
    digest = {name: hashlib.sha256(text.encode()).hexdigest()
              for name, text in (("template", chat_template_of(shape)),
                                 ("corpus", _tok.corpus_text()))}
    key = json.dumps({"vlm": shape, "v": VLM_BUILDER_VERSION, **digest, **kw}, sort_keys=True)
    root = pathlib.Path(cache_dir) if cache_dir is not None else _ckpt.default_cache_dir()
    final = root / f"vlm-{shape}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    return _ckpt.build_once(final, lambda tmp: build_vlm(tmp, shape, **kw))

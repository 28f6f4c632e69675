"""Build tiny random-weight checkpoints that mlx_lm can load, of every model_type in SHAPES.

mlx, mlx_lm and numpy are imported inside functions so that importing this
module (and the pytest plugin) stays cheap.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import io
import json
import os
import pathlib
import shutil
import tempfile
from typing import TYPE_CHECKING, Any

from . import configs as _cfg
from . import templates as _tpl
from . import tokenizer as _tok

if TYPE_CHECKING:
    import mlx.nn as nn

BUILDER_VERSION = 1
SHAPES = _cfg.SHAPES
DTYPES = ("bfloat16", "float16", "float32")
MAX_POSITION_EMBEDDINGS = _cfg.MAX_POSITION_EMBEDDINGS


def default_cache_dir() -> pathlib.Path:
    """``$MLXCEL_CACHE_DIR`` (or ``~/.cache/mlxcel``) + ``/checkpoints``."""
    base = os.environ.get("MLXCEL_CACHE_DIR") or os.path.join("~", ".cache", "mlxcel")
    return pathlib.Path(base).expanduser() / "checkpoints"


def _init_model(config: dict[str, Any], seed: int, dtype: str) -> nn.Module:
    """Instantiate mlx_lm's own model class with seeded random weights."""
    import mlx.core as mx
    from mlx_lm.utils import _get_classes  # mlx-lm's own model_type -> class mapping

    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    return model


def _lm_head(model: nn.Module, shape: str) -> nn.Module:
    """The output projection of a model built untied; ``ValueError`` when it has none
    (its class ignores ``tie_word_embeddings`` or reads it elsewhere)."""
    head = getattr(model, "lm_head", None)
    if head is None or getattr(head, "weight", None) is None:
        raise ValueError(f"suppress_eos needs an untied lm_head; {shape!r}'s model has none")
    return head


def _suppress_eos(model: nn.Module, eos_ids: list[int]) -> None:
    """Zero the lm_head rows of ``eos_ids`` (the model must be untied). A zero row gives a
    zero logit, also after a final soft-cap (``tanh(0) = 0``, Gemma) or a logit scale."""
    import mlx.core as mx

    weight = model.lm_head.weight
    mask = mx.ones((weight.shape[0], 1), dtype=weight.dtype)
    mask[mx.array(eos_ids)] = 0
    model.lm_head.weight = weight * mask
    mx.eval(model.lm_head.weight)


def _untie(model: nn.Module) -> None:
    """Give a model built untied an lm_head equal to its embeddings (tied look-alike: a
    tied model's output is ``embed_tokens.as_linear``, i.e. ``x @ embed_tokens.weight.T``)."""
    model.lm_head.weight = model.model.embed_tokens.weight


def _group_size(config: dict[str, Any]) -> int:
    hidden = config.get("text_config", config)["hidden_size"]
    return 64 if hidden % 64 == 0 else 32


def _quantize(model: nn.Module, config: dict[str, Any], bits: int) -> dict[str, Any]:
    """Quantize in place with mlx_lm's utility; returns the updated config."""
    from mlx_lm.utils import quantize_model

    with contextlib.redirect_stdout(io.StringIO()):
        _, config = quantize_model(model, config, _group_size(config), bits)
    return config


def _save_weights(model: nn.Module, path: pathlib.Path) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    weights = dict(sorted(tree_flatten(model.parameters())))
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})


def _write_json(path: pathlib.Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _validate(shape: str, hidden_size: int, num_heads: int, num_kv_heads: int, dtype: str,
              template: str) -> None:
    _tpl.style(template)
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {DTYPES}")
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError("hidden_size must divide by num_heads, num_heads by num_kv_heads")


def _write_tokenizer(path: pathlib.Path, shape: str, vocab_size: int,
                     template: str = _tpl.DEFAULT,
                     extra_special: tuple[str, ...] = ()) -> _tok.SpecialTokens:
    shape = "llama" if shape in _cfg.LLAMA_STYLE else "qwen3"
    tok = _tok.build_tokenizer(shape, vocab_size, template, tuple(extra_special))
    tok.save(str(path / "tokenizer.json"))
    cfg = _tok.tokenizer_config(shape, tok, MAX_POSITION_EMBEDDINGS, template)
    _write_json(path / "tokenizer_config.json", cfg)
    _write_json(path / "special_tokens_map.json", _tok.special_tokens_map(shape, template))
    return _tok.special_token_ids(tok, shape, template)


def build_checkpoint(
    path: str | os.PathLike,
    shape: str = "qwen3",
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    vocab_size: int = 512,
    seed: int = 0,
    dtype: str = "bfloat16",
    quantize_bits: int | None = None,
    generation_config: dict | None = None,
    suppress_eos: bool = False,
    config: dict | None = None,
    template: str = _tpl.DEFAULT,
    extra_special_tokens: tuple[str, ...] = (),
) -> pathlib.Path:
    """Write a tiny random-weight ``shape`` checkpoint into ``path`` and return it.

    ``shape`` is a model_type (``SHAPES``): the classic four or any other type with a
    config recipe in ``mlxcel.testing.configs``; the weights are those of mlx-lm's own
    model class for it, seeded. ``suppress_eos`` zeroes the output-projection rows of
    every EOS id (untying the embeddings if needed) so greedy decoding practically never
    stops early; it needs a model class that has an ``lm_head`` when
    ``tie_word_embeddings`` is false (the classic four, ``gemma4_text``, most others;
    ``ValueError`` if not). ``config``: fields that override the recipe's
    (e.g. ``{"sliding_window": 512}``, or a variant's switch such as Gemma 4's
    ``enable_moe_block``). ``template``: a style of ``mlxcel.testing.templates.STYLES``
    (``chatml``, ``llama3``, ``mistral``, ``gemma4``, ``qwen3_coder``, ``harmony``); its
    chat template, its markers as added tokens, its BOS and EOS tokens, whatever the shape.
    ``extra_special_tokens``: more special tokens for the vocabulary (within
    ``vocab_size``), such as fill-in-the-middle markers (``<|fim_prefix|>``, ...).
    """
    _validate(shape, hidden_size, num_heads, num_kv_heads, dtype, template)
    out = pathlib.Path(path)
    out.mkdir(parents=True, exist_ok=True)
    ids = _write_tokenizer(out, shape, vocab_size, template, extra_special_tokens)
    dims = _cfg.Dims(hidden_size, num_layers, num_heads, num_kv_heads,
                     intermediate_size or 3 * hidden_size, vocab_size)
    overrides = config or {}
    config = {**_cfg.model_config(shape, dims, dtype, ids.eos_ids[0], ids.config_bos),
              **overrides}
    tied = config["tie_word_embeddings"]
    if suppress_eos:
        config["tie_word_embeddings"] = False
    model = _init_model(config, seed, dtype)
    if suppress_eos:
        _lm_head(model, shape)
        if tied:
            _untie(model)
        _suppress_eos(model, ids.eos_ids)
    if quantize_bits is not None:
        config = _quantize(model, config, quantize_bits)
    _save_weights(model, out)
    _write_json(out / "config.json", dict(sorted(config.items())))
    gen = {"bos_token_id": config["bos_token_id"], "eos_token_id": ids.eos_ids}
    _write_json(out / "generation_config.json", {**gen, **(generation_config or {})})
    return out


def _cache_key(shape: str, kw: dict[str, Any]) -> str:
    """Stable digest of the normalized build arguments and bundled assets."""
    bound = inspect.signature(build_checkpoint).bind(None, shape, **kw)
    bound.apply_defaults()
    # no ``config`` override, the default template and no extra special tokens: the key
    # of the builds made before those arguments existed
    args = {k: v for k, v in bound.arguments.items()
            if k != "path" and not (k == "config" and v is None)
            and not (k == "template" and v == _tpl.DEFAULT)
            and not (k == "extra_special_tokens" and not v)}
    template = _tok.chat_template_text(kw.get("template", _tpl.DEFAULT))
    payload = json.dumps(
        {
            "builder": BUILDER_VERSION,
            "args": args,
            "corpus": hashlib.sha256(_tok.corpus_text().encode()).hexdigest(),
            "template": hashlib.sha256(template.encode()).hexdigest(),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def cached_checkpoint(
    shape: str = "qwen3", cache_dir: str | os.PathLike | None = None, **kw: Any
) -> pathlib.Path:
    """Build (once) and return a checkpoint under ``cache_dir``; safe across processes."""
    root = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return build_once(root / f"{shape}-{_cache_key(shape, kw)}",
                      lambda tmp: build_checkpoint(tmp, shape, **kw))


def build_once(final: pathlib.Path, build: Any) -> pathlib.Path:
    """``build(tmp)`` into a fresh folder beside ``final``, then renamed to it, unless
    ``final`` is there already: processes building the same checkpoint never see a half
    one, and the first to finish wins."""
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        build(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
        os.replace(tmp, final)
    except OSError:
        # Another process finished first; keep its copy.
        if not (final / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def demo_checkpoint() -> pathlib.Path:
    """The default tiny qwen3 checkpoint in the default cache dir."""
    return cached_checkpoint("qwen3")

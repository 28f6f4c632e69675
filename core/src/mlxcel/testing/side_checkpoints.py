"""Tiny random-weight embedders and rerankers, as Hugging Face writes them: real
``config.json`` fields, sentence-transformers ``modules.json`` / ``1_Pooling`` (and
``2_Dense``) folders, a ``tokenizer.json``, and safetensors under the key names the
checkpoint's own library uses, built with the real model classes (mlx-vlm's BERT, Qwen3
embedding and sequence classifier; mlx-lm's Qwen3 for a generative reranker).

mlx-vlm is not a dependency of core: it is imported inside the functions, so only a
distribution that has it (``mlxcel-family-embeddings``) calls them.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Any

from . import checkpoint as _ckpt
from . import configs as _cfg
from . import tokenizer as _tok

BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
POOLING_FLAGS = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token",
                 "last": "pooling_mode_lasttoken"}


def _write(path: pathlib.Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")


def _bert_tokenizer(out: pathlib.Path, vocab_size: int) -> int:
    """A WordPiece tokenizer with BERT's specials and pair template; returns its size."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from tokenizers.processors import TemplateProcessing

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(BERT_SPECIALS),
                                        show_progress=False)
    tok.train_from_iterator(_tok.corpus_text().splitlines(), trainer=trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.save(str(out / "tokenizer.json"))
    _write(out / "tokenizer_config.json", {
        "tokenizer_class": "BertTokenizerFast", "do_lower_case": True,
        "model_max_length": 512, "cls_token": "[CLS]", "sep_token": "[SEP]",
        "pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]"})
    _write(out / "special_tokens_map.json", {
        "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]",
        "unk_token": "[UNK]", "mask_token": "[MASK]"})
    return tok.get_vocab_size()


def _bert_config(vocab: int, dims: dict[str, Any], cross: bool) -> dict[str, Any]:
    config = {"model_type": "bert", "vocab_size": vocab, "hidden_size": 32,
              "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
              "max_position_embeddings": 128, "type_vocab_size": 2,
              "layer_norm_eps": 1e-12, "pad_token_id": 0, "hidden_act": "gelu",
              "architectures": ["BertForSequenceClassification" if cross else "BertModel"]}
    if cross:
        config.update(num_labels=1, id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    return {**config, **dims}


def _save(module: Any, out: pathlib.Path, dtype: str, rename: Any) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    module.set_dtype(getattr(mx, dtype))
    weights = {rename(k): v for k, v in tree_flatten(module.parameters())}
    mx.eval(list(weights.values()))
    mx.save_safetensors(str(out / "model.safetensors"), weights,
                        metadata={"format": "pt"})


def _st_modules(out: pathlib.Path, pooling: str, hidden: int, dense: bool, seed: int,
                dtype: str) -> None:
    """sentence-transformers' modules.json, Pooling config and, with ``dense``, a Dense
    layer (hidden -> hidden // 2) with its own weights."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    _write(out / "1_Pooling" / "config.json",
           {"word_embedding_dimension": hidden, **dict.fromkeys(POOLING_FLAGS.values(), False),
            POOLING_FLAGS[pooling]: True})
    if dense:
        import mlx.core as mx

        modules.append({"idx": 2, "name": "2", "path": "2_Dense",
                        "type": "sentence_transformers.models.Dense"})
        _write(out / "2_Dense" / "config.json", {
            "in_features": hidden, "out_features": hidden // 2, "bias": True,
            "activation_function": "torch.nn.modules.activation.Tanh"})
        mx.random.seed(seed + 1)
        weight = mx.random.normal((hidden // 2, hidden)) * hidden ** -0.5
        mx.save_safetensors(str(out / "2_Dense" / "model.safetensors"), {
            "linear.weight": weight.astype(getattr(mx, dtype)),
            "linear.bias": mx.zeros((hidden // 2,), dtype=getattr(mx, dtype))})
    _write(out / "modules.json", modules)


def build_embedder(path: str | os.PathLike, kind: str = "bert", pooling: str | None = None,
                   dense: bool = False, seed: int = 0, dtype: str = "float32",
                   **dims: Any) -> pathlib.Path:
    """An embedder: ``kind`` ``bert`` (mean pooling unless ``pooling``) or ``qwen3`` (a
    Qwen3-Embedding: last-token pooling). ``dims``: config fields that override the tiny
    defaults (``hidden_size``, ``num_hidden_layers``, ...)."""
    import mlx.core as mx

    out = pathlib.Path(path)
    out.mkdir(parents=True, exist_ok=True)
    mx.random.seed(seed)
    if kind == "bert":
        from mlx_vlm.models.bert.bert import Model
        from mlx_vlm.models.bert.config import ModelConfig

        config = _bert_config(_bert_tokenizer(out, dims.pop("vocab_size", 512)), dims, False)
        _save(Model(ModelConfig.from_dict(config)), out, dtype, lambda k: k)
        pooling = pooling or "mean"
    elif kind == "qwen3":
        config = _qwen3_config(out, dims, extra=())
        config["architectures"] = ["Qwen3ForCausalLM"]
        from mlx_vlm.models.qwen3.config import ModelConfig
        from mlx_vlm.models.qwen3_embedding.qwen3_embedding import Model

        _save(Model(ModelConfig.from_dict(config)), out, dtype,
              lambda k: k.removeprefix("model."))  # HF's Qwen3Model keys
        pooling = pooling or "last"
    else:
        raise ValueError(f"unknown embedder kind {kind!r} (bert, qwen3)")
    _st_modules(out, pooling, config["hidden_size"], dense, seed, dtype)
    _write(out / "config.json", {**config, "torch_dtype": dtype})
    return out


def _qwen3_config(out: pathlib.Path, dims: dict[str, Any], extra: tuple[str, ...]) -> dict:
    vocab = dims.pop("vocab_size", 512)
    ids = _ckpt._write_tokenizer(out, "qwen3", vocab, extra_special=extra)
    d = _cfg.Dims(dims.pop("hidden_size", 64), dims.pop("num_hidden_layers", 2),
                  dims.pop("num_attention_heads", 4), dims.pop("num_key_value_heads", 2),
                  dims.pop("intermediate_size", 192), vocab)
    config = _cfg.model_config("qwen3", d, "float32", ids.eos_ids[0], ids.config_bos)
    return {**config, **dims}


def build_reranker(path: str | os.PathLike, kind: str = "bert", seed: int = 0,
                   dtype: str = "float32", **dims: Any) -> pathlib.Path:
    """A reranker: ``bert`` (a one-label ``BertForSequenceClassification``) or ``qwen3``
    (a Qwen3-Reranker: a Qwen3 causal LM with ``yes``/``no`` tokens, named so in
    ``_name_or_path``)."""
    import mlx.core as mx

    out = pathlib.Path(path)
    out.mkdir(parents=True, exist_ok=True)
    mx.random.seed(seed)
    if kind == "bert":
        from mlx_vlm.models.bert.bert import SequenceClassificationModel
        from mlx_vlm.models.bert.config import ModelConfig

        config = _bert_config(_bert_tokenizer(out, dims.pop("vocab_size", 512)), dims, True)
        model = SequenceClassificationModel(ModelConfig.from_dict(config))
        _save(model, out, dtype,
              lambda k: k if k.startswith("classifier.") else f"bert.{k}")
    elif kind == "qwen3":
        config = _qwen3_config(out, dims, extra=("yes", "no"))
        config.update(architectures=["Qwen3ForCausalLM"], _name_or_path="tiny/Qwen3-Reranker")
        model = _ckpt._init_model(config, seed, dtype)
        _save(model, out, dtype, lambda k: k)
    else:
        raise ValueError(f"unknown reranker kind {kind!r} (bert, qwen3)")
    _write(out / "config.json", {**config, "torch_dtype": dtype})
    return out


def cached_side_checkpoint(builder: str, cache_dir: str | os.PathLike | None = None,
                           **kw: Any) -> pathlib.Path:
    """Build once and return ``build_embedder`` / ``build_reranker`` (``builder``
    "embedder" / "reranker") with ``kw`` under the checkpoint cache; safe across
    processes."""
    build = {"embedder": build_embedder, "reranker": build_reranker}[builder]
    key = json.dumps({"builder": builder, "v": _ckpt.BUILDER_VERSION, **kw}, sort_keys=True)
    root = pathlib.Path(cache_dir) if cache_dir is not None else _ckpt.default_cache_dir()
    final = root / f"{builder}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    return _ckpt.build_once(final, lambda tmp: build(tmp, **kw))

"""Finding and loading checkpoints: local dirs, Hugging Face ids (cache, offline), quantized."""

from __future__ import annotations

import shutil

import pytest
from mlxcel.errors import StartupError
from mlxcel.model.loader import (
    check_checkpoint,
    generation_defaults,
    load_checkpoint,
    resolve_model_path,
)
from mlxcel.plugins import load_plugins


@pytest.fixture(scope="module")
def families():
    return load_plugins().families


def test_local_directory_resolves_to_itself(tiny_checkpoint):
    assert resolve_model_path(str(tiny_checkpoint)) == tiny_checkpoint


def test_directory_without_config_is_refused(tmp_path):
    with pytest.raises(StartupError, match="no config.json"):
        resolve_model_path(str(tmp_path))


def test_neither_path_nor_hf_id(tmp_path):
    with pytest.raises(StartupError, match="neither a directory nor a Hugging Face id"):
        resolve_model_path(str(tmp_path / "missing" / "deeper" / "dir"))


def test_hf_id_offline_and_not_cached_is_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(StartupError) as info:
        resolve_model_path("acme/not-downloaded")
    message = str(info.value)
    assert "acme/not-downloaded" in message and "\n" not in message


def test_hf_id_resolves_from_the_hugging_face_cache(monkeypatch, tmp_path, tiny_checkpoint):
    """The download path (snapshot_download) serves a repo already in the HF cache."""
    hub = tmp_path / "hub"
    repo = hub / "models--acme--tiny-qwen3"
    snapshot = repo / "snapshots" / ("a" * 40)
    shutil.copytree(tiny_checkpoint, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    path = resolve_model_path("acme/tiny-qwen3")
    assert (path / "config.json").exists() and path.name == "a" * 40


def test_unknown_model_type_names_it(tmp_path, tiny_checkpoint, families):
    target = tmp_path / "m"
    shutil.copytree(tiny_checkpoint, target)
    cfg = (target / "config.json").read_text().replace('"qwen3"', '"martian_lm"')
    (target / "config.json").write_text(cfg)
    with pytest.raises(StartupError, match="martian_lm"):
        check_checkpoint(target, families)


def test_generation_config_defaults(tmp_path, tiny_checkpoint):
    target = tmp_path / "g"
    shutil.copytree(tiny_checkpoint, target)
    (target / "generation_config.json").write_text(
        '{"temperature": 0.6, "top_k": 20, "top_p": 0.9, "eos_token_id": [5, 6]}')
    d = generation_defaults(target, {})
    assert (d.temperature, d.top_k, d.top_p, d.min_p, d.eos_token_ids) == (0.6, 20, 0.9, None,
                                                                           (5, 6))


@pytest.mark.parametrize("shape", ["qwen3", "llama", "qwen2", "mistral"])
def test_load_each_model_type_plain_and_quantized(shape, families, mlxcel_checkpoint_cache):
    import mlx.core as mx
    from mlxcel.testing.checkpoint import cached_checkpoint

    for bits in (None, 4):
        path = cached_checkpoint(shape, cache_dir=mlxcel_checkpoint_cache, quantize_bits=bits)
        ckpt = load_checkpoint(str(path), families)
        assert ckpt.family.name == "mlx-lm-text" and ckpt.config["model_type"] == shape
        assert ("quantization" in ckpt.config) == (bits is not None)
        cache = ckpt.model.make_cache()
        logits = ckpt.model(mx.array([[1, 2, 3]]), cache)
        assert logits.shape == (1, 3, ckpt.tokenizer.vocab_size)


def test_context_length_from_a_nested_text_config(tmp_path, families,
                                                  mlxcel_checkpoint_cache):
    """Vision-language configs keep the decoder's limits under ``text_config``."""
    import json

    from mlxcel.model.loader import load_checkpoint
    from mlxcel.testing.checkpoint import cached_checkpoint

    target = tmp_path / "nested"
    shutil.copytree(cached_checkpoint("llama", cache_dir=mlxcel_checkpoint_cache), target)
    config = json.loads((target / "config.json").read_text())
    config.pop("max_position_embeddings", None)
    config["text_config"] = {"max_position_embeddings": 1536}
    (target / "config.json").write_text(json.dumps(config))
    assert load_checkpoint(str(target), families).context_length == 1536

"""The ``vlm`` family: which checkpoints it owns (cheaply), what its ``load`` brings, and
its text rows."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import mlx.core as mx
import pytest
from mlxcel.families.api import LoadOptions
from mlxcel.testing.engine import padded_attention, warm_up_layers
from mlxcel.testing.imports import imported_by
from mlxcel_family_vlm.detect import MODEL_TYPES, check
from mlxcel_family_vlm.load import decoder, load

OURS = ("qwen2_vl", "qwen2_5_vl", "gemma3", "llava_1_5", "smolvlm", "mistral3")


def config_of(path: pathlib.Path) -> dict:
    return json.loads((path / "config.json").read_text())


@pytest.mark.parametrize("shape", OURS)
def test_check_owns_vision_language_checkpoints(vlm_checkpoint, shape):
    path = vlm_checkpoint(shape)
    assert check(path, config_of(path)) is True


def test_check_declines_text_checkpoints(tiny_checkpoint, vlm_checkpoint, tmp_path):
    assert "not a vision-language model" in check(tiny_checkpoint, config_of(tiny_checkpoint))
    path = vlm_checkpoint("qwen2_vl")
    text_only = {k: v for k, v in config_of(path).items() if k != "vision_config"}
    assert "without a vision tower" in check(path, text_only)
    (tmp_path / "modules.json").write_text(json.dumps(
        [{"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    assert "embedder" in check(tmp_path, config_of(path))


def test_gemma4_is_left_to_its_own_family(vlm_checkpoint):
    path = vlm_checkpoint("gemma4")
    assert "gemma4" not in MODEL_TYPES
    assert isinstance(check(path, config_of(path)), str)


@pytest.mark.parametrize("shape", OURS)
def test_the_server_picks_the_family_for_vision_language_checkpoints(vlm_checkpoint, shape):
    from mlxcel.plugins import load_plugins

    path = vlm_checkpoint(shape)
    assert load_plugins().families.select(path, config_of(path)).name == "vlm"


def test_every_listed_type_is_a_vision_language_model_of_mlx_vlm():
    """Each spelling maps (mlx-vlm's own remapping) onto a module of mlx_vlm.models that
    has a vision tower; read from the files, not imported."""
    from mlx_vlm.utils import get_model_type

    root = pathlib.Path(importlib.util.find_spec("mlx_vlm.models").origin).parent
    for model_type in MODEL_TYPES:
        folder = root / get_model_type({"model_type": model_type})
        source = "".join(p.read_text() for p in folder.glob("*.py"))
        assert (folder / "__init__.py").is_file(), f"{model_type}: no module {folder.name}"
        assert "vision" in source.lower(), f"{model_type}: {folder.name} has no vision tower"


def test_the_entry_point_and_check_import_no_mlx():
    assert imported_by("import mlxcel_family_vlm.plugin as p, mlxcel_family_vlm.detect as d; "
                       "d.check('.', {'model_type': 'qwen2_vl', 'vision_config': {}})",
                       ("mlx", "mlx_vlm", "transformers", "PIL")) == []


@pytest.mark.parametrize("shape", OURS)
def test_load_brings_the_model_and_its_processor(vlm_checkpoint, shape):
    path = vlm_checkpoint(shape)
    loaded = load(path, LoadOptions())
    assert loaded.tasks == ("generate",)
    assert loaded.config == config_of(path)
    assert loaded.tokenizer is None and loaded.template is None  # core's text default
    assert hasattr(loaded.processor, "image_processor")
    # the vision tower, under mlx-vlm's name for it (Idefics3's is ``vision_model``)
    assert getattr(loaded.model, "vision_tower", None) or loaded.model.vision_model
    model = decoder(loaded)
    assert model.processor is loaded.processor and model.model is loaded.model


def test_dtype_is_applied(vlm_checkpoint):
    loaded = load(vlm_checkpoint("qwen2_vl"), LoadOptions(dtype="bfloat16"))
    assert loaded.model.language_model.model.embed_tokens.weight.dtype == mx.bfloat16
    assert loaded.model.vision_tower.patch_embed.proj.weight.dtype == mx.bfloat16


@pytest.mark.parametrize("shape", OURS)
def test_text_rows_chunked_equal_one_forward(vlm_checkpoint, shape):
    """A prompt prefilled in two chunks with the cache, then one decode step, gives the
    logits of one forward over the whole sequence (positions come from the cache)."""
    model = decoder(load(vlm_checkpoint(shape), LoadOptions()))
    ids = mx.array([[11, 57, 200, 31, 99, 4, 18, 73, 5]])
    whole = model(ids, model.make_cache())
    cache = model.make_cache()
    parts = [model(ids[:, :4], cache), model(ids[:, 4:8], cache), model(ids[:, 8:], cache)]
    chunked = mx.concatenate(parts, axis=1)
    assert mx.allclose(chunked, whole, atol=1e-4).item()


def test_mrope_positions_follow_each_rows_offset():
    from mlxcel_family_vlm.load import VisionLanguageModel

    class Cache:
        offset = mx.array([3, -1])

    positions = VisionLanguageModel._positions(mx.zeros((2, 2), mx.int32), [Cache()])
    assert positions.shape == (3, 2, 2)
    assert positions[0].tolist() == [[3, 4], [-1, 0]]
    assert (positions[1] == positions[2]).all().item()


def test_core_keeps_the_processor_the_family_brings(vlm_checkpoint):
    """The chat layer expands image parts with it: the loaded checkpoint carries it."""
    from mlxcel.model.loader import load_checkpoint
    from mlxcel.plugins import load_plugins

    ckpt = load_checkpoint(str(vlm_checkpoint("qwen2_vl")), load_plugins().families)
    assert ckpt.family.name == "vlm" and hasattr(ckpt.processor, "image_processor")


@pytest.mark.parametrize("shape", ["qwen2_5_vl", "llava_1_5"])
def test_the_warm_up_runs_one_decoder_layer_of_a_vlm(vlm_checkpoint, shape):
    """The engine's warm-up finds the decoder's layers through ``language_model``: a
    prefill shape between served steps costs one layer, not a whole forward."""
    model = decoder(load(vlm_checkpoint(shape), LoadOptions()))
    holder = model.language_model.model
    layers = list(holder.layers)
    assert warm_up_layers(model, layers) == (1, [0])
    assert holder.layers == layers


@pytest.mark.parametrize("shape", ["qwen2_5_vl", "gemma3"])
def test_the_engines_masked_attention_reaches_a_vlms_decoder(vlm_checkpoint, shape):
    """The engine's masked attention path (on CUDA: the varlen kernel for padded rows and
    short chunks) is installed in the module the language model's layers call, found
    through ``language_model``, and gives the same logits as MLX's own."""
    model = decoder(load(vlm_checkpoint(shape), LoadOptions()))
    calls, diff = padded_attention(model)
    assert calls > 0 and diff < 1e-4

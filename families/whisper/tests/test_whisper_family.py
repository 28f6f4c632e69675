"""The family's wiring: which checkpoints ``check`` owns (cheaply, in both layouts), the
entry point's imports, loading both layouts to the same model, the runner's languages,
the one-line errors for a checkpoint that lacks its processor files or weights, and the
family served through core's side-model loader."""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlxcel.errors import StartupError
from mlxcel.families.api import LoadOptions
from mlxcel.testing.imports import imported_by
from mlxcel_family_whisper import detect
from mlxcel_family_whisper.load import load
from mlxcel_family_whisper.runner import make

TINY_HF = {"model_type": "whisper", "d_model": 384, "encoder_layers": 4, "decoder_layers": 4,
           "num_mel_bins": 80, "vocab_size": 51865}


def test_check_owns_both_layouts_and_declines_others(whisper_checkpoint):
    for layout in ("hf", "mlx"):
        path = whisper_checkpoint(layout)
        config = json.loads((path / "config.json").read_text())
        assert detect.check(path, config) is True and detect.layout(config) == layout
    assert "not Whisper" in detect.check(path, {"model_type": "qwen3"})
    reason = detect.check(path, {"model_type": "whisper"})
    assert isinstance(reason, str) and "n_mels" in reason


def test_origin_names_the_openai_repo_of_the_checkpoint_s_size():
    mlx_turbo = {"n_mels": 128, "n_audio_ctx": 1500, "n_audio_state": 1280,
                 "n_audio_layer": 32, "n_vocab": 51866, "n_text_ctx": 448, "n_text_layer": 4}
    assert detect.origin(TINY_HF) == "openai/whisper-tiny"
    assert detect.origin({**TINY_HF, "vocab_size": 51864}) == "openai/whisper-tiny.en"
    assert detect.origin(mlx_turbo) == "openai/whisper-large-v3-turbo"
    assert detect.origin({**mlx_turbo, "n_text_layer": 32}) == "openai/whisper-large-v3"
    assert detect.origin({**TINY_HF, "d_model": 100}) == "openai/whisper-<size>"


def test_the_entry_point_imports_nothing_heavy():
    assert imported_by("import mlxcel_family_whisper.plugin, mlxcel_family_whisper.detect",
                       ("mlx", "mlx_audio", "numpy", "transformers")) == []


def test_both_layouts_load_the_same_model(whisper_checkpoint):
    hf = load(whisper_checkpoint("hf"), LoadOptions(dtype="float32"))
    mlx = load(whisper_checkpoint("mlx"), LoadOptions(dtype="float32"))
    assert hf.tasks == ("transcribe",) and hf.processor is not None
    a, b = dict(tree_flatten(hf.model.parameters())), dict(tree_flatten(mlx.model.parameters()))
    assert a.keys() == b.keys() and all(mx.array_equal(a[k], b[k]) for k in a)
    assert hf.model.dtype == mx.float32 and a["decoder.token_embedding.weight"].dtype == mx.float32
    half = load(whisper_checkpoint("mlx"), LoadOptions())  # auto: float16, as mlx-audio runs it
    assert half.model.dtype == mx.float16


def test_npz_weights_load(whisper_checkpoint):
    loaded = load(whisper_checkpoint("mlx", weights="npz"), LoadOptions(dtype="float32"))
    assert loaded.model.dims.n_vocab == 51865


def test_languages_and_translation_follow_the_vocabulary(transcriber):
    multi, english = transcriber("hf"), transcriber("hf", multilingual=False)
    assert multi.sample_rate == english.sample_rate == 16000
    assert len(multi.languages) == 99 and multi.languages[:3] == ("en", "zh", "de")
    assert multi.translates is True
    assert english.languages == ("en",) and english.translates is False


def _copy(src, dst, drop):
    shutil.copytree(src, dst)
    for name in drop:
        (dst / name).unlink()
    return dst


def test_a_weights_only_checkpoint_names_the_missing_files(whisper_checkpoint, tmp_path):
    bare = whisper_checkpoint("mlx", processor=False)
    with pytest.raises(StartupError) as err:
        load(bare, LoadOptions())
    message = str(err.value)
    assert "\n" not in message and "tokenizer.json/preprocessor_config.json" in message
    assert "copy them from openai/whisper-<size>" in message
    no_fe = _copy(whisper_checkpoint("hf"), tmp_path / "no-fe", ["preprocessor_config.json"])
    with pytest.raises(StartupError, match=r"has no preprocessor_config\.json,"):
        load(no_fe, LoadOptions())


def test_missing_weights_are_refused(whisper_checkpoint, tmp_path):
    path = _copy(whisper_checkpoint("mlx"), tmp_path / "partial", ["weights.safetensors"])
    with pytest.raises(StartupError, match="no \\*.safetensors or \\*.npz"):
        load(path, LoadOptions())
    weights = mx.load(str(whisper_checkpoint("mlx") / "weights.safetensors"))
    weights.pop("decoder.ln.weight")
    mx.save_safetensors(str(path / "weights.safetensors"), weights)
    with pytest.raises(StartupError, match="lacks 1 of the model's weights"):
        load(path, LoadOptions())


def test_core_serves_the_checkpoint_as_transcribe(whisper_checkpoint):
    from mlxcel.model.loader import check_task_model, load_task_model, served_task
    from mlxcel.plugins import load_plugins

    families = load_plugins().families
    path = str(whisper_checkpoint("hf"))
    assert served_task(path, families) == "transcribe"
    family, task = check_task_model(path, families, "transcribe")
    assert (family.name, task) == ("whisper", "transcribe")
    family, loaded, runner = load_task_model(path, families, "transcribe", dtype="float32")
    assert family.name == "whisper" and runner.languages == make(loaded).languages

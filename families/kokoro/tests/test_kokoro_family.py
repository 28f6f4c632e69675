"""Which checkpoints the family owns, checked as the CLI checks them before the server forks:
from the checkpoint's files only, with no MLX (nor misaki, nor spaCy) imported, on configs
with and without Kokoro's model_type, and through the installed plugin's registration."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from mlxcel.testing.kokoro_checkpoints import kokoro_config
from mlxcel_family_kokoro import detect

HEAVY = ("mlx", "mlx_audio", "misaki", "spacy", "phonemizer", "numpy")


def _dir(tmp_path, name, config, weights=("kokoro-v1_0.safetensors",),
         voices=("af_heart.safetensors",)):
    path = tmp_path / name
    (path / "voices").mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    for file in weights:
        (path / file).write_bytes(b"")
    for file in voices:
        (path / "voices" / file).write_bytes(b"")
    return path


@pytest.mark.parametrize("model_type", ["kokoro", None])
def test_check_owns_kokoro_with_or_without_its_model_type(tmp_path, model_type):
    config = {k: v for k, v in kokoro_config(model_type=model_type).items() if v is not None}
    assert detect.check(_dir(tmp_path, "k", config), config) is True


def test_check_declines_other_models_and_the_pytorch_layout(tmp_path):
    chat = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
    assert "not Kokoro" in detect.check(_dir(tmp_path, "chat", chat), chat)
    bare = {"hidden_size": 8}
    assert "not a Kokoro config" in detect.check(_dir(tmp_path, "bare", bare), bare)
    config = kokoro_config()
    torch = _dir(tmp_path, "pt", config, weights=("kokoro-v1_0.pth",), voices=("af_heart.pt",))
    assert detect.MLX_CONVERSION in detect.check(torch, config)
    packs = _dir(tmp_path, "packs", config, voices=("af_heart.pt",))
    assert ".pt packs" in detect.check(packs, config)
    assert "no voice packs" in detect.check(_dir(tmp_path, "none", config, voices=()), config)


def test_the_installed_plugin_claims_kokoro_for_speak_and_for_m(tmp_path):
    from mlxcel.plugins import load_plugins

    families = load_plugins().families
    config = kokoro_config()
    path = _dir(tmp_path, "k", config)
    assert families.select(path, config, "speak").name == "kokoro"
    assert families.select(path, config, None).name == "kokoro"  # -m: not a chat model
    bare = {k: v for k, v in config.items() if k != "model_type"}
    assert families.select(path, bare, "speak").name == "kokoro"


def test_the_entry_point_and_the_check_import_nothing_heavy(tmp_path):
    path = _dir(tmp_path, "k", kokoro_config())
    code = ("import sys, json, mlxcel_family_kokoro.plugin as p, mlxcel_family_kokoro.detect "
            f"as d; print(d.check({str(path)!r}, json.load(open({str(path / 'config.json')!r}))),"
            f" [m for m in {HEAVY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "True []"


def test_the_pre_fork_checks_of_m_and_tts_model_import_no_mlx(kokoro_checkpoint):
    """The CLI checks -m and --tts-model before Granian forks: MLX must not be imported
    then (a device initialised before the fork is unusable on CUDA)."""
    code = ("import sys; from mlxcel.cli import _prepare_model; "
            "from mlxcel.settings import Settings; "
            f"_prepare_model(Settings(model={str(kokoro_checkpoint)!r})); "
            f"s = _prepare_model(Settings(tts_model={str(kokoro_checkpoint)!r})); "
            f"print(s.tts_model == {str(kokoro_checkpoint)!r}, "
            f"[m for m in {HEAVY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    assert out == "True []"

"""Which family owns a checkpoint (``FamilyRegistry.select``), and what ``load`` returns.

The checks here are real ``"module:attr"`` functions in a module written to ``tmp_path``;
the checkpoints are config directories (``check`` reads no weights).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from mlxcel.builtin import text_family
from mlxcel.errors import StartupError, UnknownModelType
from mlxcel.families import text
from mlxcel.families.api import Family, Loaded, LoadOptions
from mlxcel.families.registry import FamilyRegistry
from mlxcel.model.loader import check_task_model, served_task

CHECKS = '''
def pooled(path, config):
    """An embedder's checkpoint: one with a sentence-transformers modules.json."""
    return (path / "modules.json").is_file() or "no modules.json"

def always(path, config):
    return True

def never(path, config):
    return "never takes anything"
'''


@pytest.fixture
def checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    site = tmp_path / "site"
    site.mkdir()
    (site / "selchecks.py").write_text(textwrap.dedent(CHECKS))
    monkeypatch.syspath_prepend(str(site))
    return "selchecks"


def checkpoint(root: Path, name: str, config: dict, *, pooling: bool = False,
               weights: bool = False) -> Path:
    path = root / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    if pooling:
        (path / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling",
             "type": "sentence_transformers.models.Pooling"}]))
    if weights:
        (path / "model.safetensors").write_bytes(b"")
    return path


CHAT = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}


def fam(name: str, *types: str, tasks: tuple[str, ...] = ("generate",),
        check: str | None = None) -> Family:
    return Family(name=name, model_types=types, check=check, load=f"pkg_{name}:load",
                  tasks={t: f"pkg_{name}:{t}" for t in tasks})


def registry(*families: Family) -> FamilyRegistry:
    reg = FamilyRegistry()
    for family in families:
        reg.current_owner = f"family-{family.name}"
        reg.add(family)
    return reg


def builtin_registry() -> FamilyRegistry:
    reg = FamilyRegistry()
    reg.current_owner = "family-text"
    text_family.mlxcel_register_families(reg)
    return reg


def test_a_listed_type_whose_check_passes_beats_a_catch_all(tmp_path, checks):
    reg = registry(fam("catchall", check=f"{checks}:always"),
                   fam("listed", "qwen3", check=f"{checks}:always"))
    path = checkpoint(tmp_path, "chat", CHAT)
    assert reg.select(path, CHAT, "generate").name == "listed"
    other = {"model_type": "mamba"}
    assert reg.select(path, other, "generate").name == "catchall"


def test_a_listed_type_whose_check_declines_falls_to_the_catch_all(tmp_path, checks):
    reg = registry(fam("catchall", check=f"{checks}:always"),
                   fam("listed", "qwen3", check=f"{checks}:never"))
    path = checkpoint(tmp_path, "chat", CHAT)
    assert reg.select(path, CHAT, "generate").name == "catchall"


def test_two_catch_alls_taking_one_checkpoint_is_a_startup_error_naming_both(tmp_path, checks):
    reg = registry(fam("one", check=f"{checks}:always"), fam("two", check=f"{checks}:always"))
    path = checkpoint(tmp_path, "chat", CHAT)
    with pytest.raises(StartupError) as err:
        reg.select(path, CHAT, "generate")
    message = str(err.value)
    assert "'one' (from 'family-one')" in message and "'two' (from 'family-two')" in message
    assert "--disable-plugins" in message


def test_only_families_serving_the_task_are_asked(tmp_path, checks):
    reg = registry(fam("chat", "qwen3", check=text.CHECK),
                   fam("emb", tasks=("embed",), check=f"{checks}:pooled"))
    chat = checkpoint(tmp_path, "chat", CHAT)
    embedder = checkpoint(tmp_path, "embedder", {"model_type": "qwen3"}, pooling=True)
    assert reg.select(embedder, {"model_type": "qwen3"}, "embed").name == "emb"
    with pytest.raises(UnknownModelType) as err:
        reg.select(chat, CHAT, "embed")
    assert "for the embed task" in str(err.value) and "emb: no modules.json" in str(err.value)
    with pytest.raises(UnknownModelType) as err:
        reg.select(embedder, {"model_type": "qwen3"}, "generate")
    assert "chat: a sentence-transformers embedder" in str(err.value)


def test_dash_m_serves_a_chat_checkpoint_as_chat_and_an_embedder_as_an_embedder(
        tmp_path, checks):
    """``-m`` (task None) asks every family: the text family declines an embedder whose
    model_type is a chat model's, so the side family claims it."""
    reg = builtin_registry()
    reg.current_owner = "family-emb"
    reg.add(fam("emb", tasks=("embed",), check=f"{checks}:pooled"))
    chat = checkpoint(tmp_path, "chat", CHAT, weights=True)
    embedder = checkpoint(tmp_path, "embedder", {"model_type": "qwen3"}, pooling=True,
                          weights=True)
    assert reg.select(chat, CHAT).name == "mlx-lm-text"
    assert reg.select(embedder, {"model_type": "qwen3"}).name == "emb"
    assert served_task(str(chat), reg) == "generate"
    assert served_task(str(embedder), reg) == "embed"
    assert check_task_model(str(embedder), reg, "embed")[0].name == "emb"
    with pytest.raises(StartupError, match="embed task"):
        check_task_model(str(chat), reg, "embed")


def test_a_side_task_without_its_distribution_names_it(tmp_path):
    reg = builtin_registry()
    path = checkpoint(tmp_path, "embedder", {"model_type": "bert"}, pooling=True)
    with pytest.raises(UnknownModelType, match="install mlxcel-family-embeddings"):
        reg.select(path, {"model_type": "bert"}, "embed")


def test_check_task_model_wants_weights(tmp_path, checks):
    reg = registry(fam("emb", tasks=("embed",), check=f"{checks}:pooled"))
    path = checkpoint(tmp_path, "embedder", {"model_type": "bert"}, pooling=True)
    with pytest.raises(StartupError, match=r"no \*\.safetensors"):
        check_task_model(str(path), reg, "embed")


@pytest.mark.parametrize(("config", "pooling", "reason"), [
    ({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}, True,
     "sentence-transformers embedder"),
    ({"model_type": "qwen3", "architectures": ["Qwen3ForSequenceClassification"]}, False,
     "sequence classifier"),
    ({"model_type": "qwen3", "architectures": ["Qwen3Model"]}, False,
     "without a language-model head"),
])
def test_the_text_families_decline_embedders_and_classifiers(tmp_path, config, pooling, reason):
    reg = builtin_registry()
    path = checkpoint(tmp_path, "ckpt", config, pooling=pooling)
    assert reason in text.check(path, config)
    with pytest.raises(UnknownModelType) as err:
        reg.select(path, config)
    assert "mlx-lm-text: " in str(err.value) and reason in str(err.value)


def test_the_text_check_takes_a_decoder(tmp_path):
    path = checkpoint(tmp_path, "chat", CHAT)
    assert text.check(path, CHAT) is True
    assert builtin_registry().select(path, CHAT).name == "mlx-lm-text"


def test_the_text_load_returns_loaded_with_core_defaults(tiny_checkpoint):
    """``load`` gives the model and leaves tokenizer and template to core's text default;
    ``decoder`` hands the engine that model."""
    loaded = text.load(tiny_checkpoint, LoadOptions(dtype="float32"))
    assert isinstance(loaded, Loaded)
    assert loaded.tasks == ("generate",)
    assert loaded.tokenizer is None and loaded.template is None and loaded.processor is None
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    assert loaded.config["model_type"] == config["model_type"]
    model = text.decoder(loaded)
    assert model is loaded.model
    assert len(model.make_cache()) == config["num_hidden_layers"]

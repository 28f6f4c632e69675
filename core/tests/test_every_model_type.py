"""Every model_type mlx-lm implements is served: the generic family takes its types from
mlx-lm's own lookup, and a tiny checkpoint of each cache kind serves a request end to end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from apphelpers import make_client, wait_ready
from mlxcel.builtin import mlx_lm_types
from mlxcel.builtin.text_family import TEXT_MODEL_TYPES
from mlxcel.errors import StartupError, UnknownModelType
from mlxcel.families.api import Family
from mlxcel.families.registry import FamilyRegistry
from mlxcel.model.loader import check_checkpoint, select_family
from mlxcel.plugins import load_plugins
from mlxcel.testing.builtin_plugins import BUILTINS
from mlxcel.testing.checkpoint import SHAPES, cached_checkpoint

# the cache kinds each served type's make_cache() must show (checked against the model)
KINDS = {
    "qwen3": {"plain"}, "llama": {"plain"}, "gemma": {"plain"}, "phi3": {"plain"},
    "cohere": {"plain"}, "glm4": {"plain"}, "starcoder2": {"plain"},
    "qwen3_moe": {"plain", "moe"}, "mixtral": {"plain", "moe"},
    "deepseek_v3": {"plain", "moe"},
    "gemma3_text": {"plain", "rotating"}, "cohere2": {"plain", "rotating"},
    "gpt_oss": {"plain", "rotating", "moe"}, "olmo3": {"plain", "rotating"},
    "exaone4": {"plain", "rotating"}, "ministral3": {"plain", "rotating"},
    "mistral3": {"plain"},
    "gemma4_text": {"plain", "rotating", "kv_shared"},
    "mamba": {"arrays"}, "mamba2": {"arrays"}, "rwkv7": {"arrays"},
    "lfm2": {"plain", "arrays"}, "qwen3_next": {"plain", "arrays", "moe"},
    "qwen3_5": {"plain", "arrays"}, "kimi_linear": {"plain", "arrays", "moe"},
    "nemotron_h": {"plain", "arrays", "cacheless"},  # its MLP layers keep no cache
    "recurrent_gemma": {"arrays", "rotating"}, "jamba": {"plain", "arrays", "moe"},
    "falcon_h1": {"plain", "arrays", "list"}, "deepseek_v32": {"plain", "list", "moe"},
}
ALL_KINDS = {"plain", "rotating", "kv_shared", "arrays", "list", "moe", "cacheless"}
NEW_TYPES = ("gemma3_text", "gemma4_text", "gpt_oss", "qwen3_next", "deepseek_v3", "glm4",
             "cohere", "mistral3")
PROMPT = "Tell me a long story about a quick brown fox that jumps over the lazy dog twice."


@pytest.fixture(scope="module")
def families():
    """Core's own families only: an installed distribution listing one of these types
    (mlxcel-family-gemma4 lists gemma4_text) takes it, as the precedence test shows."""
    return load_plugins(allow=list(BUILTINS)).families


def _cache_kinds(model) -> set[str]:
    """The kinds of ``model``'s cache (mlx-lm's make_prompt_cache) and of its MLP."""
    from mlx_lm.models import cache as c

    def kind(entry) -> set[str]:
        if isinstance(entry, c.CacheList):
            return {"list"}.union(*(kind(e) for e in entry.caches))
        return {{c.KVCache: "plain", c.RotatingKVCache: "rotating",
                 c.ArraysCache: "arrays"}.get(type(entry), type(entry).__name__)}

    caches = c.make_prompt_cache(model)
    kinds = set().union(*(kind(e) for e in caches))
    if len(caches) < len(model.layers):  # layers with no cache of their own
        shared = getattr(getattr(model, "args", None), "num_kv_shared_layers", 0)
        kinds.add("kv_shared" if shared else "cacheless")
    names = {type(m).__name__.lower() for _, m in model.named_modules()}
    if any("switch" in n or "moe" in n or "expert" in n for n in names):
        kinds.add("moe")
    return kinds


# -- which family takes which type ----------------------------------------------------------


def _mlx_lm_loads(name: str) -> bool | None:
    """Whether mlx-lm's own lookup gives classes for ``name``; None when its module exists
    but cannot be imported here (it needs a package this environment lacks)."""
    from mlx_lm.utils import _get_classes

    try:
        _get_classes({"model_type": name})
    except ValueError as exc:
        cause = exc.__cause__
        missing = isinstance(cause, ModuleNotFoundError) and cause.name in (
            f"mlx_lm.models.{name}", f"mlx_lm.models.{mlx_lm_types.module_name(name)}")
        return False if missing else None
    except AttributeError:  # a helper module: no Model / ModelArgs
        return False
    except SystemExit:  # olmo exits when its optional dependency is missing
        return None
    return True


def test_generic_family_accepts_exactly_what_mlx_lm_loads():
    """For every module under mlx_lm/models and every type mlx-lm remaps, the generic
    family's answer (read from mlx-lm's files) equals mlx-lm's own _get_classes."""
    from mlx_lm.utils import MODEL_REMAPPING

    names = {p.stem for p in (mlx_lm_types.package_dir() / "models").glob("*.py")}
    names |= set(MODEL_REMAPPING) | {"martian_lm"}
    verdicts = {name: _mlx_lm_loads(name) for name in sorted(names)}
    loads = {n for n, v in verdicts.items() if v}
    needs_a_dependency = {n for n, v in verdicts.items() if v is None}
    assert needs_a_dependency <= {"olmo"}, needs_a_dependency
    accepted = {n for n in names if mlx_lm_types.accepts(n, {})}
    assert accepted - needs_a_dependency == loads
    assert set(mlx_lm_types.model_types()) == loads | needs_a_dependency
    assert len(loads) > 100 and "martian_lm" not in accepted and "cache" not in accepted


def test_types_outside_the_verified_list_go_to_the_generic_family(families, tmp_path):
    for model_type in NEW_TYPES:
        assert model_type not in TEXT_MODEL_TYPES
        family = select_family(families, {"model_type": model_type}, tmp_path)
        assert family.name == "mlx-lm-generic", model_type
        assert family.relative_positions is False  # the shared-position path stays off
    for model_type in TEXT_MODEL_TYPES:
        family = select_family(families, {"model_type": model_type}, tmp_path)
        assert family.name == "mlx-lm-text" and family.relative_positions


def test_mlx_lm_remapping_is_followed(families, tmp_path):
    """kimi_k2 has no module of its own: mlx-lm maps it onto deepseek_v3."""
    assert not (mlx_lm_types.package_dir() / "models" / "kimi_k2.py").exists()
    assert select_family(families, {"model_type": "kimi_k2"}, tmp_path).name == \
        "mlx-lm-generic"
    arch = {"model_type": "bailing_hybrid", "architectures": ["BailingMoeV3ForCausalLM"]}
    assert mlx_lm_types.module_name(arch["model_type"], arch["architectures"]) == \
        "bailing_moe_v3"


def test_an_installed_family_takes_precedence_for_its_types(families, tmp_path):
    reg = FamilyRegistry()
    for key, family in families.items():
        reg.current_owner = families.owner(key)
        reg.add(family)
    reg.current_owner = "family-gemma3"
    reg.add(Family(name="gemma3", model_types=("gemma3_text",), load="pkg_gemma3.loader:load",
                   tasks={"generate": "pkg_gemma3.loader:decoder"}))
    assert select_family(reg, {"model_type": "gemma3_text"}, tmp_path).name == "gemma3"
    assert select_family(reg, {"model_type": "gpt_oss"}, tmp_path).name == "mlx-lm-generic"


def test_two_fallback_families_accepting_one_type_name_both():
    reg = FamilyRegistry()
    for owner, name in (("family-one", "one"), ("family-two", "two")):
        reg.current_owner = owner
        reg.add(Family(name=name, model_types=(), load="pkg.loader:load",
                       tasks={"generate": "pkg.loader:decoder"},
                       check="mlxcel.builtin.mlx_lm_types:check"))
    with pytest.raises(StartupError) as err:
        reg.for_model_type("gpt_oss", {})
    assert "'one' (from 'family-one')" in str(err.value)
    assert "'two' (from 'family-two')" in str(err.value)
    assert reg.for_model_type("martian_lm", {}) is None


def test_unknown_model_type_is_one_line(families, tiny_checkpoint, tmp_path):
    target = tmp_path / "m"
    shutil.copytree(tiny_checkpoint, target)
    cfg = json.loads((target / "config.json").read_text())
    for bad in ("martian_lm", "cache", "../qwen3"):  # "cache" is a helper module, no model
        (target / "config.json").write_text(json.dumps({**cfg, "model_type": bad}))
        with pytest.raises(UnknownModelType) as err:
            check_checkpoint(target, families)
        message = str(err.value)
        assert f"model_type '{bad}'" in message and "\n" not in message
        assert "no installed model family handles" in message


def test_startup_check_of_a_generic_type_does_not_import_mlx(mlxcel_checkpoint_cache):
    """The CLI checks the checkpoint before Granian forks its worker: the generic family's
    lookup must not import MLX there (see test_backend)."""
    path = cached_checkpoint("gpt_oss", cache_dir=mlxcel_checkpoint_cache)
    code = ("import sys; from pathlib import Path; from mlxcel.plugins import load_plugins; "
            "from mlxcel.model.loader import check_checkpoint; "
            f"check_checkpoint(Path({str(path)!r}), load_plugins().families); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=dict(os.environ)).stdout.strip()
    assert out.splitlines()[-1] == "[]"


# -- a tiny checkpoint of each kind serves a request --------------------------------------


def test_served_types_cover_every_cache_kind():
    implemented = set(mlx_lm_types.model_types())
    assert set(KINDS) <= implemented & set(SHAPES)
    assert len(KINDS) >= 20 and set().union(*KINDS.values()) == ALL_KINDS
    assert set(NEW_TYPES) <= set(KINDS)


@pytest.mark.parametrize("model_type", sorted(KINDS))
def test_each_model_type_serves_a_request(model_type, mlxcel_checkpoint_cache):
    from mlx_lm.utils import load_model

    path = cached_checkpoint(model_type, cache_dir=mlxcel_checkpoint_cache, dtype="float32")
    model, _ = load_model(path)
    assert _cache_kinds(model) == KINDS[model_type]
    with make_client(path, parallel=2, plugins=",".join(BUILTINS)) as client:
        wait_ready(client)
        r = client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 24,
            "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["finish_reason"] in ("stop", "length")
        assert body["usage"]["completion_tokens"] > 0
        assert body["usage"]["prompt_tokens"] > 16  # past every sliding window
        health = client.get("/health").json()
    assert health["status"] == "ok"
    counts = health["observability"]
    assert counts["prefill_chunks_processed"] >= 1 and counts["total_decode_tokens"] == 24
    # every cache kind batches (plain KV on BatchCache, the rest on mlx-lm's batch caches)
    assert health["batch"]["max_batch_size"] == 2


def test_fewer_caches_than_layers_is_not_batchable(mlxcel_checkpoint_cache, families):
    """Gemma 4's later layers reuse earlier layers' KV: even plain KV caches do not put
    such a model on the shared-position BatchCache, since the shared layers read the cache
    beyond it (it batches on mlx-lm's batch caches instead, test_mixed_batch.py)."""
    from mlx_lm.models.cache import KVCache
    from mlxcel.engine.batch import is_batchable
    from mlxcel.model.loader import load_checkpoint

    path = cached_checkpoint("gemma4_text", cache_dir=mlxcel_checkpoint_cache)
    model = load_checkpoint(str(path), families).model
    assert len(model.make_cache()) < len(model.model.layers)
    model.make_cache = lambda: [KVCache(), KVCache()]
    assert not is_batchable(model)
    model.make_cache = lambda: [KVCache() for _ in model.model.layers]
    assert is_batchable(model)


def test_a_module_that_exits_on_import_fails_the_load(families, tiny_checkpoint, tmp_path):
    """mlx-lm's olmo calls sys.exit when its optional package (hf_olmo) is missing; that
    must be a load error, not a SystemExit that ends the engine thread."""
    import importlib.util

    from mlxcel.model.loader import load_checkpoint

    assert importlib.util.find_spec("hf_olmo") is None, "this test needs hf_olmo absent"
    target = tmp_path / "olmo"
    shutil.copytree(tiny_checkpoint, target)
    cfg = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**cfg, "model_type": "olmo"}))
    with pytest.raises(RuntimeError, match="exited on import"):
        load_checkpoint(str(target), families)


@pytest.mark.parametrize("model_type", sorted(set(KINDS) - {"qwen3", "llama"}))
def test_built_checkpoint_loads_the_weights_it_was_built_with(model_type, tmp_path):
    """mlx-lm's loader (its sanitize included) gives back the seeded model the builder
    saved: the same logits, to the bit."""
    import mlx.core as mx
    from mlx_lm.utils import load_model
    from mlxcel.testing.checkpoint import _init_model, build_checkpoint

    path = build_checkpoint(tmp_path / model_type, model_type, dtype="float32", seed=7)
    loaded, config = load_model(path)
    fresh = _init_model(json.loads((path / "config.json").read_text()), 7, "float32")
    ids = mx.array([list(range(3, 40))])
    assert config["model_type"] == model_type
    assert mx.array_equal(loaded(ids), fresh(ids)).item()

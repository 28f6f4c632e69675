"""The startup hint: a Gemma 4 checkpoint served by core's generic family names the
distribution that adds its tool format and reasoning; a family that names the type, or a
type with no hint, gets none. Tested on the function, so it holds with or without
mlxcel-family-gemma4 installed."""

from __future__ import annotations

import pytest
from mlxcel.builtin import text_family
from mlxcel.families.api import Family
from mlxcel.families.registry import FamilyRegistry
from mlxcel.model.loader import FAMILY_HINTS, family_hint

GEMMA4 = Family(name="gemma4", model_types=("gemma4", "gemma4_text"), load="x:load",
                tasks={"generate": "x:decoder"})


def builtin_family(model_type: str) -> Family:
    """The family core's own plugin picks for ``model_type`` (no distribution installed)."""
    registry = FamilyRegistry()
    text_family.mlxcel_register_families(registry)
    family = registry.for_model_type(model_type, {"model_type": model_type})
    assert family is not None
    return family


@pytest.mark.parametrize("model_type", ["gemma4", "gemma4_text"])
def test_the_generic_family_serving_gemma4_names_the_distribution(model_type):
    family = builtin_family(model_type)
    assert family.name == "mlx-lm-generic"
    assert family_hint(model_type, family) == "mlxcel-family-gemma4"


@pytest.mark.parametrize("model_type", ["gemma4", "gemma4_text"])
def test_the_family_that_names_the_type_gets_no_hint(model_type):
    assert family_hint(model_type, GEMMA4) is None


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text", None, 4])
def test_a_type_without_a_hint_gets_none(model_type):
    family = builtin_family("llama")
    assert family_hint(model_type, family) is None


def test_every_hint_names_a_distribution():
    assert FAMILY_HINTS and all(d.startswith("mlxcel-") for d in FAMILY_HINTS.values())


def test_a_vision_checkpoint_on_a_text_family_names_the_vlm_distribution():
    """Core's mlx-lm family serves a Qwen2-VL checkpoint's text only: the hint names the
    distribution that adds image input; Gemma 4's names its own; a checkpoint without a
    vision tower, or a family that names the type, gets none."""
    from mlxcel.model.loader import vision_hint

    qwen2_vl = {"model_type": "qwen2_vl", "vision_config": {"depth": 2}}
    assert vision_hint(qwen2_vl, builtin_family("qwen2_vl")) == "mlxcel-family-vlm"
    gemma4 = {"model_type": "gemma4", "vision_config": {}}
    assert vision_hint(gemma4, builtin_family("gemma4")) == "mlxcel-family-gemma4"
    assert vision_hint({"model_type": "qwen2_vl"}, builtin_family("qwen2_vl")) is None
    vlm = Family(name="vlm", model_types=("qwen2_vl",), load="x:load",
                 tasks={"generate": "x:decoder"})
    assert vision_hint(qwen2_vl, vlm) is None

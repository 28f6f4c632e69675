"""With this distribution installed, a Gemma 4 checkpoint is served by the ``gemma4``
family (over core's generic family, which only accepts the type) with its tool format,
reasoning markers and loop default; the Gemma 4 template is detected, others are not."""

from __future__ import annotations

import pathlib

import pytest
from mlxcel.families.api import LoopPolicy
from mlxcel.model.loader import family_hint, load_checkpoint, select_family
from mlxcel.plugins import load_plugins
from mlxcel.testing.templates import STYLES, template_text
from mlxcel_family_gemma4 import plugin


@pytest.mark.parametrize("model_type", ["gemma4", "gemma4_text"])
def test_the_family_is_selected_over_the_builtin(model_type):
    families = load_plugins().families
    family = select_family(families, {"model_type": model_type}, pathlib.Path("."))
    assert family.name == "gemma4"
    assert families.owner("gemma4") == "family-gemma4"
    assert family_hint(model_type, family) is None  # no startup hint: nothing to install


def test_the_loaded_checkpoint_carries_the_family(gemma4_checkpoint):
    plugins = load_plugins()
    ckpt = load_checkpoint(str(gemma4_checkpoint), plugins.families,
                           tool_formats=plugins.tool_formats)
    assert ckpt.config["model_type"] == "gemma4_text"
    assert ckpt.family.name == "gemma4"
    assert (ckpt.reasoning.open, ckpt.reasoning.close) == STYLES["gemma4"].reasoning
    assert ckpt.reasoning.label == "thought"
    assert ckpt.family.loop_detection == LoopPolicy(min_pattern_size=1, max_pattern_size=20,
                                                    min_count=4)
    assert ckpt.family.batch_cache is None
    assert (ckpt.tool_format.name, ckpt.tool_format_reason) == \
        ("gemma4", plugins.tool_formats.choose("", family_default="gemma4")[1])
    # the markers are single tokens of the checkpoint, so they arrive whole
    tokenizer = ckpt.tokenizer
    for marker in (*plugin.TOOL_CALL, plugin.REASONING.open, plugin.REASONING.close, '<|"|>'):
        assert tokenizer.encode(marker) == [tokenizer.hf.token_to_id(marker)], marker


def test_the_gemma4_template_is_detected():
    fmt, why = load_plugins().tool_formats.choose(template_text("gemma4"))
    assert (fmt.name, why) == ("gemma4", "detected in the chat template")


@pytest.mark.parametrize("style", sorted(set(STYLES) - {"gemma4"}))
def test_no_other_style_is_detected(style):
    assert not plugin.detect(template_text(style))

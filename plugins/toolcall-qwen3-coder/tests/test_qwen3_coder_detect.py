"""Detection: the Qwen3-Coder template picks this format, even over a ``<tool_call>`` JSON
format that matches it too; other families' templates do not."""

from __future__ import annotations

import pytest
from mlxcel.errors import StartupError
from mlxcel.testing.templates import STYLES, template_text
from mlxcel.toolcalls.api import ToolFormat
from mlxcel.toolcalls.registry import ToolFormatRegistry
from mlxcel_toolcall_qwen3_coder import plugin
from mlxcel_toolcall_qwen3_coder.parser import CLOSE, OPEN

HERMES_LIKE = ToolFormat(name="tool-call-json", detect=lambda t: "<tool_call>" in t,
                         parser="json:loads", specificity=10)


def registry(*others: ToolFormat) -> ToolFormatRegistry:
    formats = ToolFormatRegistry()
    for other in others:
        formats.add(other)
    plugin.mlxcel_register_tool_formats(formats)
    return formats


def test_the_qwen3_coder_template_selects_it_over_tool_call_json():
    template = template_text("qwen3_coder")
    assert HERMES_LIKE.detect(template)  # the competitor matches too ...
    fmt, why = registry(HERMES_LIKE).choose(template)
    assert (fmt.name, why) == ("qwen3_coder", "detected in the chat template")  # ... and loses


def test_a_chatml_template_is_not_qwen3_coder():
    """Hermes' template writes <tool_call> but no <function=: the JSON format keeps it."""
    fmt, _ = registry(HERMES_LIKE).choose(template_text("chatml"))
    assert fmt.name == "tool-call-json"


@pytest.mark.parametrize("style", sorted(set(STYLES) - {"qwen3_coder"}))
def test_no_other_style_is_detected(style):
    assert not plugin.detect(template_text(style))


def test_each_marker_is_needed():
    template = template_text("qwen3_coder")
    for marker in plugin.MARKERS:
        assert not plugin.detect(template.replace(marker, "<x>"))


def test_an_equally_specific_rival_is_a_tie():
    rival = ToolFormat(name="rival", detect=plugin.detect, parser="json:loads",
                       specificity=plugin.SPECIFICITY)
    with pytest.raises(StartupError, match="qwen3_coder"):
        registry(rival).choose(template_text("qwen3_coder"))


def test_the_style_writes_the_markers_the_parser_reads():
    assert STYLES["qwen3_coder"].tool_call == (OPEN, CLOSE)


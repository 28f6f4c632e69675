"""acme-xml passes mlxcel's tool-format conformance runner; the acme family passes its own.

The fixtures are what an acme model writes: prose, then calls; several calls; nested JSON,
unicode and strings that contain the tags; a call with its keys the other way round; a
call cut off by the end of the answer, after and inside its arguments; tags around
something that is not a call; and text with no call at all.
"""

from __future__ import annotations

import json

from mlxcel.testing.checkpoint import cached_checkpoint
from mlxcel.testing.conformance import ToolFixture, check_family, check_tool_format

TEMPLATE = (
    "{%- if tools %}<|system|>To call a tool, write "
    '<acme_call>{"name": ..., "arguments": {...}}</acme_call>{%- endif %}'
)

FIXTURES = [
    ToolFixture(
        text='Let me check. <acme_call>{"name": "get_weather", "arguments": '
             '{"city": "Paris", "unit": "celsius"}}</acme_call>',
        calls=[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}],
        content="Let me check. ",
    ),
    ToolFixture(
        text='<acme_call>{"name": "search", "arguments": {"q": "mlx", "filters": '
             '{"year": [2024, 2025], "lang": null}}}</acme_call>\n'
             '<acme_call> {"name":"open","arguments":{}} </acme_call>',
        calls=[{"name": "search",
                "arguments": {"q": "mlx", "filters": {"year": [2024, 2025], "lang": None}}},
               {"name": "open", "arguments": {}}],
        content="\n",
    ),
    ToolFixture(
        text='Écrivons : <acme_call>{"name": "write", "arguments": {"path": "a<b>.txt", '
             '"text": "ends with </acme_call> \\"quoted\\" ☃ {[", "n": -1.5e3}}</acme_call>'
             " ✓",
        calls=[{"name": "write", "arguments": {"path": "a<b>.txt", "n": -1.5e3,
                                               "text": 'ends with </acme_call> "quoted" ☃ {['}}],
        content="Écrivons :  ✓",
    ),
    ToolFixture(
        text='<acme_call>{"arguments": {"x": "</acme_call>"}, "name": "backwards"}'
             "</acme_call>done",
        calls=[{"name": "backwards", "arguments": {"x": "</acme_call>"}}],
        content="done",
    ),
    ToolFixture(
        text='<acme_call>{"name": "cut", "arguments": {"x": [1, 2]}}',
        calls=[{"name": "cut", "arguments": {"x": [1, 2]}}],
        content="",
    ),
    ToolFixture(
        text='Writing. <acme_call>{"name": "write", "arguments": {"text": "unfinished',
        calls=[],
        content="Writing. ",
        errors=True,
    ),
    ToolFixture(
        text="<acme_call>not json</acme_call> and <acme_call>{\"name\": 7}</acme_call>",
        calls=[],
        content="<acme_call>not json</acme_call> and <acme_call>{\"name\": 7}</acme_call>",
        errors=True,
    ),
    ToolFixture(
        text="a < b and <acme> is not <acme_call without a closing tag",
        calls=[],
        content="a < b and <acme> is not <acme_call without a closing tag",
    ),
]


def test_acme_xml_conforms():
    check_tool_format("acme-xml", FIXTURES, template=TEMPLATE)


def test_acme_family_conforms(mlxcel_checkpoint_cache, tmp_path):
    """An acme_lm checkpoint is a Llama checkpoint under acme's own model_type."""
    import shutil

    llama = cached_checkpoint("llama", cache_dir=mlxcel_checkpoint_cache, dtype="float32")
    shutil.copytree(llama, tmp_path / "acme", dirs_exist_ok=True)
    config = json.loads((tmp_path / "acme" / "config.json").read_text())
    (tmp_path / "acme" / "config.json").write_text(json.dumps({**config,
                                                              "model_type": "acme_lm"}))
    check_family(tmp_path / "acme", "acme")

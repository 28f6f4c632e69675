"""End to end on a tiny checkpoint with the Qwen3-Coder template: with this distribution
installed, the loaded plugins hold its format, the checkpoint's own template selects it,
and an answer cut where that checkpoint's tokens end parses to the right calls."""

from __future__ import annotations

import json

import pytest
from mlxcel.types.toolcalls import CallStart
from qwen3_coder_fixtures import FIXTURES, TOOLS


@pytest.fixture(scope="module")
def loaded(mlxcel_checkpoint_cache):
    from mlxcel.model.loader import load_checkpoint
    from mlxcel.plugins import load_plugins
    from mlxcel.testing.checkpoint import cached_checkpoint

    path = cached_checkpoint("qwen3", cache_dir=mlxcel_checkpoint_cache, dtype="float32",
                             template="qwen3_coder")
    plugins = load_plugins()
    return plugins, load_checkpoint(str(path), plugins.families)


def test_the_checkpoint_template_selects_the_installed_format(loaded):
    plugins, checkpoint = loaded
    assert "qwen3_coder" in plugins.tool_formats
    assert plugins.tool_formats.owner("qwen3_coder") == "toolcall-qwen3-coder"
    fmt, why = plugins.tool_formats.choose(checkpoint.template.source)
    assert (fmt.name, why) == ("qwen3_coder", "detected in the chat template")


def test_an_answer_in_the_checkpoints_tokens_parses(loaded):
    """The answer as the engine would emit it: token by token through the detokenizer,
    ``<tool_call>`` an added token of its own."""
    from mlxcel.lazy import resolve
    from mlxcel.model.detokenizer import IncrementalDetokenizer

    plugins, checkpoint = loaded
    tokenizer, fixture = checkpoint.tokenizer, FIXTURES[3]
    ids = tokenizer.encode(fixture.text)
    assert tokenizer.decode(ids, skip_special=False) == fixture.text
    assert tokenizer.encode("<tool_call>") == [tokenizer.hf.token_to_id("<tool_call>")]
    parser = resolve(plugins.tool_formats.get("qwen3_coder").parser)(TOOLS)
    detok, events = IncrementalDetokenizer(tokenizer), []
    for token in ids:
        events += parser.feed(detok.add(token)[0], (token,))
    events += parser.feed(detok.flush())
    result = parser.finish()
    assert [e.name for e in [*events, *result.events] if isinstance(e, CallStart)] == \
        ["write_file"]
    assert [json.loads(c.arguments) for c in result.calls] == \
        [c["arguments"] for c in fixture.calls]

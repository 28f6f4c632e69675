"""Tests for mlxcel.testing.templates: six chat-template styles, each a checkpoint whose
template, added tokens, BOS and EOS look like the real model family's."""

from __future__ import annotations

import hashlib
import json
import pathlib

import pytest
from mlxcel.model.chat_template import ChatTemplate
from mlxcel.testing import build_checkpoint, build_tokenizer, cached_checkpoint
from mlxcel.testing import checkpoint as ckpt_mod
from mlxcel.testing.templates import STYLES, style
from mlxcel.testing.tokenizer import chat_template_text

NAMES = tuple(STYLES)
# sha256 of the one bundled template before styles existed: default builds keep it
CHATML_SHA256 = "1d515255add98f4bc2c754a034103d0bdc788a4d9b1cb0e341ca208b8ed5fed4"

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "City name"},
        "days": {"type": "integer"}}}}}]
ARGS = {"city": "Paris", "days": 2}


def _call(name="get_weather", arguments=ARGS, call_id="call_000000001"):
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _conversation(arguments=ARGS):
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [_call(arguments=arguments)]},
        {"role": "tool", "tool_call_id": "call_000000001", "content": '{"temp": 20}'},
        {"role": "user", "content": "And tomorrow?"},
    ]


# Fixture strings written from each family's real format, not from the templates.
CALLS = {
    "chatml": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
              '\n</tool_call><|im_end|>',
    "llama3": '<|start_header_id|>assistant<|end_header_id|>\n\n'
              '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}<|eot_id|>',
    "mistral": '[/INST][TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2}</s>',
    "gemma4": '<|turn>model\n<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}'
              '<tool_call|>',
    "qwen3_coder": '<|im_start|>assistant\n<tool_call>\n<function=get_weather>\n'
                   '<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n'
                   '</function>\n</tool_call><|im_end|>',
    "harmony": '<|start|>assistant to=functions.get_weather<|channel|>commentary '
               '<|constrain|>json<|message|>{"city": "Paris", "days": 2}<|call|>',
}
RESULTS = {
    "chatml": '<|im_start|>user\n<tool_response>\n{"temp": 20}\n</tool_response><|im_end|>',
    "llama3": '<|start_header_id|>ipython<|end_header_id|>\n\n{"temp": 20}<|eot_id|>',
    "mistral": '[TOOL_RESULTS]{"temp": 20}[/TOOL_RESULTS]',
    "gemma4": '<tool_call|><|tool_response>response:get_weather{value:<|"|>{"temp": 20}<|"|>}'
              '<tool_response|><turn|>\n',
    "qwen3_coder": '<|im_start|>user\n<tool_response>\n{"temp": 20}\n</tool_response>\n'
                   '<|im_end|>',
    "harmony": '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>'
               '{"temp": 20}<|end|>',
}
TOOL_DECLARATIONS = {
    "chatml": '<tools>\n{"type": "function", "function": {"name": "get_weather"',
    "llama3": '<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions',
    "mistral": '[AVAILABLE_TOOLS][{"type": "function", "function": {"name": "get_weather"',
    "gemma4": '<|tool>declaration:get_weather{description:<|"|>Weather for a city<|"|>,'
              'parameters:{properties:{city:{description:<|"|>City name<|"|>,'
              'type:<|"|>STRING<|"|>},days:{type:<|"|>INTEGER<|"|>}},'
              'required:[<|"|>city<|"|>],type:<|"|>OBJECT<|"|>}}<tool|>',
    "qwen3_coder": '<tools>\n<function>\n<name>get_weather</name>\n'
                   '<description>Weather for a city</description>\n<parameters>\n'
                   '<parameter>\n<name>city</name>\n<type>string</type>',
    "harmony": '<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n'
               '## functions\n\nnamespace functions {\n\n// Weather for a city\n'
               'type get_weather = (_: {\n// City name\ncity: string,\ndays?: number,\n'
               '}) => any;',
}
NEXT_USER_AND_PROMPT = {
    "chatml": "<|im_start|>user\nAnd tomorrow?<|im_end|>\n<|im_start|>assistant\n",
    "llama3": "<|start_header_id|>user<|end_header_id|>\n\nAnd tomorrow?<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "mistral": "[INST]And tomorrow?[/INST]",
    "gemma4": "<|turn>user\nAnd tomorrow?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>",
    "qwen3_coder": "<|im_start|>user\nAnd tomorrow?<|im_end|>\n<|im_start|>assistant\n",
    "harmony": "<|start|>user<|message|>And tomorrow?<|end|><|start|>assistant",
}


@pytest.fixture(scope="module", params=NAMES)
def styled(request, mlxcel_checkpoint_cache) -> tuple[str, pathlib.Path]:
    path = cached_checkpoint("qwen3", cache_dir=mlxcel_checkpoint_cache, dtype="float32",
                             vocab_size=384, template=request.param)
    return request.param, path


def _json(path: pathlib.Path, name: str) -> dict:
    return json.loads((path / name).read_text())


def _template(path: pathlib.Path) -> ChatTemplate:
    """The template as mlxcel's loader builds it from a checkpoint."""
    from mlxcel.model.chat_template import load_chat_template
    from mlxcel.model.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(path)
    return load_chat_template(path, tok.config, override=None, bos_token=tok.bos_token,
                              eos_token=tok.eos_token)


def _render(name: str, messages, **kw) -> str:
    st = style(name)
    return ChatTemplate(st.template(), bos_token=st.bos, eos_token=st.eos[0]).render(
        messages, **kw)


# -- the checkpoint: mlxcel loads and serves it ---------------------------------------------


def test_each_style_serves_a_request(styled):
    from mlxcel.testing.engine import run_until_done, submit, worker_for

    name, path = styled
    worker = worker_for(path, parallel=1)
    ckpt = worker.checkpoint
    assert ckpt.template.origin == "tokenizer_config.json"
    assert ckpt.template.source == chat_template_text(name)
    text = ckpt.template.render(_conversation(), tools=TOOLS)
    assert CALLS[name] in text
    hf = ckpt.tokenizer.hf
    assert worker.eos_ids == {hf.token_to_id(t) for t in STYLES[name].eos}
    sink = submit(worker, ckpt.tokenizer.encode(text), max_tokens=3)
    run_until_done(worker, [sink])
    assert len(sink.tokens) == 3 and sink.last.finish_reason is not None


def test_transformers_renders_the_same_text(styled):
    transformers = pytest.importorskip("transformers")
    name, path = styled
    hf = transformers.AutoTokenizer.from_pretrained(str(path))
    ours = _template(path).render(_conversation(), tools=TOOLS)
    assert hf.apply_chat_template(_conversation(), tools=TOOLS, add_generation_prompt=True,
                                  tokenize=False) == ours


# -- the template: the family's wire format --------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_conversation_renders_the_familys_syntax(name):
    text = _render(name, _conversation(), tools=TOOLS)
    for part in (CALLS[name], RESULTS[name], TOOL_DECLARATIONS[name]):
        assert part in text, part
    assert text.endswith(NEXT_USER_AND_PROMPT[name])
    assert text.index(CALLS[name]) < text.index(RESULTS[name])
    bos = STYLES[name].bos
    assert (bos is not None and text.startswith(bos)) is (name in ("llama3", "mistral", "gemma4"))


@pytest.mark.parametrize("name", NAMES)
def test_string_arguments_render_as_given(name):
    text = _render(name, _conversation(arguments=json.dumps(ARGS)), tools=TOOLS)
    assert json.dumps(ARGS) in text
    if name in ("chatml", "llama3", "mistral", "harmony"):  # JSON on the wire either way
        assert text == _render(name, _conversation(), tools=TOOLS)


def _wire_call(name: str, text: str) -> dict:
    """The one call in a rendered prompt, parsed the way the family's parser does."""
    from mlx_lm.tool_parsers import gemma4, json_tools, mistral, qwen3_coder

    if name == "llama3":  # no marker before a JSON call: it fills the assistant turn
        turn = text.split("<|start_header_id|>assistant<|end_header_id|>\n\n")[1]
        call = json.loads(turn.split("<|eot_id|>")[0])
        return {"name": call["name"], "arguments": call["parameters"]}
    start, end = STYLES[name].tool_call
    body = text.rsplit(start, 1)[1]  # chatml's and qwen3_coder's system turns show one too
    if name == "chatml":
        return json_tools.parse_tool_call(body.split(end)[0])
    if name == "qwen3_coder":
        return qwen3_coder.parse_tool_call(body.split(end)[0], TOOLS)
    if name == "gemma4":
        return gemma4.parse_tool_call(body.split(end)[0])
    if name == "mistral":
        return mistral.parse_tool_call(body.split("</s>")[0])
    recipient, args = body.split(end)[0].split("<|message|>")
    return {"name": recipient.split("<|channel|>")[0], "arguments": json.loads(args)}


@pytest.mark.parametrize("name", NAMES)
def test_rendered_call_parses_back(name):
    text = _render(name, _conversation(), tools=TOOLS)
    assert _wire_call(name, text) == {"name": "get_weather", "arguments": ARGS}


@pytest.mark.parametrize("name", ["gemma4", "harmony"])
def test_results_are_named_by_tool_call_id(name):
    calls = [_call(call_id="call_000000001"),
             _call("get_time", {"tz": "CET"}, call_id="call_000000002")]
    messages = [{"role": "user", "content": "Weather and time?"},
                {"role": "assistant", "content": "", "tool_calls": calls},
                {"role": "tool", "tool_call_id": "call_000000002", "content": "12:00"},
                {"role": "tool", "tool_call_id": "call_000000001", "content": "sunny"}]
    text = _render(name, messages, tools=TOOLS)
    if name == "gemma4":
        first = 'response:get_time{value:<|"|>12:00<|"|>}'
        second = 'response:get_weather{value:<|"|>sunny<|"|>}'
        assert text.endswith("<tool_response|><|channel>thought\n<channel|>")  # turn open
    else:
        first = "<|start|>functions.get_time to=assistant<|channel|>commentary<|message|>12:00"
        second = "functions.get_weather to=assistant<|channel|>commentary<|message|>sunny"
    assert first in text and second in text and text.index(first) < text.index(second)


@pytest.mark.parametrize("name", [n for n in NAMES if STYLES[n].reasoning])
def test_reasoning_renders_between_the_styles_markers(name):
    start, end = STYLES[name].reasoning
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "reasoning_content": "Look it up.",
                 "tool_calls": [_call()]},
                {"role": "tool", "tool_call_id": "call_000000001", "content": "sunny"}]
    text = _render(name, messages, tools=TOOLS)
    assert start in text and end in text.split(start, 1)[1]
    assert text.split(start, 1)[1].split(end)[0].strip() in ("Look it up.", "thought\nLook it up.")


def test_llama3_builtin_tools_use_python_tag_and_eom():
    messages = [{"role": "user", "content": "Search"},
                {"role": "assistant", "tool_calls": [_call("brave_search", {"query": "mlx"})]}]
    text = _render("llama3", messages, builtin_tools=["brave_search"],
                   add_generation_prompt=False)
    assert "Environment: ipython\nTools: brave_search\n\n" in text
    assert text.endswith('<|python_tag|>brave_search.call(query="mlx")<|eom_id|>')


# -- the tokenizer: markers, special flags, BOS and EOS --------------------------------------


def test_markers_are_single_tokens_and_special_ones_vanish(styled):
    from mlxcel.model.tokenizer import Tokenizer

    name, path = styled
    st = STYLES[name]
    tok = Tokenizer.from_dir(path)
    decoder = _json(path, "tokenizer_config.json")["added_tokens_decoder"]
    flags = {v["content"]: v["special"] for v in decoder.values()}
    for marker in st.markers:
        special = marker in st.special
        ids = tok.encode(marker)
        assert ids == [tok.hf.token_to_id(marker)], marker
        assert tok.decode(ids, skip_special=False) == marker
        ids = tok.encode(f"a{marker}b")
        assert tok.decode(ids, skip_special=False) == f"a{marker}b"
        assert tok.decode(ids, skip_special=True) == ("ab" if special else f"a{marker}b")
        assert flags[marker] is special, marker


def test_bos_eos_and_maps_are_the_styles(styled):
    name, path = styled
    st = STYLES[name]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in st.markers}
    gen, cfg = _json(path, "generation_config.json"), _json(path, "config.json")
    tok_cfg, tok_map = _json(path, "tokenizer_config.json"), _json(path, "special_tokens_map.json")
    assert gen["eos_token_id"] == [ids[t] for t in st.eos]
    assert cfg["eos_token_id"] == ids[st.eos[0]] and tok_cfg["eos_token"] == st.eos[0]
    assert tok_map["eos_token"] == st.eos[0]
    assert tok_cfg["bos_token"] == st.bos and tok_map.get("bos_token") == st.bos
    assert tok_cfg["pad_token"] == st.pad and tok_map.get("pad_token") == st.pad
    assert cfg["bos_token_id"] == gen["bos_token_id"] == ids[st.bos or st.pad]
    assert set(tok_map["additional_special_tokens"]) == set(st.special) - {st.bos, st.pad}
    first = tok.encode("hi").ids[0]
    assert (first == ids.get(st.bos)) is st.add_bos
    assert tok_cfg["add_bos_token"] is st.add_bos


def test_the_style_not_the_shape_picks_the_bos():
    tok = build_tokenizer("llama", 384, template="mistral")  # llama-shape chatml: <|begin_of_text|>
    assert tok.token_to_id("<|begin_of_text|>") is None
    assert tok.encode("hi").ids[0] == tok.token_to_id("<s>")
    chatml = build_tokenizer("llama", 384)
    assert chatml.encode("hi").ids[0] == chatml.token_to_id("<|begin_of_text|>")


# -- defaults and arguments -----------------------------------------------------------------


def test_default_template_is_todays(tmp_path):
    assert hashlib.sha256(chat_template_text().encode()).hexdigest() == CHATML_SHA256
    path = build_checkpoint(tmp_path / "d", num_layers=1, vocab_size=300, dtype="float32")
    source = _json(path, "tokenizer_config.json")["chat_template"]
    assert hashlib.sha256(source.encode()).hexdigest() == CHATML_SHA256
    same = build_checkpoint(tmp_path / "c", num_layers=1, vocab_size=300, dtype="float32",
                            template="chatml")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (path / name).read_bytes() == (same / name).read_bytes(), name


def test_cache_key_includes_the_style():
    keys = {name: ckpt_mod._cache_key("qwen3", {"template": name}) for name in NAMES}
    assert len(set(keys.values())) == len(NAMES)
    assert keys["chatml"] == ckpt_mod._cache_key("qwen3", {})  # old default keys stay


def test_unknown_template_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown template 'chatgpt'.*llama3"):
        build_checkpoint(tmp_path / "x", template="chatgpt")
    with pytest.raises(ValueError, match="unknown template"):
        build_tokenizer("qwen3", 512, template="nope")
    assert not (tmp_path / "x").exists()

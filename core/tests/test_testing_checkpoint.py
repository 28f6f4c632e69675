"""Tests for mlxcel.testing: tiny checkpoints, tokenizer, chat template, plugin."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from mlxcel.testing import build_checkpoint, build_tokenizer, cached_checkpoint
from mlxcel.testing import checkpoint as ckpt_mod
from mlxcel.testing.tokenizer import chat_template_text

MULTIBYTE = "Grüße, café — 안녕하세요 日本語 中文 🚀👨‍👩‍👧‍👦 ∑π\n\tdone"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def _load(path: pathlib.Path):
    from mlx_lm.utils import load_model

    return load_model(path)


def _logits(model, ids: list[int]):
    import mlx.core as mx

    out = model(mx.array([ids]))
    mx.eval(out)
    return out


def _tokenizer(path: pathlib.Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path / "tokenizer.json"))


def _config(path: pathlib.Path) -> dict:
    return json.loads((path / "config.json").read_text())


def _render(**kw) -> str:
    """Render the bundled template the way transformers does."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise ValueError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(chat_template_text()).render(**kw)


# -- checkpoints load and run -------------------------------------------------


@pytest.mark.parametrize(
    "fixture, arch, tied",
    [
        ("tiny_checkpoint", "Qwen3ForCausalLM", True),
        ("tiny_llama_checkpoint", "LlamaForCausalLM", False),
    ],
)
def test_checkpoint_loads_and_runs(request, fixture, arch, tied):
    path = request.getfixturevalue(fixture)
    model, config = _load(path)
    assert config["architectures"] == [arch]
    assert config["tie_word_embeddings"] is tied
    assert config["max_position_embeddings"] == 4096
    ids = _tokenizer(path).encode("Hello world, this is a test.").ids
    out = _logits(model, ids)
    assert out.shape == (1, len(ids), config["vocab_size"])


def test_quantized_checkpoint_loads_and_runs(tmp_path):
    import mlx.core as mx
    import mlx.nn as nn

    path = build_checkpoint(tmp_path / "q4", quantize_bits=4)
    model, config = _load(path)
    assert config["quantization"]["bits"] == 4
    assert 64 % config["quantization"]["group_size"] == 0
    kinds = {type(m) for _, m in model.named_modules()}
    assert nn.QuantizedLinear in kinds and nn.QuantizedEmbedding in kinds
    out = _logits(model, [1, 2, 3])
    assert out.shape == (1, 3, 512)
    assert mx.all(mx.isfinite(out)).item()


def test_mlx_lm_load_with_transformers_tokenizer(tiny_checkpoint):
    import mlx_lm

    _, tok = mlx_lm.load(str(tiny_checkpoint))
    assert tok.decode(tok.encode(MULTIBYTE)) == MULTIBYTE
    assert set(tok.eos_token_ids) == {
        tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")
    }
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert text == _render(
        messages=[{"role": "user", "content": "hi"}],
        tools=TOOLS,
        add_generation_prompt=True,
        enable_thinking=True,
    )
    assert '"name": "get_weather"' in text and text.endswith("<|im_start|>assistant\n")


# -- tokenizer ------------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["tiny_checkpoint", "tiny_llama_checkpoint"])
def test_tokenizer_round_trips_multibyte_text(request, fixture):
    tok = _tokenizer(request.getfixturevalue(fixture))
    ids = tok.encode(MULTIBYTE, add_special_tokens=False).ids
    assert tok.decode(ids) == MULTIBYTE
    assert len(ids) < len(MULTIBYTE.encode())  # merges were learned
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</tool_call>"):
        assert tok.encode(special, add_special_tokens=False).ids == [tok.token_to_id(special)]


@pytest.mark.parametrize("fixture", ["tiny_checkpoint", "tiny_llama_checkpoint"])
def test_vocab_sizes_agree(request, fixture):
    from safetensors import safe_open

    path = request.getfixturevalue(fixture)
    vocab = _config(path)["vocab_size"]
    assert _tokenizer(path).get_vocab_size(with_added_tokens=True) == vocab == 512
    with safe_open(str(path / "model.safetensors"), "numpy") as f:
        assert f.metadata() == {"format": "mlx"}
        assert f.get_slice("model.embed_tokens.weight").get_shape()[0] == vocab


@pytest.mark.parametrize("vocab_size", [300, 777, 4000])
def test_tokenizer_vocab_size_is_exact(vocab_size):
    assert build_tokenizer("qwen3", vocab_size).get_vocab_size(with_added_tokens=True) == vocab_size


def test_llama_prepends_bos_and_qwen3_does_not(tiny_checkpoint, tiny_llama_checkpoint):
    qwen, llama = _tokenizer(tiny_checkpoint), _tokenizer(tiny_llama_checkpoint)
    bos = llama.token_to_id("<|begin_of_text|>")
    assert llama.encode("hi").ids[0] == bos
    assert bos not in llama.encode("hi", add_special_tokens=False).ids
    assert qwen.token_to_id("<|begin_of_text|>") is None
    assert qwen.encode("hi").ids == qwen.encode("hi", add_special_tokens=False).ids
    assert _config(tiny_llama_checkpoint)["bos_token_id"] == bos
    tok_cfg = json.loads((tiny_checkpoint / "tokenizer_config.json").read_text())
    assert tok_cfg["bos_token"] is None and tok_cfg["eos_token"] == "<|im_end|>"
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast"


# -- chat template ----------------------------------------------------------------


def test_template_basic_chatml():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert _render(messages=messages, add_generation_prompt=True) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert _render(messages=messages).endswith("<|im_start|>user\nHi<|im_end|>\n")


def test_template_tools_only_when_given():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]
    plain = _render(messages=messages, add_generation_prompt=True)
    assert "<tools>" not in plain and "get_weather" not in plain
    with_tools = _render(messages=messages, tools=TOOLS, add_generation_prompt=True)
    assert with_tools.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in with_tools
    assert "<tool_call>" in with_tools and with_tools.count("<|im_start|>system") == 1


def test_template_renders_tool_calls_and_responses():
    messages = [
        {"role": "user", "content": "Weather in Paris and Tokyo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                },
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Tokyo"}'},
                },
            ],
        },
        {"role": "tool", "content": '{"temp": 20}'},
        {"role": "tool", "content": '{"temp": 25}'},
    ]
    out = _render(messages=messages, tools=TOOLS)
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>\n{"temp": 20}\n</tool_response>\n'
        '<tool_response>\n{"temp": 25}\n</tool_response><|im_end|>\n'
    ) in out


def test_template_thinking():
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Add them."},
        {"role": "user", "content": "3+3?"},
    ]
    out = _render(messages=messages, add_generation_prompt=True, enable_thinking=False)
    assert "<|im_start|>assistant\n<think>\nAdd them.\n</think>\n\n4<|im_end|>\n" in out
    assert out.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert _render(messages=messages, add_generation_prompt=True, enable_thinking=True).endswith(
        "<|im_start|>assistant\n"
    )


def test_template_llama_bos_and_errors():
    out = _render(messages=[{"role": "user", "content": "x"}], bos_token="<|begin_of_text|>")
    assert out.startswith("<|begin_of_text|><|im_start|>user\n")
    with pytest.raises(ValueError, match="system message"):
        _render(messages=[{"role": "user", "content": "x"}, {"role": "system", "content": "y"}])


# -- build properties -------------------------------------------------------------


def test_build_is_deterministic(tmp_path):
    a = build_checkpoint(tmp_path / "a", "llama", seed=3)
    b = build_checkpoint(tmp_path / "b", "llama", seed=3)
    c = build_checkpoint(tmp_path / "c", "llama", seed=4)
    for name in ("tokenizer.json", "model.safetensors", "config.json", "tokenizer_config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


def test_generation_config(tmp_path):
    path = build_checkpoint(tmp_path / "g", generation_config={"temperature": 0.6, "top_k": 20})
    gen = json.loads((path / "generation_config.json").read_text())
    tok = _tokenizer(path)
    assert gen["eos_token_id"] == [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    assert gen["temperature"] == 0.6 and gen["top_k"] == 20
    assert _config(path)["eos_token_id"] == tok.token_to_id("<|im_end|>")


def test_extra_special_tokens(tmp_path):
    fim = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
    path = build_checkpoint(tmp_path / "f", vocab_size=512, extra_special_tokens=fim)
    tok = _tokenizer(path)
    assert tok.get_vocab_size(with_added_tokens=True) == 512
    decoder = json.loads((path / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    specials = {v["content"] for v in decoder.values() if v["special"]}
    assert set(fim) <= specials
    assert [tok.token_to_id(t) for t in fim] == tok.encode("".join(fim)).ids
    # the default build's cache key (and so every cached checkpoint) is unchanged
    assert ckpt_mod._cache_key("qwen3", {"extra_special_tokens": ()}) == \
        ckpt_mod._cache_key("qwen3", {})
    assert ckpt_mod._cache_key("qwen3", {"extra_special_tokens": fim}) != \
        ckpt_mod._cache_key("qwen3", {})


def test_cached_checkpoint_reuses_dir(tmp_path):
    first = cached_checkpoint("qwen3", tmp_path, num_layers=1)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert cached_checkpoint("qwen3", tmp_path, num_layers=1, seed=0) == first  # explicit default
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    other = cached_checkpoint("qwen3", tmp_path, num_layers=1, seed=1)
    assert other != first and (other / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, other.name])


def test_cached_checkpoint_loses_race_cleanly(tmp_path, monkeypatch):
    real_build = ckpt_mod.build_checkpoint

    def racing_build(path, shape, **kw):
        real_build(path, shape, **kw)
        winner = tmp_path / f"{shape}-{ckpt_mod._cache_key(shape, kw)}"
        real_build(winner, shape, **kw)  # another process finished first
        (winner / "winner").touch()

    monkeypatch.setattr(ckpt_mod, "build_checkpoint", racing_build)
    path = cached_checkpoint("qwen3", tmp_path, num_layers=1)
    assert (path / "winner").exists()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # temp dir removed


def test_default_cache_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("MLXCEL_CACHE_DIR", str(tmp_path))
    assert ckpt_mod.default_cache_dir() == tmp_path / "checkpoints"
    monkeypatch.delenv("MLXCEL_CACHE_DIR")
    assert ckpt_mod.default_cache_dir() == pathlib.Path.home() / ".cache" / "mlxcel" / "checkpoints"


@pytest.mark.parametrize("shape", ["qwen3", "llama"])
def test_suppress_eos_zeroes_eos_logits(tmp_path, shape):
    import mlx.core as mx

    path = build_checkpoint(tmp_path / shape, shape, suppress_eos=True)
    model, config = _load(path)
    assert config["tie_word_embeddings"] is False
    eos = json.loads((path / "generation_config.json").read_text())["eos_token_id"]
    out = _logits(model, _tokenizer(path).encode("The quick brown fox").ids)
    assert mx.all(out[..., mx.array(eos)] == 0).item()
    assert mx.any(out != 0).item()


def test_bad_arguments_rejected(tmp_path):
    with pytest.raises(ValueError, match="shape"):
        build_checkpoint(tmp_path / "x", "gpt2")
    with pytest.raises(ValueError, match="dtype"):
        build_checkpoint(tmp_path / "x", dtype="int8")
    with pytest.raises(ValueError, match="vocab_size"):
        build_tokenizer("qwen3", 100)


def test_plugin_import_is_light():
    code = (
        "import sys, mlxcel.testing, mlxcel.testing.pytest_plugin\n"
        "heavy = {'mlx', 'mlx_lm', 'transformers', 'numpy', 'tokenizers'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)

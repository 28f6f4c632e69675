"""Chat-template styles for test checkpoints: each is one real model family's template shape
(a ``<name>.jinja`` here) plus the facts about its tokenizer that tests read.

A style names the tokens its tokenizer adds, which of them are special (turn and control
markers, dropped by ``decode(skip_special=True)`` as the real tokenizer drops them), its
BOS, its EOS tokens, and the wire markers of a tool call and of reasoning, so that a test
of a tool-call or reasoning format can build a checkpoint that looks like the family's and
ask this table, not a copy of it, which tokens to expect. Plain data: importing this module
imports neither jinja2 nor tokenizers.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

DEFAULT = "chatml"


@dataclass(frozen=True)
class Style:
    """One template style.

    ``special``/``plain``: the added tokens, special first, each group in id order.
    ``bos``: the BOS token (None: the family has none); ``add_bos``: the tokenizer's
    post-processor prepends it to ``encode(add_special_tokens=True)``. ``eos``: the
    ``eos_token_id`` tokens of generation_config.json; ``eos[0]`` is tokenizer_config's
    ``eos_token`` and config.json's ``eos_token_id``. ``tool_call``: the (start, end)
    strings around one call in the model's output, ``""`` where there is none (the markers
    a tool parser looks for). ``reasoning``: (start, end) around reasoning text, or None.
    """

    name: str
    special: tuple[str, ...]
    plain: tuple[str, ...]
    bos: str | None
    add_bos: bool
    eos: tuple[str, ...]
    pad: str | None
    tool_call: tuple[str, str]
    reasoning: tuple[str, str] | None

    @property
    def markers(self) -> tuple[str, ...]:
        """Every added token of the style (a llama-shape ``chatml`` checkpoint adds
        ``<|begin_of_text|>`` as well)."""
        return self.special + self.plain

    def template(self) -> str:
        """The style's chat template source."""
        return template_text(self.name)


_QWEN = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

STYLES: dict[str, Style] = {
    # Hermes / Qwen3: ChatML turns, <think> reasoning, JSON in <tool_call>.
    "chatml": Style(
        name="chatml", special=_QWEN,
        plain=("<think>", "</think>", "<tool_call>", "</tool_call>"),
        bos=None, add_bos=False, eos=("<|im_end|>", "<|endoftext|>"), pad="<|endoftext|>",
        tool_call=("<tool_call>", "</tool_call>"), reasoning=("<think>", "</think>")),
    # Llama 3.1 / 3.2: header turns, JSON calls, ipython results, <|python_tag|> builtins.
    "llama3": Style(
        name="llama3",
        special=("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                 "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"),
        plain=(), bos="<|begin_of_text|>", add_bos=True,
        eos=("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"), pad=None,
        tool_call=("<|python_tag|>", ""), reasoning=None),
    # Mistral v11 (Small 3.2, Devstral) with Magistral's [THINK]: name[ARGS]{json} calls.
    "mistral": Style(
        name="mistral",
        special=("<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]",
                 "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]",
                 "<pad>", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[ARGS]", "[THINK]",
                 "[/THINK]"),
        plain=(), bos="<s>", add_bos=True, eos=("</s>",), pad="<pad>",
        tool_call=("[TOOL_CALLS]", ""), reasoning=("[THINK]", "[/THINK]")),
    # Gemma 4: <|turn>/<turn|>, call:name{k:<|"|>v<|"|>}, a "thought" channel.
    "gemma4": Style(
        name="gemma4",
        special=("<pad>", "<eos>", "<bos>", "<|tool>", "<tool|>", "<|tool_call>",
                 "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>',
                 "<|think|>", "<|channel>", "<channel|>", "<|turn>", "<turn|>"),
        plain=(), bos="<bos>", add_bos=True, eos=("<eos>", "<turn|>", "<|tool_response>"),
        pad="<pad>", tool_call=("<|tool_call>", "<tool_call|>"),
        reasoning=("<|channel>", "<channel|>")),
    # Qwen3-Coder: ChatML turns, XML tools, <function=name><parameter=k> calls.
    "qwen3_coder": Style(
        name="qwen3_coder", special=_QWEN,
        plain=("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
        bos=None, add_bos=False, eos=("<|im_end|>", "<|endoftext|>"), pad="<|endoftext|>",
        tool_call=("<tool_call>", "</tool_call>"), reasoning=None),
    # gpt-oss harmony: channels, functions.* recipients, <|call|> ends a call.
    "harmony": Style(
        name="harmony",
        special=("<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>",
                 "<|channel|>", "<|start|>", "<|end|>", "<|message|>", "<|call|>"),
        plain=(), bos="<|startoftext|>", add_bos=False,
        eos=("<|return|>", "<|call|>", "<|endoftext|>"), pad="<|endoftext|>",
        tool_call=("to=functions.", "<|call|>"),
        reasoning=("<|channel|>analysis<|message|>", "<|end|>")),
}


def style(name: str) -> Style:
    """The style called ``name``; ``ValueError`` naming the known ones otherwise."""
    try:
        return STYLES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown template {name!r}; expected one of {tuple(STYLES)}") \
            from None


def template_text(name: str = DEFAULT) -> str:
    """The chat template source of style ``name``."""
    style(name)
    return resources.files(__package__).joinpath(f"{name}.jinja").read_text("utf-8")

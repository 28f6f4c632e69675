"""llama.cpp's built-in chat templates, as Jinja files: what ``--chat-template NAME`` picks,
and what ``--no-jinja`` falls back to.

llama-server formats a chat without Jinja through a fixed list of named formats
(``llama_chat_apply_template``), and picks one for a model by looking for each format's
markers in the model's own template. Each ``<name>.jinja`` here renders the same text as
that named format (mlxcel always renders Jinja, so a built-in format is one more Jinja
template), starting with ``bos_token`` since mlxcel tokenizes the rendered prompt without
adding special tokens. The names are llama.cpp's, so a command line carries over.
"""

from __future__ import annotations

import argparse
from functools import cache
from importlib import resources

_FILES = resources.files(__name__)
BUILTIN_NAMES: tuple[str, ...] = tuple(sorted(
    entry.name.removesuffix(".jinja") for entry in _FILES.iterdir()
    if entry.name.endswith(".jinja")))


@cache
def builtin_source(name: str) -> str:
    """The Jinja source of the built-in template ``name`` (KeyError when unknown)."""
    if name not in BUILTIN_NAMES:
        raise KeyError(name)
    return (_FILES / f"{name}.jinja").read_text(encoding="utf-8")


def looks_like_jinja(value: str) -> bool:
    """A ``--chat-template`` value that holds a Jinja tag is a template itself (as
    llama-server takes it), not a name."""
    return "{{" in value or "{%" in value


def chat_template_value(raw: str) -> str:
    """The ``--chat-template`` option's type: a built-in name, or a Jinja template string;
    anything else refuses to start, listing the names."""
    value = raw.strip()
    if value in BUILTIN_NAMES or looks_like_jinja(raw):
        return value if value in BUILTIN_NAMES else raw
    raise argparse.ArgumentTypeError(
        f"unknown chat template {value!r}: give a Jinja template or one of "
        f"{', '.join(BUILTIN_NAMES)}")


# llama.cpp's detection order (llm_chat_detect_template): the first rule whose markers
# are all in the model's template, and none of its absent ones, names its format.
_DETECT: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("phi4", ("<|im_start|>", "<|im_sep|>"), ()),
    ("smolvlm", ("<|im_start|>", "<end_of_utterance>"), ()),
    ("chatml", ("<|im_start|>",), ()),
    ("mistral-v7", ("[INST]", "[SYSTEM_PROMPT]"), ()),
    ("mistral-v1", ("[INST]", "' [INST] ' + system_message"), ()),
    ("mistral-v3-tekken", ("[INST]", "[AVAILABLE_TOOLS]", '"[INST]"'), (" [INST]",)),
    ("mistral-v1", ("[INST]", "[AVAILABLE_TOOLS]", " [INST]"), ()),
    ("mistral-v3", ("[INST]", "[AVAILABLE_TOOLS]"), ()),
    ("llama2-sys-strip", ("[INST]", "content.strip()"), ()),
    ("llama2-sys-bos", ("[INST]", "bos_token + '[INST]"), ()),
    ("llama2-sys", ("[INST]", "<<SYS>>"), ()),
    ("llama2", ("[INST]",), ()),
    ("phi3", ("<|assistant|>", "<|end|>"), ()),
    ("chatglm4", ("[gMASK]<sop>",), ()),
    ("falcon3", ("<|assistant|>", "<|user|>", "</s>"), ()),
    ("glmedge", ("<|assistant|>", "<|user|>"), ()),
    ("zephyr", ("<|user|>", "<|endoftext|>"), ()),
    ("monarch", ("bos_token + message['role']",), ()),
    ("gemma", ("<start_of_turn>",), ()),
    ("orion", ("'\\n\\nAssistant: ' + eos_token",), ()),
    ("openchat", ("GPT4 Correct ",), ()),
    ("vicuna-orca", ("USER: ", "ASSISTANT: ", "SYSTEM: "), ()),
    ("vicuna", ("USER: ", "ASSISTANT: "), ()),
    ("deepseek", ("### Instruction:", "<|EOT|>"), ()),
    ("command-r", ("<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"), ()),
    ("llama3", ("<|start_header_id|>", "<|end_header_id|>"), ()),
    ("chatglm3", ("[gMASK]sop",), ()),
    ("minicpm", ("<用户>",), ()),
    ("deepseek2", ("'Assistant: ' + message['content'] + eos_token",), ()),
    ("deepseek3", ("<｜Assistant｜>", "<｜User｜>", "<｜end▁of▁sentence｜>"), ()),
    ("exaone4", ("[|system|]", "[|assistant|]", "[|endofturn|]", "[|tool|]"), ()),
    ("exaone3", ("[|system|]", "[|assistant|]", "[|endofturn|]"), ()),
    ("granite", ("<|start_of_role|>",), ()),
    ("megrez", ("<|role_start|>",), ()),
    ("bailing", ("<role>ASSISTANT</role>", "'HUMAN'"), ()),
    ("llama4", ("<|header_start|>", "<|header_end|>"), ()),
)


def detect_builtin(source: str) -> str | None:
    """The built-in format whose markers ``source`` (a model's Jinja template) shows,
    checked in llama.cpp's order; None when none matches."""
    if source.strip() in BUILTIN_NAMES:
        return source.strip()
    for name, markers, absent in _DETECT:
        if all(m in source for m in markers) and not any(a in source for a in absent):
            return name
    return None

"""llama.cpp's built-in chat formats as shipped Jinja templates (``--chat-template NAME``),
and ``--no-jinja``'s detection of the format a model's template shows.

The expected prompts are written out from llama.cpp's ``llm_chat_apply_template`` (what
each named format renders for a system, user, assistant, user conversation), so each
template is checked against llama.cpp's text, not against itself.
"""

from __future__ import annotations

import argparse

import pytest
from apphelpers import make_client, wait_ready
from mlxcel.errors import InvalidRequest
from mlxcel.model.chat_template import ChatTemplate
from mlxcel.model.chat_templates import (
    BUILTIN_NAMES,
    builtin_source,
    chat_template_value,
    detect_builtin,
)

MESSAGES = [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"},
            {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"}]
EOS = "<｜end▁of▁sentence｜>"
CMD = "<|START_OF_TURN_TOKEN|>"
EXPECTED = {  # name -> the prompt llama.cpp renders for MESSAGES, generation prompt added
    "chatml": "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n"
              "<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nU2<|im_end|>\n"
              "<|im_start|>assistant\n",
    "llama2": "[INST] S\nU1 [/INST]A1</s>[INST] U2 [/INST]",
    "llama2-sys": "[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST]A1</s>[INST] U2 [/INST]",
    "llama2-sys-bos": "[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST]A1</s><s>[INST] U2 [/INST]",
    "llama2-sys-strip": "[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST]A1</s>[INST] U2 [/INST]",
    "mistral-v1": " [INST] S\n\nU1 [/INST] A1</s> [INST] U2 [/INST]",
    "mistral-v3": "[INST] S\n\nU1[/INST] A1</s>[INST] U2[/INST]",
    "mistral-v3-tekken": "[INST]S\n\nU1[/INST]A1</s>[INST]U2[/INST]",
    "mistral-v7": "[SYSTEM_PROMPT] S[/SYSTEM_PROMPT][INST] U1[/INST] A1</s>[INST] U2[/INST]",
    "mistral-v7-tekken": "[SYSTEM_PROMPT]S[/SYSTEM_PROMPT][INST]U1[/INST]A1</s>[INST]U2[/INST]",
    "phi3": "<|system|>\nS<|end|>\n<|user|>\nU1<|end|>\n<|assistant|>\nA1<|end|>\n"
            "<|user|>\nU2<|end|>\n<|assistant|>\n",
    "phi4": "<|im_start|>system<|im_sep|>S<|im_end|><|im_start|>user<|im_sep|>U1<|im_end|>"
            "<|im_start|>assistant<|im_sep|>A1<|im_end|><|im_start|>user<|im_sep|>U2"
            "<|im_end|><|im_start|>assistant<|im_sep|>",
    "falcon3": "<|system|>\nS\n<|user|>\nU1\n<|assistant|>\nA1\n<|user|>\nU2\n<|assistant|>\n",
    "zephyr": "<|system|>\nS<|endoftext|>\n<|user|>\nU1<|endoftext|>\n<|assistant|>\n"
              "A1<|endoftext|>\n<|user|>\nU2<|endoftext|>\n<|assistant|>\n",
    "monarch": "system\nS</s>\n<s>user\nU1</s>\n<s>assistant\nA1</s>\n<s>user\nU2</s>\n"
               "<s>assistant\n",
    "gemma": "<start_of_turn>user\nS\n\nU1<end_of_turn>\n<start_of_turn>model\nA1"
             "<end_of_turn>\n<start_of_turn>user\nU2<end_of_turn>\n<start_of_turn>model\n",
    "orion": "Human: S\n\nU1\n\nAssistant: </s>A1</s>Human: U2\n\nAssistant: </s>",
    "openchat": "S<|end_of_turn|>GPT4 Correct User: U1<|end_of_turn|>GPT4 Correct Assistant: "
                "A1<|end_of_turn|>GPT4 Correct User: U2<|end_of_turn|>GPT4 Correct Assistant:",
    "vicuna": "S\n\nUSER: U1\nASSISTANT: A1</s>\nUSER: U2\nASSISTANT:",
    "vicuna-orca": "SYSTEM: S\nUSER: U1\nASSISTANT: A1</s>\nUSER: U2\nASSISTANT:",
    "deepseek": "S### Instruction:\nU1\n### Response:\nA1\n<|EOT|>\n### Instruction:\nU2\n"
                "### Response:\n",
    "deepseek2": f"S\n\nUser: U1\n\nAssistant: A1{EOS}User: U2\n\nAssistant:",
    "deepseek3": f"S\n\n<｜User｜>U1<｜Assistant｜>A1{EOS}<｜User｜>U2<｜Assistant｜>",
    "command-r": f"{CMD}<|SYSTEM_TOKEN|>S<|END_OF_TURN_TOKEN|>{CMD}<|USER_TOKEN|>U1"
                 f"<|END_OF_TURN_TOKEN|>{CMD}<|CHATBOT_TOKEN|>A1<|END_OF_TURN_TOKEN|>{CMD}"
                 f"<|USER_TOKEN|>U2<|END_OF_TURN_TOKEN|>{CMD}<|CHATBOT_TOKEN|>",
    "llama3": "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>"
              "user<|end_header_id|>\n\nU1<|eot_id|><|start_header_id|>assistant"
              "<|end_header_id|>\n\nA1<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
              "U2<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "llama4": "<|header_start|>system<|header_end|>\n\nS<|eot|><|header_start|>user"
              "<|header_end|>\n\nU1<|eot|><|header_start|>assistant<|header_end|>\n\nA1<|eot|>"
              "<|header_start|>user<|header_end|>\n\nU2<|eot|><|header_start|>assistant"
              "<|header_end|>\n\n",
    "chatglm3": "[gMASK]sop<|system|>\n S<|user|>\n U1<|assistant|>\n A1<|user|>\n U2"
                "<|assistant|>",
    "chatglm4": "[gMASK]<sop><|system|>\nS<|user|>\nU1<|assistant|>\nA1<|user|>\nU2"
                "<|assistant|>\n",
    "glmedge": "<|system|>\nS<|user|>\nU1<|assistant|>\nA1<|user|>\nU2<|assistant|>",
    "minicpm": "S<用户>U1<AI>A1<用户>U2<AI>",
    "exaone3": "[|system|]S[|endofturn|]\n[|user|]U1\n[|assistant|]A1[|endofturn|]\n"
               "[|user|]U2\n[|assistant|]",
    "exaone4": "[|system|]S[|endofturn|]\n[|user|]U1\n[|assistant|]A1[|endofturn|]\n"
               "[|user|]U2\n[|assistant|]",
    "granite": "<|start_of_role|>system<|end_of_role|>S<|end_of_text|>\n<|start_of_role|>user"
               "<|end_of_role|>U1<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>A1"
               "<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>U2<|end_of_text|>\n"
               "<|start_of_role|>assistant<|end_of_role|>\n",
    "megrez": "<|role_start|>system<|role_end|>S<|turn_end|><|role_start|>user<|role_end|>U1"
              "<|turn_end|><|role_start|>assistant<|role_end|>A1<|turn_end|><|role_start|>user"
              "<|role_end|>U2<|turn_end|><|role_start|>assistant<|role_end|>",
    "smolvlm": "<|im_start|>S\n\nUser: U1<end_of_utterance>\nAssistant: A1<end_of_utterance>\n"
               "User: U2<end_of_utterance>\nAssistant:",
    "bailing": "<role>SYSTEM</role>S<role>HUMAN</role>U1<role>ASSISTANT</role>A1<role>HUMAN"
               "</role>U2<role>ASSISTANT</role>",
}


def test_every_shipped_template_has_an_expected_prompt():
    assert sorted(EXPECTED) == sorted(BUILTIN_NAMES)
    for name in ("chatml", "llama2", "llama3", "mistral-v1", "mistral-v3", "mistral-v7",
                 "gemma", "phi3", "deepseek", "deepseek2", "deepseek3", "command-r",
                 "zephyr", "vicuna", "monarch"):
        assert name in BUILTIN_NAMES


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_builtin_template_renders_what_llama_cpp_renders(name):
    template = ChatTemplate(builtin_source(chat_template_value(name)), bos_token="<BOS>")
    assert template.render(MESSAGES) == "<BOS>" + EXPECTED[name]


def test_strip_variants_trim_and_others_keep_the_content():
    padded = [{"role": "user", "content": " hi "}, {"role": "assistant", "content": " yo "}]
    strip = ChatTemplate(builtin_source("llama2-sys-strip")).render(padded)
    keep = ChatTemplate(builtin_source("llama2-sys")).render(padded)
    assert strip == "[INST] hi [/INST]yo</s>" and keep == "[INST]  hi  [/INST] yo </s>"
    assert ChatTemplate(builtin_source("mistral-v3")).render(padded) == \
        "[INST]  hi [/INST] yo</s>"


def test_an_unknown_name_lists_the_known_ones_and_jinja_text_is_a_template():
    with pytest.raises(argparse.ArgumentTypeError) as info:
        chat_template_value("llama9")
    assert "llama9" in str(info.value) and "chatml" in str(info.value)
    assert "mistral-v7" in str(info.value)
    inline = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert chat_template_value(inline) == inline
    assert chat_template_value(" llama3 ") == "llama3"


@pytest.mark.parametrize("source,name", [
    ("{{ '<|im_start|>' + m }}", "chatml"),
    ("<|im_start|>{{ x }}<|im_sep|>", "phi4"),
    ("{{ '<|start_header_id|>' }}{{ '<|end_header_id|>' }}", "llama3"),
    ("{{ '[SYSTEM_PROMPT]' }}[INST]", "mistral-v7"),
    ("[INST] <<SYS>>", "llama2-sys"),
    ("{{ bos_token + '[INST] ' + content.strip() }}", "llama2-sys-strip"),
    ("[INST] {{ x }}", "llama2"),
    ("[AVAILABLE_TOOLS]{{ '[INST]' }}", "mistral-v3"),
    ("<start_of_turn>", "gemma"),
    ("{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' }}", "command-r"),
    ("<｜Assistant｜><｜User｜><｜end▁of▁sentence｜>", "deepseek3"),
    ("{{ 'plain ' + m }}", None),
])
def test_no_jinja_detects_the_format_in_llama_cpp_order(source, name):
    assert detect_builtin(source) == name


def test_a_no_jinja_template_refuses_tools():
    template = ChatTemplate(builtin_source("chatml"), takes_tools=False)
    with pytest.raises(InvalidRequest, match="--no-jinja"):
        template.render(MESSAGES, tools=[{"type": "function", "function": {"name": "f"}}])
    assert template.render(MESSAGES).endswith("<|im_start|>assistant\n")


def _prompt_tokens(client, **body) -> int:
    r = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1,
                                                  **body})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_chat_request_renders_with_the_named_template(tiny_checkpoint, name):
    """The prompt the server tokenized is llama.cpp's text for that format."""
    with make_client(tiny_checkpoint, parallel=1, chat_template=name) as client:
        wait_ready(client)
        checkpoint = client.app.state["ctx"].engine.checkpoint
        assert checkpoint.template.origin == f"--chat-template {name}"
        tok = checkpoint.tokenizer
        expected = tok.encode((tok.bos_token or "") + EXPECTED[name])
        assert _prompt_tokens(client) == len(expected)


def test_no_jinja_renders_the_detected_format_and_refuses_tools(tiny_checkpoint):
    """The tiny checkpoint's template is ChatML-shaped (``<|im_start|>``)."""
    with make_client(tiny_checkpoint, parallel=1, jinja=False) as client:
        wait_ready(client)
        checkpoint = client.app.state["ctx"].engine.checkpoint
        assert checkpoint.template.origin.startswith("built-in chatml (--no-jinja")
        tok = checkpoint.tokenizer
        assert _prompt_tokens(client) == len(tok.encode((tok.bos_token or "")
                                                        + EXPECTED["chatml"]))
        r = client.post("/v1/chat/completions", json={
            "messages": MESSAGES, "max_tokens": 1,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]})
        assert r.status_code == 400 and "--no-jinja" in r.json()["error"]["message"]


def test_an_inline_jinja_template_is_used_as_the_template(tiny_checkpoint):
    inline = "{% for m in messages %}<<{{ m.role }}:{{ m.content }}>>{% endfor %}"
    with make_client(tiny_checkpoint, parallel=1, chat_template=inline) as client:
        wait_ready(client)
        tok = client.app.state["ctx"].engine.checkpoint.tokenizer
        text = "".join(f"<<{m['role']}:{m['content']}>>" for m in MESSAGES)
        assert _prompt_tokens(client) == len(tok.encode(text))

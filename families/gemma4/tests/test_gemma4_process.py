"""The installed distribution behind the real ``mlxcel-server`` process: a Gemma 4
checkpoint serves a forced tool call, whole and streamed (markup never in the content), as
a user who ran ``pip install ./core ./families/gemma4`` sees. (The thought channel's split
is ``test_gemma4_server``'s: the template never opens it, so random weights cannot.)"""

from __future__ import annotations

import json

import pytest
from gemma4_fixtures import TOOLS
from mlxcel.testing.e2e import server_client

pytestmark = pytest.mark.slow
CHAT = "/v1/chat/completions"
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def http(gemma4_checkpoint):
    with server_client(["--model", str(gemma4_checkpoint), "--parallel", "2"],
                       timeout=120) as client:
        yield client


def test_the_family_and_its_format_are_selected(http):
    health = http.get("/health").json()
    assert health["tool_call_parser"] == "mlxcel"


def test_a_forced_call_comes_back_whole_and_streamed(http):
    body = {"messages": ASK, "tools": [t.definition for t in TOOLS], "max_tokens": 300,
            "temperature": 1.0, "seed": 3, "tool_choice": "required"}
    whole = http.post(CHAT, json=body).json()["choices"][0]
    assert whole["finish_reason"] == "tool_calls"
    (call,) = whole["message"]["tool_calls"][:1]
    assert call["function"]["name"] in {t.name for t in TOOLS}
    assert isinstance(json.loads(call["function"]["arguments"]), dict)
    frames = [json.loads(line[6:]) for line in
              http.post(CHAT, json={**body, "stream": True}).text.split("\n\n")
              if line.startswith("data: {")]
    content = "".join(f["choices"][0]["delta"].get("content") or "" for f in frames
                      if f["choices"])
    assert "<|tool_call>" not in content and "call:" not in content
    assert [f["choices"][0]["finish_reason"] for f in frames if f["choices"]][-1] == \
        "tool_calls"

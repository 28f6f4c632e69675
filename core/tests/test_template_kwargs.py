"""Template variables (the spec's "채팅 템플릿 kwargs"): a request's, from the first of
three forms it uses, merged over --chat-template-kwargs key by key."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from apphelpers import make_client, wait_ready
from mlxcel.chat.prompt import pick_template_kwargs
from mlxcel.options import chat_template_kwargs


def test_the_flag_takes_a_json_object_without_reserved_keys():
    assert chat_template_kwargs('{"enable_thinking": false, "x": [1]}') == {
        "enable_thinking": False, "x": [1]}
    for bad, why in (("{nope", "not valid JSON"), ("[1]", "expected a JSON object"),
                     ('{"tools": []}', "tools is set by the server")):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            chat_template_kwargs(bad)


def test_a_bad_value_in_the_env_twin_refuses_to_start_in_one_line(tmp_path):
    code = "import sys; from mlxcel.cli import main; sys.exit(main(['--model', 'x']))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"LLAMA_ARG_CHAT_TEMPLATE_KWARGS": '{"messages": 1}',
                               "PATH": "/usr/bin:/bin"}, timeout=60)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "LLAMA_ARG_CHAT_TEMPLATE_KWARGS" in proc.stderr or "--chat-template-kwargs" in \
        proc.stderr, proc.stderr


def _prompt_tokens(client, **body) -> int:
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, **body})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens"]


def test_server_defaults_merge_under_the_requests_kwargs(tiny_checkpoint):
    """The bundled template closes an empty think block when ``enable_thinking`` is false."""
    with make_client(tiny_checkpoint, parallel=1) as plain:
        wait_ready(plain)
        base = _prompt_tokens(plain)
        closed = _prompt_tokens(plain, chat_template_kwargs={"enable_thinking": False})
    assert closed > base
    with make_client(tiny_checkpoint, parallel=1,
                     chat_template_kwargs={"enable_thinking": False}) as c:
        wait_ready(c)
        assert _prompt_tokens(c) == closed  # the server's default applies
        # another key: the server's stays (merged, not replaced)
        assert _prompt_tokens(c, chat_template_kwargs={"preserve_thinking": True}) == closed
        assert _prompt_tokens(c, extra_body={"preserve_thinking": True}) == closed
        # the request's own value wins
        assert _prompt_tokens(c, chat_template_kwargs={"enable_thinking": True}) == base


# -- the request's three forms: first match wins ------------------------------------------
@pytest.mark.parametrize("top,extra,picked", [
    ({"a": 1}, {"chat_template_kwargs": {"b": 2}, "preserve_thinking": True}, {"a": 1}),
    ({}, {"preserve_thinking": True}, {}),  # an empty top-level object is still the form
    (None, {"chat_template_kwargs": {"b": 2}, "preserve_thinking": True}, {"b": 2}),
    (None, {"preserve_thinking": False, "enable_thinking": False},
     {"preserve_thinking": False}),  # DashScope's flat form: that key only
    (None, {"chat_template_kwargs": "x", "enable_thinking": False}, {}),
    (None, None, {}),
])
def test_the_first_form_present_wins(top, extra, picked):
    assert pick_template_kwargs(top, extra) == picked


def test_the_picked_kwargs_are_a_copy():
    given = {"a": 1}
    pick_template_kwargs(given, None)["a"] = 2
    assert given == {"a": 1}


CONVERSATION = [
    {"role": "user", "content": "q1"},
    {"role": "assistant", "content": "<think>\n" + "an earlier thought " * 5 + "\n</think>\n\nA1"},
    {"role": "user", "content": "q2"},
]


@pytest.mark.parametrize("fields,kept", [
    ({}, False),
    ({"chat_template_kwargs": {"preserve_thinking": True}}, True),
    ({"extra_body": {"chat_template_kwargs": {"preserve_thinking": True}}}, True),
    ({"extra_body": {"preserve_thinking": True}}, True),
    ({"chat_template_kwargs": {"preserve_thinking": False},
      "extra_body": {"chat_template_kwargs": {"preserve_thinking": True}}}, False),
    ({"extra_body": {"chat_template_kwargs": {"preserve_thinking": False},
                     "preserve_thinking": True}}, False),
])
def test_http_each_form_reaches_the_prompt(client, fields, kept):
    def tokens(**body) -> int:
        r = client.post("/v1/chat/completions", json={
            "messages": CONVERSATION, "max_tokens": 1, **body})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]

    dropped, preserved = tokens(), tokens(chat_template_kwargs={"preserve_thinking": True})
    assert preserved > dropped
    assert tokens(**fields) == (preserved if kept else dropped)

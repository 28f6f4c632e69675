"""What the acme-xml parser streams, and when: the behaviour the conformance runner does
not pin down (it compares chunkings with each other, not with a moment in the stream)."""

from __future__ import annotations

from acme_mlxcel.parser import new_parser
from mlxcel.toolcalls.api import ParseEvent


def _kinds(events):
    return [(e.kind, e.text, e.name) for e in events]


def test_a_partial_open_tag_is_held_back_until_settled():
    parser = new_parser([])
    assert _kinds(parser.feed("Hi <acme_")) == [("content", "Hi ", None)]
    assert _kinds(parser.feed("cake>")) == [("content", "<acme_cake>", None)]
    assert parser.finish() == []


def test_the_name_and_argument_fragments_stream_while_generated():
    parser = new_parser([])
    assert parser.feed('<acme_call>{"name": "f", "argu') == []
    assert _kinds(parser.feed('ments": {"city": "Pa')) == [
        ("call_start", "", "f"), ("call_arguments", '{"city": "Pa', None)]
    assert _kinds(parser.feed('ris"}} </acme_')) == [("call_arguments", 'ris"}', None)]
    assert parser.feed("call>") == [ParseEvent(kind="call_end", index=0)]


def test_calls_are_numbered_in_order():
    parser = new_parser([])
    text = '<acme_call>{"name": "a", "arguments": {}}</acme_call>' * 2
    events = parser.feed(text) + parser.finish()
    assert [(e.kind, e.index) for e in events if e.kind != "call_arguments"] == [
        ("call_start", 0), ("call_end", 0), ("call_start", 1), ("call_end", 1)]


def test_a_call_that_is_not_json_stays_visible_as_content():
    parser = new_parser([])
    text = "<acme_call>not json</acme_call>"
    assert _kinds(parser.feed(text) + parser.finish()) == [("content", text, None)]

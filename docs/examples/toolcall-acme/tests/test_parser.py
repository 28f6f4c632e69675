"""What the acme-xml parser streams, and when: the behaviour the conformance runner does
not pin down (it compares chunkings with each other, not with a moment in the stream)."""

from __future__ import annotations

from acme_mlxcel.parser import new_parser
from mlxcel.toolcalls import kit


def test_a_partial_open_tag_is_held_back_until_settled():
    parser = new_parser(())
    assert parser.feed("Hi <acme_") == [kit.ToolText(text="Hi ")]
    assert parser.feed("cake>") == [kit.ToolText(text="<acme_cake>")]
    assert parser.finish() == kit.ParseResult()


def test_the_name_and_argument_fragments_stream_while_generated():
    parser = new_parser(())
    assert parser.feed('<acme_call>{"name": "f", "argu') == []
    assert parser.feed('ments": {"city": "Pa') == [
        kit.CallStart(index=0, name="f"), kit.CallArguments(index=0, text='{"city": "Pa')]
    assert parser.feed('ris"}} </acme_') == [kit.CallArguments(index=0, text='ris"}')]
    assert parser.feed("call>") == [kit.CallEnd(index=0)]
    assert parser.finish() == kit.ParseResult(
        calls=(kit.ParsedCall(name="f", arguments='{"city": "Paris"}'),))


def test_calls_are_numbered_in_order():
    parser = new_parser(())
    text = '<acme_call>{"name": "a", "arguments": {}}</acme_call>' * 2
    events = parser.feed(text)
    assert [e for e in events if not isinstance(e, kit.CallArguments)] == [
        kit.CallStart(index=0, name="a"), kit.CallEnd(index=0),
        kit.CallStart(index=1, name="a"), kit.CallEnd(index=1)]
    assert [c.name for c in parser.finish().calls] == ["a", "a"]


def test_a_call_that_is_not_json_is_an_error_that_keeps_its_text():
    parser = new_parser(())
    text = "<acme_call>not json</acme_call>"
    assert parser.feed(text) == [kit.CallError(message="not a JSON call", text=text)]
    assert parser.finish() == kit.ParseResult()


def test_an_answer_cut_off_inside_the_arguments_ends_the_call_and_reports_none():
    parser = new_parser(())
    events = parser.feed('<acme_call>{"name": "f", "arguments": {"x": [1, ')
    assert events == [kit.CallStart(index=0, name="f"), kit.CallArguments(index=0, text='{"x": [1, ')]
    result = parser.finish()
    assert result.calls == ()
    assert [type(e) for e in result.events] == [kit.CallEnd, kit.CallError]

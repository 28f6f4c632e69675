"""The parser streams: a call starts once its name is complete, its arguments arrive whole
when it ends (a repeated parameter keeps its last value), and nothing of the markup is
text."""

from __future__ import annotations

import json
import random

from mlxcel.types.toolcalls import CallArguments, CallEnd, CallError, CallStart, ToolText
from mlxcel_toolcall_qwen3_coder.parser import new_parser
from qwen3_coder_fixtures import BROKEN, FIXTURES, TOOLS, WEATHER
from structlog.testing import capture_logs


def feed_until(parser, text: str, *marks: str) -> list[list]:
    """Feed ``text`` in pieces cut at each of ``marks`` (the end of its first occurrence
    after the previous cut): the events of each piece, then of the rest."""
    out, at = [], 0
    for mark in marks:
        end = text.index(mark, at) + len(mark)
        out.append(parser.feed(text[at:end]))
        at = end
    out.append(parser.feed(text[at:]))
    return out


def arguments(events) -> str:
    return "".join(e.text for e in events if isinstance(e, CallArguments))


def test_a_call_starts_when_its_name_is_complete():
    parser = new_parser(TOOLS)
    before, named, _ = feed_until(parser, "Ok.\n" + WEATHER, "<function=get_weat", "r>")
    assert before == [ToolText(text="Ok.\n")]
    assert named == [CallStart(index=0, name="get_weather")]


def test_the_arguments_come_whole_when_the_call_ends():
    """Until ``</function>`` a parameter may still be written again, so nothing of the
    arguments is sent before it."""
    parser = new_parser(TOOLS)
    text = WEATHER.replace("Paris", "Paris, France")
    head, values, rest = feed_until(parser, text, "<parameter=city>", "3\n</parameter>")
    assert head == [CallStart(index=0, name="get_weather")] and values == []
    assert rest == [CallArguments(index=0, text='{"city": "Paris, France", "days": 3}'),
                    CallEnd(index=0)]
    assert parser.finish().events == ()


def test_a_repeated_parameter_keeps_its_last_value_and_warns_without_it():
    text = WEATHER.replace("</function>", "<parameter=city>\nLyon\n</parameter>\n"
                                          "</function>")
    with capture_logs() as logs:
        parser = new_parser(TOOLS)
        events = [e for ch in text for e in parser.feed(ch)]
        result = parser.finish()
    assert arguments(events) == result.calls[0].arguments == '{"city": "Lyon", "days": 3}'
    warned = [e for e in logs if e["event"] == "tool_call_duplicate_parameter"]
    assert warned == [{"event": "tool_call_duplicate_parameter", "log_level": "warning",
                       "function": "get_weather", "parameter": "city", "index": 0}]
    assert not [e for e in logs if "Paris" in str(e) or "Lyon" in str(e)]


def test_a_partial_tag_is_held_until_decided():
    parser = new_parser(TOOLS)
    assert parser.feed("Sure <tool_") == [ToolText(text="Sure ")]
    assert parser.feed("call>\n<func") == []
    assert parser.feed("tion=search>") == [CallStart(index=0, name="search")]
    assert parser.feed("\n<parameter=query>\nx </para") == []
    assert parser.feed("ms\n</parameter>\n</func") == []  # "</params" was no tag
    assert parser.feed("tion>") == [CallArguments(index=0, text='{"query": "x </params"}'),
                                    CallEnd(index=0)]
    other = new_parser(TOOLS)
    assert other.feed("a <tool_cal") == [ToolText(text="a ")]
    assert other.feed("l_me>") == [ToolText(text="<tool_call_me>")]


def test_fragments_concatenate_to_the_final_arguments():
    """Over every fixture, cut at random: each call's fragments are finish()'s arguments,
    which are valid JSON and the fixture's calls."""
    rng = random.Random(7)
    for fixture in [*FIXTURES, *BROKEN]:
        pieces, at = [], 0
        while at < len(fixture.text):
            step = rng.randint(1, 9)
            pieces.append(fixture.text[at:at + step])
            at += step
        parser = new_parser(TOOLS)
        events = [e for piece in pieces for e in parser.feed(piece)]
        result = parser.finish()
        events += result.events
        streamed: dict[int, str] = {}
        for e in events:
            if isinstance(e, CallArguments):
                streamed[e.index] = streamed.get(e.index, "") + e.text
        assert [streamed[i] for i in sorted(streamed)] == [c.arguments for c in result.calls]
        assert [json.loads(c.arguments) for c in result.calls] == \
            [c["arguments"] for c in fixture.calls]


def test_markup_is_never_text():
    """A well-formed answer's text events are exactly what lies outside its blocks."""
    parser = new_parser(TOOLS)
    text = "one " + WEATHER + " two " + WEATHER + " three"
    events = [e for ch in text for e in parser.feed(ch)] + list(parser.finish().events)
    assert "".join(e.text for e in events if isinstance(e, ToolText)) == "one  two  three"
    assert [e.index for e in events if isinstance(e, CallEnd)] == [0, 1]


def test_a_broken_block_keeps_its_text_and_the_next_call_parses():
    parser = new_parser(TOOLS)
    bad = "<tool_call>\n<parameter=city>\nParis\n</parameter>\n</tool_call>"
    events = parser.feed(bad + "\n" + WEATHER) + list(parser.finish().events)
    errors = [e for e in events if isinstance(e, CallError)]
    assert [e.text for e in errors] == [bad]
    assert [e.name for e in events if isinstance(e, CallStart)] == ["get_weather"]
    assert [c.name for c in parser.finish().calls] == ["get_weather"]


def test_a_cut_off_value_keeps_what_was_written():
    """Typed values are read at the end too; a partial closing tag is dropped."""
    parser = new_parser(TOOLS)
    parser.feed("<tool_call>\n<function=get_weather>\n<parameter=days>\n12\n</param")
    result = parser.finish()
    assert [json.loads(c.arguments) for c in result.calls] == [{"days": 12}]
    assert result.events[-1] == CallEnd(index=0)

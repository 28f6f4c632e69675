"""The output state machine: the same deltas however the text is split into tokens;
special-token text reaches the parsers and never the content; stops cut; logprobs ride."""

from __future__ import annotations

import json
import random

import pytest
from mlxcel import types as mt
from mlxcel.chat.output import OutputMachine, merge, pieces
from mlxcel.families.api import ReasoningSpec
from mlxcel.types.toolcalls import CallArguments, CallStart, ParsedCall, ParseResult, ToolText

USAGE = mt.Usage(prompt_tokens=3, completion_tokens=9)
THINK = ReasoningSpec(open="<think>", close="</think>")


def events(parts: list[tuple[str, bool]], rng: random.Random | None,
           finish: str = "stop") -> list[mt.GenerationEvent]:
    """Engine-like events of ``parts`` (``(text, special)``): ordinary text cut at random
    points (every character when ``rng`` is None), each special token's text at the end of
    an event, as the detokenizer emits it; the last event finishes."""
    out: list[mt.GenerationEvent] = []
    pending = ""
    for text, special in parts:
        if special:
            out.append(mt.GenerationEvent(text=pending + text, token_ids=(1,),
                                       specials=((len(pending), len(pending) + len(text)),)))
            pending = ""
            continue
        for ch in text:
            pending += ch
            if rng is None or rng.random() < 0.4:
                out.append(mt.GenerationEvent(text=pending, token_ids=(1,)))
                pending = ""
    last = out.pop() if out and not pending else mt.GenerationEvent(text=pending)
    out.append(mt.GenerationEvent(text=last.text, token_ids=last.token_ids, specials=last.specials,
                               finish_reason=finish, usage=USAGE))
    return out


def run(machine: OutputMachine, evs: list[mt.GenerationEvent]) -> list:
    out = []
    for e in evs:
        out += machine.feed(e)
    return out


def texts(deltas, kind) -> str:
    return "".join(d.text for d in deltas if isinstance(d, kind))


def test_pieces_cut_an_event_at_its_special_spans():
    e = mt.GenerationEvent(text="ab<|x|>cd<|y|>", specials=((2, 7), (9, 14)))
    assert pieces(e) == [("ab", False), ("<|x|>", True), ("cd", False), ("<|y|>", True)]
    assert pieces(mt.GenerationEvent(text="")) == []


PARTS = [("<think>", False), ("plan the answer", False), ("</think>", False),
         ("Hello ", False), ("<|im_sep|>", True), ("world END and more", False)]


@pytest.mark.parametrize("seed", range(40))
def test_same_deltas_for_any_split(seed):
    def answer(rng):
        m = OutputMachine(stops=("END",), reasoning=THINK)
        return merge(run(m, events(PARTS, rng)))

    whole = answer(None)
    assert whole == answer(random.Random(seed))
    assert texts(whole, mt.ReasoningDelta) == "plan the answer"
    assert texts(whole, mt.ContentDelta) == "Hello world "
    assert isinstance(whole[-1], mt.Finish) and whole[-1].reason == "stop"


def test_special_token_text_never_reaches_content():
    parts = [("a", False), ("<|python_tag|>", True), ("b", False), ("<|eom|>", True)]
    deltas = run(OutputMachine(), events(parts, random.Random(1)))
    assert texts(deltas, mt.ContentDelta) == "ab"


def test_a_special_token_ends_a_partial_stop_match():
    # "EN" could begin "END"; the special token between releases it
    parts = [("xEN", False), ("<|s|>", True), ("D tail", False)]
    deltas = run(OutputMachine(stops=("END",)), events(parts, None))
    assert texts(deltas, mt.ContentDelta) == "xEND tail"


def test_stop_cuts_and_drops_the_rest_also_in_the_finishing_event():
    evs = [mt.GenerationEvent(text="one two", token_ids=(1,)),
           mt.GenerationEvent(text=" STOP three", token_ids=(2,), finish_reason="stop",
                           usage=USAGE)]
    deltas = run(OutputMachine(stops=("STOP",)), evs)
    assert texts(deltas, mt.ContentDelta) == "one two "
    assert deltas[-1] == mt.Finish(reason="stop", usage=USAGE, stop_sequence="STOP")


def test_held_text_is_released_at_the_end():
    evs = [mt.GenerationEvent(text="almost ST", token_ids=(1,)),
           mt.GenerationEvent(text="", finish_reason="length", usage=USAGE)]
    deltas = run(OutputMachine(stops=("STOP",)), evs)
    assert [type(d) for d in deltas] == [mt.ContentDelta, mt.ContentDelta, mt.Finish]
    assert deltas[-1].stop_sequence is None
    assert texts(deltas, mt.ContentDelta) == "almost ST"


def test_a_prompt_that_opens_reasoning_starts_inside_it():
    parts = [("still thinking</think>", False), ("done", False)]
    deltas = run(OutputMachine(reasoning=THINK, reasoning_open=True), events(parts, None))
    assert texts(deltas, mt.ReasoningDelta) == "still thinking"
    assert texts(deltas, mt.ContentDelta) == "done"


def test_a_special_reasoning_marker_switches_too():
    parts = [("<think>", True), ("hmm", False), ("</think>", True), ("ok", False)]
    deltas = merge(run(OutputMachine(reasoning=THINK), events(parts, random.Random(2))))
    assert texts(deltas, mt.ReasoningDelta) == "hmm" and texts(deltas, mt.ContentDelta) == "ok"


def test_logprobs_of_every_token_reach_a_delta_once():
    lps = [mt.TokenLogprob(i, -0.5) for i in range(6)]
    evs = [mt.GenerationEvent(text=t, token_ids=(i,), logprobs=(lps[i],))
           for i, t in enumerate(["a", "b", "S", "T", "c"])]
    evs.append(mt.GenerationEvent(text="d", token_ids=(5,), logprobs=(lps[5],),
                               finish_reason="length", usage=USAGE))
    deltas = run(OutputMachine(stops=("STOP",)), evs)
    got = [lp for d in deltas if isinstance(d, mt.ContentDelta) for lp in d.logprobs]
    assert got == lps
    # the tokens behind held text ("S", "T") still get a frame of their own
    assert [d.text for d in deltas if isinstance(d, mt.ContentDelta)] == \
        ["a", "b", "", "", "STc", "d"]


def test_failure_finish_carries_the_engine_message():
    evs = [mt.GenerationEvent(text="x", token_ids=(1,)),
           mt.GenerationEvent(finish_reason="error", error="boom", usage=USAGE)]
    deltas = run(OutputMachine(), evs)
    assert deltas[-1] == mt.Finish(reason="error", usage=USAGE, error="boom")
    assert not deltas[-1].ok


class _WrapperParser:
    """A tool format as a plugin would write one: ``<|call|>{json}`` after a special token.
    ``stream`` decides how much it streams: nothing until the end (the simplest correct
    parser), or the call's start and a first argument fragment as soon as it sees them."""

    def __init__(self, stream: bool = False, fragment: str = "{") -> None:
        self.buf, self.stream, self.fragment, self.started = "", stream, fragment, False

    def feed(self, text: str, token_ids=()) -> list:
        self.buf += text
        if self.stream and not self.started and '"name": "f"' in self.buf:
            self.started = True
            return [CallStart(index=0, name="f", id="call_streamed"),
                    CallArguments(index=0, text=self.fragment)]
        return []

    def finish(self) -> ParseResult:
        head, sep, rest = self.buf.partition("<|call|>")
        events = [ToolText(text=head)] if head and not self.started else []
        calls = ()
        if sep:
            call = json.loads(rest)
            calls = (ParsedCall(name=call["name"], arguments=json.dumps(call["arguments"])),)
        return ParseResult(events=tuple(events), calls=calls)


CALL_PARTS = [("Sure", False), ("<|pad|>", True), (".", False), ("<|call|>", True),
              ('{"name": "f", "arguments": {"x": 1}}', False)]


def test_tool_parser_sees_special_tokens_and_its_content_loses_them():
    m = OutputMachine(tool_parser=_WrapperParser(), special_texts=("<|pad|>", "<|call|>"))
    deltas = merge(run(m, events(CALL_PARTS, random.Random(3))))
    assert texts(deltas, mt.ContentDelta) == "Sure."
    start = next(d for d in deltas if isinstance(d, mt.ToolCallStart))
    assert start.name == "f" and start.id.startswith("call_")
    assert texts(deltas, mt.ToolCallArguments) == '{"x": 1}'
    assert any(isinstance(d, mt.ToolCallEnd) for d in deltas)
    assert deltas[-1].reason == "tool_calls"
    assert deltas[-1].calls == (ParsedCall(name="f", arguments='{"x": 1}', id=start.id),)


def test_a_streamed_call_keeps_its_id_and_gets_the_rest_of_its_arguments():
    m = OutputMachine(tool_parser=_WrapperParser(stream=True), special_texts=("<|call|>",))
    deltas = merge(run(m, events(CALL_PARTS, random.Random(4))))
    starts = [d for d in deltas if isinstance(d, mt.ToolCallStart)]
    assert [s.id for s in starts] == ["call_streamed"]
    assert texts(deltas, mt.ToolCallArguments) == '{"x": 1}'
    assert deltas[-1].calls[0].id == "call_streamed"


def test_a_stream_that_diverged_is_logged_and_the_whole_parse_wins():
    from structlog.testing import capture_logs

    m = OutputMachine(tool_parser=_WrapperParser(stream=True, fragment="[wrong"),
                      special_texts=("<|call|>",), request_id="r1")
    with capture_logs() as logs:
        deltas = run(m, events(CALL_PARTS, None))
    assert any(e["event"] == "tool_call_divergence" and e["request_id"] == "r1" for e in logs)
    assert deltas[-1].calls == (ParsedCall(name="f", arguments='{"x": 1}',
                                           id="call_streamed"),)


def test_engine_events_keep_special_tokens_and_content_drops_them(tiny_checkpoint):
    """Sampled from random weights, some tokens are special (``<|im_start|>``, the
    reserved pads): the events carry their text at tagged spans, and the answer's content
    is what the tokenizer decodes with special tokens skipped."""
    from mlxcel.testing.engine import ListSink, request, run_until_done, worker_for
    from mlxcel.types import SamplingParams

    worker = worker_for(tiny_checkpoint)
    tok = worker.checkpoint.tokenizer
    sinks = []
    for seed in range(4):
        sink = ListSink()
        worker.enqueue(request([5, 6, 7, seed + 8], 96,
                               SamplingParams(temperature=1.5, seed=seed)), sink)
        sinks.append(sink)
    run_until_done(worker, sinks)
    specials = set(tok.special_texts.values())
    tagged = [e.text[a:b] for s in sinks for e in s.events for a, b in e.specials]
    assert tagged and set(tagged) <= specials
    for sink in sinks:
        deltas = run(OutputMachine(), sink.events)
        content = texts(deltas, mt.ContentDelta)
        assert content == tok.decode(sink.tokens, skip_special=True)
        assert not any(marker in content for marker in specials)


def test_a_family_with_reasoning_markers_answers_reasoning_first(tiny_checkpoint):
    """A prompt that leaves the answer inside an open ``<think>`` block (the family's
    markers): what the model writes up to ``</think>`` is ``reasoning_content``, the rest
    content, streamed and not; nothing is lost between them."""
    from apphelpers import make_client, wait_ready

    with make_client(tiny_checkpoint) as client:
        wait_ready(client)
        ckpt = client.app.state["ctx"].engine.checkpoint
        ckpt.reasoning = THINK
        body = {"messages": [{"role": "user", "content": "hi"},
                             {"role": "assistant", "content": "<think>\nlet me see"}],
                "continue_final_message": True, "max_tokens": 12, "temperature": 0,
                "ignore_eos": True}
        whole = client.post("/v1/chat/completions", json=body).json()
        message = whole["choices"][0]["message"]
        streamed = client.post("/v1/chat/completions", json={**body, "stream": True})
        frames = [json.loads(line[6:]) for line in streamed.text.split("\n\n")
                  if line.startswith("data: {")]
        deltas = [f["choices"][0]["delta"] for f in frames if f["choices"]]
    assert message["reasoning_content"] and whole["usage"]["completion_tokens"] == 12
    assert "".join(d.get("reasoning_content", "") for d in deltas) == \
        message["reasoning_content"]
    assert "".join(d.get("content", "") for d in deltas) == (message["content"] or "")
    assert "<think>" not in message["reasoning_content"]


def test_server_made_call_ids_take_the_templates_form():
    """A Mistral template refuses ids that are not 9 alphanumerics: the ids the server
    makes for its model's calls are such ids, so the next turn renders."""
    m = OutputMachine(tool_parser=_WrapperParser(), special_texts=("<|pad|>", "<|call|>"),
                      call_ids="alnum9")
    deltas = merge(run(m, events(CALL_PARTS, random.Random(5))))
    start = next(d for d in deltas if isinstance(d, mt.ToolCallStart))
    assert len(start.id) == 9 and start.id.isalnum()
    assert deltas[-1].calls[0].id == start.id

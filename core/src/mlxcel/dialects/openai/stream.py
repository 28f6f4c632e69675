"""OpenAI stream encoders: typed deltas -> ``chat.completion.chunk`` / ``text_completion``
frames, and a whole answer -> the non-streaming body. One encoder per surface; the rules of
what the deltas say live in ``mlxcel.chat``."""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from mlxcel.chat.answer import Answer, failure
from mlxcel.dialects.llamacpp.stream import probabilities
from mlxcel.dialects.timings import Watch, progress_object
from mlxcel.dialects.wire import SSE_DONE, error_frame, sse
from mlxcel.model.tokenizer import Tokenizer
from mlxcel.types import (
    ContentDelta,
    Delta,
    Finish,
    ReasoningDelta,
    ToolCallArguments,
    ToolCallStart,
    Usage,
)
from mlxcel.types.events import PromptProgress

from . import schemas as s
from .logprobs import chat_logprobs, completion_logprobs
from .verbose import native_chunk, native_final

# answer finish reasons -> OpenAI's; "error" and "cancelled" never reach a client as one
FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls"}
_json = msgspec.json.Encoder().encode
_PLACEHOLDER = "\x00mlxcel-text\x00"  # where a text chunk's template has its text
_PLACEHOLDER_JSON = _json(_PLACEHOLDER)


def wire_usage(u: Usage | None) -> s.Usage:
    assert u is not None
    return s.Usage(u.prompt_tokens, u.completion_tokens, u.total_tokens,
                   {"cached_tokens": u.cached_tokens})


class _Encoder:
    """What every frame of one response repeats, and the closing frames.

    ``index``: the choice whose frames these are (``n`` > 1); ``last``: its finish ends
    the stream (with one choice), else the stream's ``closing`` frames come once every
    choice finished. ``timed``: the answer's ``Watch``, prompt length, and whether the
    request asked for ``timings_per_token`` (every frame then carries llama-server's
    ``timings``); without it only the finish carries them, when a drafter ran.
    ``verbose``: frames carry llama-server's ``__verbose`` (``-v``; ``.verbose`` says
    which). A surface names its stream frame's struct (``chunk_type``) and its whole
    body's (``body_type``): both take id, created, model and choices first.
    """

    chunk_type: type
    body_type: type

    def __init__(self, rid: str, created: int, model: str, tok: Tokenizer,
                 include_usage: bool, *, index: int = 0, last: bool = True,
                 timed: tuple[Watch, int, bool] | None = None, verbose: bool = False) -> None:
        self.rid, self.created, self.model, self.tok = rid, created, model, tok
        self.include_usage = include_usage
        self.index, self.last, self.timed = index, last, timed
        self.per_token = timed is not None and timed[2]
        self.verbose = verbose
        self.new_line = False  # some generated text had one (``__verbose.has_new_line``)

    def timings(self, usage: Usage | None = None) -> dict[str, Any] | UnsetType:
        """The ``timings`` of a frame (so far, or at the end: ``usage``): on every frame
        when the request asked for them, else on the finish of an answer a drafter ran
        a verify round for (the spec: never on middle chunks); UNSET otherwise."""
        if self.timed is None:
            return UNSET
        watch, prompt_n, per_token = self.timed
        if per_token:
            return watch.timings(usage or watch.running(prompt_n))
        return watch.timings(usage) if usage is not None and usage.draft_rounds else UNSET

    def closing(self, usage: Usage) -> list[bytes]:
        """The frames after the last choice's finish: usage (when asked) and ``[DONE]``."""
        if not self.include_usage:
            return [SSE_DONE]
        return [sse(self.usage_frame(wire_usage(usage))), SSE_DONE]

    def _progress(self, p: PromptProgress, choice: dict[str, Any], obj: str,
                  **extra: Any) -> list[bytes]:
        return [sse({"choices": [choice], "created": self.created, "id": self.rid,
                     "model": self.model, "system_fingerprint": None, "object": obj,
                     "prompt_progress": progress_object(p), **extra})]

    def encode(self, deltas: list[Delta]) -> list[bytes]:
        """The frames of some deltas; after a ``Finish``: its frame (+ usage) and
        ``[DONE]``, or an error frame and ``[DONE]`` when the answer failed."""
        out: list[bytes] = []
        for delta in deltas:
            if self.verbose and isinstance(delta, (ContentDelta, ReasoningDelta)):
                self.new_line = self.new_line or "\n" in delta.text
            if isinstance(delta, Finish):
                if not delta.ok:
                    return [*out, error_frame(failure(delta)), SSE_DONE]
                out.append(sse(self.finish_frame(delta)))
                return [*out, *self.closing(delta.usage)] if self.last else out
            frame = self.delta_bytes(delta)
            if frame is not None:
                out.append(frame)
        return out

    def delta_bytes(self, delta: Delta) -> bytes | None:
        """One delta's SSE frame, or None for a delta this surface does not show."""
        frame = self.delta_frame(delta)
        return None if frame is None else sse(frame)

    def final_verbose(self, finish: Finish) -> dict[str, Any] | UnsetType:
        """The finishing frame's ``__verbose``: the native final object, its text
        already streamed (UNSET without ``-v``)."""
        if not self.verbose:
            return UNSET
        return native_final(finish, "", self.model, self.new_line, self.index)

    def finish_frame(self, finish: Finish) -> Any:
        """The surface's finishing frame (``end_frame``) with the end's timings and
        ``__verbose``."""
        frame = self.end_frame(finish)
        frame.timings = self.timings(finish.usage)
        frame.verbose = self.final_verbose(finish)
        return frame

    def usage_frame(self, usage: s.Usage) -> Any:
        return self.chunk_type(self.rid, self.created, self.model, [], usage=usage)

    def whole(self, answer: Answer) -> Any:
        """The non-streaming body of one answer (``choice``)."""
        finish = answer.finish
        assert finish is not None
        return self.body_type(self.rid, self.created, self.model, [self.choice(answer)],
                              usage=wire_usage(finish.usage),
                              timings=self.timings(finish.usage))

    def delta_frame(self, delta: Delta) -> Any: ...

    def end_frame(self, finish: Finish) -> Any: ...

    def choice(self, answer: Answer) -> Any: ...


class ChatEncoder(_Encoder):
    """``chat.completion.chunk`` frames: a role frame first, then content, reasoning
    (``reasoning_content``) and tool-call deltas, each with the logprobs it carries."""

    chunk_type = s.ChatCompletionChunk
    body_type = s.ChatCompletion

    def __init__(self, *args: Any, logprobs: bool = False, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.logprobs = logprobs
        self._text_frames = {ContentDelta: self._around("content"),
                             ReasoningDelta: self._around("reasoning_content")}

    def _around(self, field: str) -> tuple[bytes, bytes] | None:
        """The bytes of a text chunk before and after its text's JSON string: a text
        delta's frame is then two joins, the same bytes as encoding the whole chunk
        (None when the response's own strings contain the placeholder)."""
        parts = sse(self._chunk(s.Delta(**{field: _PLACEHOLDER}))).split(_PLACEHOLDER_JSON)
        return (parts[0], parts[1]) if len(parts) == 2 else None

    def delta_bytes(self, delta: Delta) -> bytes | None:
        if isinstance(delta, (ContentDelta, ReasoningDelta)) and not delta.logprobs \
                and not self.per_token:
            around = self._text_frames[type(delta)]
            if around is not None:
                return around[0] + _json(delta.text) + around[1]
        return super().delta_bytes(delta)

    def _chunk(self, delta: s.Delta, finish: str | None = None,
               logprobs: dict | None = None) -> s.ChatCompletionChunk:
        return s.ChatCompletionChunk(self.rid, self.created, self.model,
                                     [s.ChunkChoice(self.index, delta, finish, logprobs)],
                                     timings=self.timings())

    def first(self) -> bytes:
        return sse(self._chunk(s.Delta(role="assistant")))

    def progress(self, p: PromptProgress) -> list[bytes]:
        """A prefill chunk's progress, as llama-server streams it: a role delta with
        ``prompt_progress``."""
        return self._progress(p, {"finish_reason": None, "index": self.index,
                                  "delta": {"role": "assistant", "content": None}},
                              "chat.completion.chunk")

    def delta_frame(self, delta: Delta) -> Any:
        if isinstance(delta, (ContentDelta, ReasoningDelta)):
            lps = chat_logprobs(self.tok, delta.logprobs) if delta.logprobs else None
            wire = s.Delta(content=delta.text) if isinstance(delta, ContentDelta) \
                else s.Delta(reasoning_content=delta.text)
            return self._chunk(wire, logprobs=lps)
        if isinstance(delta, ToolCallStart):
            return self._chunk(s.Delta(tool_calls=[{
                "index": delta.index, "id": delta.id, "type": "function",
                "function": {"name": delta.name, "arguments": ""}}]))
        if isinstance(delta, ToolCallArguments):
            return self._chunk(s.Delta(tool_calls=[{
                "index": delta.index, "function": {"arguments": delta.text}}]))
        return None

    def end_frame(self, finish: Finish) -> Any:
        delta = s.Delta(reasoning_only=True) if finish.reasoning_only else s.Delta()
        return self._chunk(delta, FINISH[finish.reason])

    def choice(self, answer: Answer) -> s.ChatChoice:
        """One answer as a choice of the non-streaming body."""
        finish = answer.finish
        assert finish is not None
        calls = [{"id": c.id, "type": "function",
                  "function": {"name": c.name, "arguments": c.arguments}}
                 for c in answer.calls] or None
        message = s.AssistantMessage(
            content=answer.content if answer.content or not calls else None,
            tool_calls=calls or UNSET, reasoning_content=answer.reasoning or UNSET,
            reasoning_only=True if finish.reasoning_only else UNSET)
        lps = chat_logprobs(self.tok, answer.logprobs) if self.logprobs else None
        return s.ChatChoice(self.index, message, FINISH[finish.reason], lps)


class CompletionEncoder(_Encoder):
    """``text_completion`` frames: the echoed prompt first (when asked), then text with
    logprobs whose ``text_offset`` counts from the start of the returned text."""

    chunk_type = body_type = s.Completion

    def __init__(self, *args: Any, logprobs: bool = False, echoed: str = "", **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.logprobs, self.echoed, self.offset = logprobs, echoed, len(echoed)

    def first(self) -> bytes | None:
        if not self.echoed:
            return None
        return sse(s.Completion(self.rid, self.created, self.model,
                                [s.CompletionChoice(self.index, self.echoed, None)]))

    def progress(self, p: PromptProgress) -> list[bytes]:
        extra = {}
        if self.verbose:
            prompt_n = self.timed[1] if self.timed is not None else 0
            extra["__verbose"] = native_chunk(self.index, "", [], 0, prompt_n,
                                              prompt_progress=progress_object(p))
        return self._progress(p, {"text": "", "index": self.index, "logprobs": None,
                                  "finish_reason": None}, "text_completion", **extra)

    def _frame(self, text: str, finish: str | None, logprobs: dict | None) -> s.Completion:
        return s.Completion(self.rid, self.created, self.model,
                            [s.CompletionChoice(self.index, text, finish, logprobs)],
                            timings=self.timings())

    def delta_frame(self, delta: Delta) -> Any:
        if not isinstance(delta, ContentDelta):
            return None
        lps = completion_logprobs(self.tok, delta.logprobs, self.offset) \
            if delta.logprobs else None
        self.offset += len(delta.text)
        frame = self._frame(delta.text, None, lps)
        if self.verbose:
            frame.verbose = self._native_chunk(delta, frame.timings)
        return frame

    def _native_chunk(self, delta: ContentDelta, timings: Any) -> dict[str, Any]:
        """The native chunk a ``text_completion`` chunk stands for (its ``__verbose``)."""
        extra: dict[str, Any] = {} if timings is UNSET else {"timings": timings}
        if delta.logprobs:
            extra["completion_probabilities"] = probabilities(self.tok, delta.logprobs)
        if self.timed is None:
            return native_chunk(self.index, delta.text, [], 0, 0, **extra)
        watch, prompt_n, _ = self.timed
        return native_chunk(self.index, delta.text, watch.take_unsent(), len(watch.tokens),
                            prompt_n, **extra)

    def end_frame(self, finish: Finish) -> Any:
        return self._frame("", FINISH[finish.reason], None)

    def choice(self, answer: Answer) -> s.CompletionChoice:
        finish = answer.finish
        assert finish is not None
        lps = completion_logprobs(self.tok, answer.logprobs) if self.logprobs else None
        return s.CompletionChoice(self.index, self.echoed + answer.content,
                                  FINISH[finish.reason], lps)

"""llama-server's native response: streamed chunks ``{"content", "stop": false, ...}``, then
one final object with ``stop: true`` and the stats (``stop_type``, ``stopping_word``,
``timings``, ``generation_settings``, ...), which is also the non-streaming body.

What the answer's deltas do not say is read off the engine's events as they pass
(``Watch``): the generated token ids, and when the first and last token arrived.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from mlxcel.chat.answer import failure
from mlxcel.dialects.wire import error_frame, sse
from mlxcel.model.tokenizer import Tokenizer
from mlxcel.types import ContentDelta, Delta, Finish, GenerationEvent, TokenLogprob, Usage

from .completion import Plan

# answer finish reasons -> llama-server's stop_type ("stop" is "eos" or "word", below)
STOP_TYPES = {"length": "limit"}


class Watch:
    """The engine's event stream for one request, seen on its way to the chat layer."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.submitted = time.perf_counter()
        self.first: float | None = None
        self.last: float | None = None
        self.tokens: list[int] = []
        self.unsent = 0  # how many of ``tokens`` no chunk has carried yet

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> GenerationEvent:
        return self._see(await self.stream.__anext__())

    def take_ready(self) -> list[GenerationEvent]:
        return [self._see(e) for e in self.stream.take_ready()]

    def cancel(self) -> None:
        self.stream.cancel()

    def _see(self, event: GenerationEvent) -> GenerationEvent:
        now = time.perf_counter()
        if self.first is None and (event.token_ids or event.finish_reason is not None):
            self.first = now
        self.last = now
        self.tokens += event.token_ids
        self.unsent += len(event.token_ids)
        return event

    def take_unsent(self) -> list[int]:
        out = self.tokens[len(self.tokens) - self.unsent:] if self.unsent else []
        self.unsent = 0
        return out


    def timings(self, usage: Usage, silent: bool) -> dict[str, Any]:
        """llama-server's ``timings``: prompt from submission to the first token, predicted
        from the first token to the last."""
        first = self.first or self.submitted
        prompt_n = usage.prompt_tokens - usage.cached_tokens
        predicted_n = 0 if silent else usage.completion_tokens
        return {"cache_n": usage.cached_tokens,
                **_rate("prompt", prompt_n, (first - self.submitted) * 1e3),
                **_rate("predicted", predicted_n, ((self.last or first) - first) * 1e3)}


def _rate(name: str, n: int, ms: float) -> dict[str, Any]:
    return {f"{name}_n": n, f"{name}_ms": ms,
            f"{name}_per_token_ms": ms / n if n else 0.0,
            f"{name}_per_second": n * 1e3 / ms if n and ms > 0 else 0.0}


def probabilities(tok: Tokenizer, items: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """``completion_probabilities``: each token with its logprob and ``top_logprobs``."""
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = tok.decode([token_id], skip_special=False)
        return {"id": token_id, "token": text, "bytes": list(text.encode("utf-8")),
                "logprob": logprob}
    return [{**entry(it.token, it.logprob), "top_logprobs": [entry(t, lp) for t, lp in it.top]}
            for it in items]


class NativeEncoder:
    """The frames and the final object of one native completion (``index``: its place
    among the request's prompts)."""

    def __init__(self, plan: Plan, watch: Watch, tok: Tokenizer, *, index: int,
                 settings: dict[str, Any], context_size: int, return_tokens: bool,
                 timings_per_token: bool, truncated: bool = False) -> None:
        self.plan, self.watch, self.tok, self.index = plan, watch, tok, index
        self.settings, self.context_size = settings, context_size
        self.return_tokens, self.timings_per_token = return_tokens, timings_per_token
        self.input_truncated = truncated
        self.prompt_n = len(plan.request.prompt_tokens)

    # -- streaming ---------------------------------------------------------------------
    def first(self) -> bytes | None:
        return None

    def encode(self, deltas: list[Delta]) -> list[bytes]:
        """Chunks for content; after the ``Finish``, the final object (or an error frame
        when the answer failed). llama-server's native stream has no ``[DONE]``."""
        out = []
        for delta in deltas:
            if isinstance(delta, Finish):
                if not delta.ok:
                    return [*out, error_frame(failure(delta))]
                return [*out, sse(self.final(delta, "", []))]
            if isinstance(delta, ContentDelta) and not self.plan.silent:
                out.append(sse(self.chunk(delta)))
        return out

    def chunk(self, delta: ContentDelta) -> dict[str, Any]:
        body: dict[str, Any] = {
            "index": self.index, "content": delta.text, "tokens": self.watch.take_unsent(),
            "stop": False, "tokens_predicted": len(self.watch.tokens),
            "tokens_evaluated": self.prompt_n}
        if self.timings_per_token:
            body["timings"] = self.watch.timings(_running(self), False)
        if delta.logprobs:
            body["completion_probabilities"] = probabilities(self.tok, delta.logprobs)
        return body

    # -- the final object --------------------------------------------------------------
    def final(self, finish: Finish, content: str, logprobs: Sequence[TokenLogprob]
              ) -> dict[str, Any]:
        """The last frame of a stream (``content`` empty: it was streamed) or the whole
        non-streaming body."""
        usage = finish.usage
        assert usage is not None
        silent = self.plan.silent
        word = finish.stop_sequence or ""
        stop_type = STOP_TYPES.get(finish.reason, "word" if word else "eos")
        if silent:
            content, stop_type, word = "", "limit", ""
        predicted = 0 if silent else usage.completion_tokens
        body: dict[str, Any] = {
            "index": self.index, "content": content,
            "tokens": self.watch.tokens if self.return_tokens and not silent else [],
            "stop": True, "model": self.settings["model"],
            "tokens_predicted": predicted, "tokens_evaluated": usage.prompt_tokens,
            "generation_settings": self.settings, "has_new_line": "\n" in content,
            "truncated": self.input_truncated or self._context_full(finish, usage),
            "stop_type": stop_type, "stopping_word": word,
            "tokens_cached": usage.cached_tokens,
            "timings": self.watch.timings(usage, silent)}
        if logprobs and not silent:
            body["completion_probabilities"] = probabilities(self.tok, logprobs)
        return body

    def _context_full(self, finish: Finish, usage: Usage) -> bool:
        """Generation ended because the context window was full, not at ``n_predict``."""
        return finish.reason == "length" and usage.total_tokens >= self.context_size


def _running(encoder: NativeEncoder) -> Usage:
    """The usage so far, for a chunk's ``timings`` (the cache is known at the end only)."""
    return Usage(prompt_tokens=encoder.prompt_n, completion_tokens=len(encoder.watch.tokens))

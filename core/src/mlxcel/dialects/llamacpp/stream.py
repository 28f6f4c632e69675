"""llama-server's native response: streamed chunks ``{"content", "stop": false, ...}``, then
one final object with ``stop: true`` and the stats (``stop_type``, ``stopping_word``,
``timings``, ``generation_settings``, ...), which is also the non-streaming body.

What the answer's deltas do not say is read off the engine's events as they pass
(``dialects.timings.Watch``): the generated token ids, and when the first and last token
arrived. With ``return_progress``, chunks with ``prompt_progress`` come first, one per
prefill chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlxcel.chat.answer import failure
from mlxcel.dialects.timings import Watch, progress_object
from mlxcel.dialects.wire import error_frame, sse
from mlxcel.model.tokenizer import Tokenizer
from mlxcel.types import ContentDelta, Delta, Finish, TokenLogprob, Usage
from mlxcel.types.events import PromptProgress

from .completion import Plan

# answer finish reasons -> llama-server's stop_type ("stop" is "eos" or "word", below)
STOP_TYPES = {"length": "limit"}


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

    def progress(self, p: PromptProgress) -> list[bytes]:
        """A prefill chunk's progress, as llama-server streams it: an empty chunk with
        ``prompt_progress``."""
        return [sse({"index": self.index, "content": "", "tokens": [], "stop": False,
                     "tokens_predicted": 0, "tokens_evaluated": self.prompt_n,
                     "prompt_progress": progress_object(p)})]

    def chunk(self, delta: ContentDelta) -> dict[str, Any]:
        body: dict[str, Any] = {
            "index": self.index, "content": delta.text, "tokens": self.watch.take_unsent(),
            "stop": False, "tokens_predicted": len(self.watch.tokens),
            "tokens_evaluated": self.prompt_n}
        if self.timings_per_token:
            body["timings"] = self.watch.timings(self.watch.running(self.prompt_n))
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

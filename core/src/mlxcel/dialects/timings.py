"""llama-server's ``timings`` object and ``prompt_progress``, for every dialect that sends
them: the native routes always, the OpenAI and Responses routes when a request asks
(``timings_per_token``, ``return_progress``).

What an answer's events do not say is read off them as they pass (``Watch``): the
generated token ids, and when the first and the last token arrived. The prompt's time runs
from its prefill's start (the engine's stream says when: llama-server's
``t_start_process_prompt``, so time queued for a slot is not the prompt's) to the first
token; the generation's from the first token to the last.
"""

from __future__ import annotations

import time
from typing import Any

from mlxcel.types import GenerationEvent, Usage
from mlxcel.types.events import PromptProgress


class Watch:
    """The engine's event stream for one request, seen on its way to the chat layer."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.submitted = time.perf_counter()
        self.first: float | None = None
        self.last: float | None = None
        self.tokens: list[int] = []
        self.unsent = 0  # how many of ``tokens`` no chunk has carried yet
        self.cached = 0  # prompt tokens the prompt cache served (progress events say it)

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> GenerationEvent:
        return self._see(await self.stream.__anext__())

    def take_ready(self) -> list[GenerationEvent]:
        return [self._see(e) for e in self.stream.take_ready()]

    def cancel(self) -> None:
        self.stream.cancel()

    def _see(self, event: GenerationEvent) -> GenerationEvent:
        if event.progress is not None:
            self.cached = event.progress.cache
            return event
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

    def running(self, prompt_tokens: int) -> Usage:
        """The usage so far, for a chunk's ``timings`` before the answer ends."""
        return Usage(prompt_tokens=prompt_tokens, completion_tokens=len(self.tokens),
                     cached_tokens=self.cached)

    def timings(self, usage: Usage, silent: bool = False) -> dict[str, Any]:
        """llama-server's ``timings`` (``silent``: no token is reported as predicted), with
        the speculative counters when a drafter ran for the request."""
        start = getattr(self.stream, "prefill_at", None) or self.submitted
        first = self.first or start
        prompt_n = usage.prompt_tokens - usage.cached_tokens
        predicted_n = 0 if silent else usage.completion_tokens
        out = {"cache_n": usage.cached_tokens,
               **_rate("prompt", prompt_n, max(0.0, first - start) * 1e3),
               **_rate("predicted", predicted_n, ((self.last or first) - first) * 1e3)}
        if usage.draft_rounds:
            out.update(draft_n=usage.draft_n, draft_n_accepted=usage.draft_n_accepted,
                       draft_rounds=usage.draft_rounds, draft_kind=usage.draft_kind)
        return out


def _rate(name: str, n: int, ms: float) -> dict[str, Any]:
    return {f"{name}_n": n, f"{name}_ms": ms,
            f"{name}_per_token_ms": ms / n if n else 0.0,
            f"{name}_per_second": n * 1e3 / ms if n and ms > 0 else 0.0}


def progress_object(p: PromptProgress) -> dict[str, int]:
    """``prompt_progress`` as llama-server writes it."""
    return {"total": p.total, "cache": p.cache, "processed": p.processed,
            "time_ms": p.time_ms}

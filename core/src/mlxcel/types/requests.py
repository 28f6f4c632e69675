"""What a dialect hands to the engine."""

from __future__ import annotations

from typing import Any

import msgspec

from mlxcel.types.media import MediaPrompt


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """Resolved sampling settings for one request (server defaults already applied).

    The chain is documented in docs/explanation/sampling.md.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    p_less: bool = False
    repetition_penalty: float = 1.0
    repetition_context_size: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 0  # 0 = the whole context
    dry_sequence_breakers: tuple[int, ...] = ()
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    # (token id, bias) added to the logits first; -inf: never (mlxcel.chat.logit_bias)
    logit_bias: tuple[tuple[int, float], ...] = ()

    @property
    def uses_history(self) -> bool:
        """Whether sampling needs the tokens generated so far (penalties, DRY)."""
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0 or self.dry_multiplier > 0.0)


class LoopPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Tail n-gram loop detection: stop when a pattern of ``min_pattern_size`` to
    ``max_pattern_size`` tokens repeats ``min_count`` times in a row at the end."""

    min_pattern_size: int = 1
    max_pattern_size: int = 20
    min_count: int = 4

    @property
    def enabled(self) -> bool:
        return self.max_pattern_size > 0 and self.min_count >= 2


class ReasoningLimit(msgspec.Struct, frozen=True, kw_only=True):
    """A reasoning budget: once ``budget`` tokens were generated inside reasoning blocks
    (``open`` ... ``close``; ``inside``: the prompt opened one), the close marker's tokens
    ``close_ids`` are forced (``mlxcel.engine.budget``). 0 ends the reasoning at once."""

    budget: int
    open: str
    close: str
    close_ids: tuple[int, ...]
    inside: bool = False


class LazyStart(msgspec.Struct, frozen=True, kw_only=True):
    """Where a lazy constraint (llama-server's ``grammar_lazy``) starts: at the first
    generated token in ``tokens``, or at the first match of one of ``patterns`` (Python
    regular expressions) in the output so far, one anchored ``^...$`` matching the whole
    output, the others anywhere in it. The constraint begins where the match does (at its
    first non-empty group, else its start), and the text from there is fed through it,
    so the grammar matches the trigger too; the output before it is free."""

    patterns: tuple[str, ...] = ()
    tokens: tuple[int, ...] = ()


# Prompt boundaries the chat layer marks (GenerationRequest.cache_marks): the end of the
# system + tools prefix, and the message boundaries of the last turn. The engine adds
# "prompt" (the prompt's end) and "interval" (every --cache-checkpoint-interval blocks).
CACHE_MARKS = ("system", "turn")


class GenerationRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One generation: token ids in, events out.

    ``guide``: the compiled constraint (``mlxcel.engine.constraints.Compiled``) every
    generated token must obey, compiled before the request is queued so that the engine
    never waits for a compile. ``guide_after``: text that starts the constraint once the
    output contains it (the end of a reasoning block the prompt opened); None = from the
    first token. ``guide_lazy``: the constraint starts at a trigger instead, ``guide_after``
    unused (``LazyStart``). ``reasoning_limit``: the answer's reasoning budget (None:
    unrestricted).
    """

    request_id: str
    prompt_tokens: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    priority: int = 1  # 0 high, 1 normal, 2 low
    loop: LoopPolicy | None = None
    cache_prompt: bool = True  # False: prefill cold and leave nothing in the prompt cache
    # (position, kind): prompt boundaries later prompts share (CACHE_MARKS), where a model
    # whose caches cannot be cut back keeps a checkpoint (mlxcel.engine.cache.capture)
    cache_marks: tuple[tuple[int, str], ...] = ()
    # (position, digest): non-token inputs' content digests, hashed with the prompt's blocks
    # (mlxcel.engine.cache.entries.block_hashes)
    media_digests: tuple[tuple[int, bytes], ...] = ()
    # the prompt's media (a family's expansion: its model inputs, the items' spans); the
    # engine prefills such a row from its input embeddings (mlxcel.engine.media_rows)
    media: MediaPrompt | None = None
    guide: Any = None
    guide_after: str | None = None
    guide_lazy: LazyStart | None = None
    reasoning_limit: ReasoningLimit | None = None
    # send a ``progress`` event after each prefill chunk (llama-server's ``return_progress``)
    return_progress: bool = False
    # llama-server's ``speculative.n_max`` / ``speculative.n_min``: this request's draft
    # length cap and floor (None: ``--draft-max`` / ``--draft-min``; 0 cap: no drafts)
    draft_max: int | None = None
    draft_min: int | None = None

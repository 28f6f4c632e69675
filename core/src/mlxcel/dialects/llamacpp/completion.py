"""llama-server's native ``/completion`` request -> prompt token ids and a GenerationRequest.

llama-server's names and values are read as llama-server reads them: ``n_predict`` -1 is
no limit (the context bounds it), 0 evaluates the prompt into the prompt cache and returns
no text; ``repeat_last_n`` 0 and ``dry_penalty_last_n`` 0 turn their penalty off; a
negative ``temperature`` samples greedily, a ``top_k`` <= 0 keeps every token, ``seed`` -1
is a random seed. The rules that every dialect shares (ranges, defaults, stop strings) are
``mlxcel.chat.request``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from mlxcel.chat.logit_bias import bias_settings, request_bias
from mlxcel.chat.reasoning import budget_limit, prompt_opens
from mlxcel.chat.request import (
    REASONING_BUDGET_ALIASES,
    SEED_UNSET,
    one_prompt,
    reasoning_budget,
    request_loop_policy,
    sampling_params,
    server_loop_policy,
    server_sampling_defaults,
    stop_strings,
)
from mlxcel.context import AppContext
from mlxcel.dialects.choices import check_choices
from mlxcel.dialects.draft_fields import draft_limits
from mlxcel.dialects.prepare import check_token_ids, encode_prompt
from mlxcel.errors import ContextLengthExceeded, InvalidRequest
from mlxcel.types import GenerationRequest, ReasoningLimit, SamplingParams
from mlxcel.types.media import MediaPrompt

from .media import RawMedia, expanded
from .schemas import CompletionRequest, NativeFields

# SamplingParams field -> llama-server's request field
WIRE_NAMES = {"repetition_penalty": "repeat_penalty",
              "repetition_context_size": "repeat_last_n"}
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "p_less", "frequency_penalty",
                 "presence_penalty", "dry_multiplier", "dry_base", "dry_allowed_length",
                 "dry_penalty_last_n", "xtc_probability", "xtc_threshold", "seed")
LOOP_FIELDS = ("min_pattern_size", "max_pattern_size", "min_count")
MAX_N_PROBS = 20
PROMPT_TAIL = 64  # tokens of a raw prompt read to see whether it opened a reasoning block


@dataclass(frozen=True)
class Plan:
    """One native request as the engine runs it, plus what its response reports:
    ``n_predict`` as resolved (-1 = none), ``silent`` for ``n_predict: 0`` (one token is
    generated to run the prefill, and never shown), the reasoning budget as sent."""

    request: GenerationRequest
    n_predict: int
    silent: bool
    n_probs: int
    reasoning_budget: int | None


def refuse_unsupported(body: NativeFields) -> None:
    """llama-server fields this server cannot honour, refused instead of ignored: a client
    that sends them would get something other than it asked for."""
    fmt = body.response_format
    if fmt is not None and fmt != {"type": "text"}:
        raise InvalidRequest("'response_format' other than {\"type\": \"text\"} is not "
                             "supported here; use /v1/chat/completions for JSON-schema "
                             "constrained decoding", param="response_format")
    if body.post_sampling_probs:
        raise InvalidRequest("'post_sampling_probs' is not supported: 'n_probs' reports the "
                             "model's own log-probabilities", param="post_sampling_probs")
    if body.lora:
        raise InvalidRequest("'lora' adapters are not supported", param="lora")


# -- prompts --------------------------------------------------------------------------------
def split_prompts(prompt: Any) -> list[Any]:
    """The prompts of a request: one, or each element of a list of prompts."""
    if isinstance(prompt, list) and not prompt:
        raise InvalidRequest("'prompt' is an empty list", param="prompt")
    return [prompt] if one_prompt(prompt) else list(prompt)


def mixed_tokens(engine: Any, pieces: list[Any], param: str, bos: bool,
                 bounded: bool = True) -> list[int]:
    """Token ids of strings and ids in order; the first piece, when a string, gets the
    tokenizer's BOS if ``bos`` (as llama-server adds it). ``bounded``: a string that
    cannot fit the context window is refused before it is tokenized whole (unbounded
    for text that is cut to fit afterwards; the body size limit bounds it)."""
    tok = engine.checkpoint.tokenizer
    ids: list[int] = []
    for i, piece in enumerate(pieces):
        special = bos and i == 0
        if type(piece) is int:
            ids.append(piece)
        elif isinstance(piece, str):
            ids += encode_prompt(engine, piece, param, special) if bounded \
                else tok.encode(piece, special)
        else:
            raise InvalidRequest(f"'{param}' takes strings and token ids only", param=param)
    check_token_ids(tok, ids, param)
    return ids


def _prompt_text(prompt: dict[str, Any], param: str) -> str:
    """An object prompt's text; its ``multimodal_data`` (``media``) is read by
    ``native_prompt``, never here."""
    text = prompt.get("prompt_string")
    if not isinstance(text, str):
        raise InvalidRequest(f"'{param}' as an object needs a string 'prompt_string'",
                             param=param)
    return text


def prompt_tokens(engine: Any, prompt: Any, param: str = "prompt") -> list[int]:
    """One prompt's token ids, within the context window (blocking work: run it through
    ``prepare``). An empty prompt is the BOS alone, or a 400 without one."""
    if isinstance(prompt, dict):
        prompt = _prompt_text(prompt, param)
    if not isinstance(prompt, (str, list)):
        raise InvalidRequest(f"each of '{param}' must be a string, a list of token ids and "
                             "strings, or an object with 'prompt_string'", param=param)
    ids = mixed_tokens(engine, [prompt] if isinstance(prompt, str) else prompt, param,
                       bos=True)
    tok = engine.checkpoint.tokenizer
    if not ids:
        if tok.bos_token is None:
            raise InvalidRequest(f"'{param}' is empty", param=param)
        ids = [tok.hf.token_to_id(tok.bos_token)]
    return fits(engine, ids, param)


def native_prompt(ctx: AppContext, prompt: Any, raw: RawMedia | None,
                  options: dict[str, Any]) -> tuple[list[int], MediaPrompt | None]:
    """One prompt's token ids and, for the multimodal form (``raw``, checked by
    ``media.gather``), its images expanded (blocking work: run it through ``prepare``)."""
    engine = ctx.engine
    if raw is None:
        return prompt_tokens(engine, prompt), None
    found = expanded(ctx, raw, options,
                     lambda text, param: mixed_tokens(engine, [text], param, bos=True))
    return fits(engine, list(found.token_ids), raw.param), found


def fits(engine: Any, ids: list[int], param: str) -> list[int]:
    """``ids`` when they leave room for one generated token, else the spec's 400."""
    ctx = engine.context_size
    if len(ids) >= ctx:
        raise ContextLengthExceeded(
            f"the prompt has {len(ids)} tokens, more than the context window of {ctx} "
            "tokens allows (leave room for at least one generated token)", param=param,
            n_prompt_tokens=len(ids), n_ctx=ctx)
    return ids


# -- sampling ---------------------------------------------------------------------------------
def _breakers(engine: Any, values: list[str | int] | None) -> list[int] | None:
    """DRY sequence breakers as token ids: ids as they are, a string when it is one token
    of the vocabulary (the engine breaks matches at token ids)."""
    if values is None:
        return None
    tok = engine.checkpoint.tokenizer
    out = []
    for value in values:
        if isinstance(value, str):
            ids = tok.encode(value, False)
            if len(ids) != 1:
                raise InvalidRequest(f"'dry_sequence_breakers': {value!r} is {len(ids)} "
                                     "tokens; each breaker must be one token (or its id)",
                                     param="dry_sequence_breakers")
            value = ids[0]
        out.append(value)
    return out


def _fields(engine: Any, body: NativeFields) -> dict[str, Any]:
    """The request's sampling values under SamplingParams' names, in llama-server's
    meaning (module docstring)."""
    fields: dict[str, Any] = {k: getattr(body, k) for k in SAMPLING_KEYS}
    fields["repetition_penalty"] = body.repeat_penalty
    fields["repetition_context_size"] = body.repeat_last_n
    fields["dry_sequence_breakers"] = _breakers(engine, body.dry_sequence_breakers)
    if body.repeat_last_n == 0:
        fields["repetition_penalty"], fields["repetition_context_size"] = 1.0, None
    if body.dry_penalty_last_n == 0:
        fields["dry_multiplier"], fields["dry_penalty_last_n"] = 0.0, None
    temp, top_k, seed = body.temperature, body.top_k, body.seed
    if isinstance(temp, (int, float)) and temp < 0:
        fields["temperature"] = 0.0
    if type(top_k) is int and top_k < 0:
        fields["top_k"] = 0
    if seed == -1:
        fields["seed"] = SEED_UNSET
    return fields


def n_predict_of(body: NativeFields, settings: Any) -> int:
    """The request's ``n_predict`` as resolved (module docstring)."""
    return _n_predict(body, settings.n_predict)


def _n_predict(body: NativeFields, server_default: int) -> int:
    """``n_predict`` (else ``max_tokens``, else the server's ``--n-predict``): -1 or more."""
    field = "n_predict" if body.n_predict is not None else "max_tokens"
    value = body.n_predict if body.n_predict is not None else body.max_tokens
    if value is None:
        return server_default if server_default > 0 else -1
    if type(value) is not int or value < -1:
        raise InvalidRequest(f"'{field}' must be -1 (no limit), 0 or a positive integer",
                             param=field)
    return value


def _n_probs(value: int) -> int:
    if type(value) is not int or not 0 <= value <= MAX_N_PROBS:
        raise InvalidRequest(f"'n_probs' must be between 0 and {MAX_N_PROBS}",
                             param="n_probs")
    return value


def _limit(ckpt: Any, prompt: list[int], budget: int) -> ReasoningLimit | None:
    """The reasoning budget of a raw prompt: the answer starts inside a block when the
    prompt's tail opened one (a raw prompt has no template to ask)."""
    spec = ckpt.reasoning
    if spec is None or budget < 0:
        return None
    tail = ckpt.tokenizer.decode(prompt[-PROMPT_TAIL:], skip_special=False)
    return budget_limit(spec, budget, ckpt.tokenizer, prompt_opens(tail, spec))


def native_plan(ctx: AppContext, body: NativeFields, prompt: list[int], request_id: str,
                priority: int, media: MediaPrompt | None = None) -> Plan:
    """Validate the request's generation fields and build what the engine runs
    (``media``: the prompt's images, expanded)."""
    engine = ctx.engine
    ckpt = ctx.checkpoint
    defaults = server_sampling_defaults(ckpt, ctx.settings)
    n_probs = _n_probs(body.n_probs)
    sampling = sampling_params(_fields(engine, body), defaults, logprobs=n_probs > 0,
                               top_logprobs=n_probs, names=WIRE_NAMES)
    sampling = msgspec.structs.replace(sampling, logit_bias=request_bias(
        body.logit_bias, ckpt.tokenizer, body.ignore_eos))
    server_loop = server_loop_policy(ckpt.family.loop_detection, ctx.settings.loop_detection)
    loop = request_loop_policy({k: getattr(body, k) for k in LOOP_FIELDS}, server_loop)
    n_predict = _n_predict(body, ctx.settings.n_predict)
    wanted = None if n_predict < 0 else max(n_predict, 1)
    budget = reasoning_budget({k: getattr(body, k) for k in REASONING_BUDGET_ALIASES})
    if budget is None:
        budget = ctx.settings.reasoning_budget
    req = GenerationRequest(
        request_id=request_id, prompt_tokens=tuple(prompt),
        max_tokens=engine.fit(len(prompt), wanted), sampling=sampling,
        stop=stop_strings(body.stop), ignore_eos=body.ignore_eos, priority=priority,
        loop=loop, cache_prompt=body.cache_prompt is not False,
        reasoning_limit=_limit(ckpt, prompt, budget), media=media,
        media_digests=media.digest_positions() if media is not None else (),
        return_progress=body.return_progress and body.stream, **draft_limits(body))
    return Plan(req, n_predict, n_predict == 0, n_probs, budget if budget >= 0 else None)


def choices_of(ctx: AppContext, body: NativeFields) -> int:
    """Completions per prompt: ``n_cmpl``, else ``n`` (llama-server's alias), else 1;
    within what ``choices.check_choices`` allows."""
    field = "n_cmpl" if body.n_cmpl is not None else "n"
    value = getattr(body, field)
    return 1 if value is None else check_choices(ctx, value, field)


def generation_settings(ctx: AppContext, plan: Plan, stream: bool,
                        body: NativeFields | None = None) -> dict[str, Any]:
    """llama-server's ``generation_settings``: the values this request ran with; the
    grammar fields as ``body`` sent them (a JSON schema's grammar is not GBNF here, so
    ``grammar`` is only a GBNF grammar sent as one)."""
    sp: SamplingParams = plan.request.sampling
    req = plan.request
    grammar = body.grammar if body is not None and isinstance(body.grammar, str) else ""
    return {
        "n_predict": plan.n_predict, "max_tokens": plan.n_predict,
        "seed": SEED_UNSET if sp.seed is None else sp.seed, "temperature": sp.temperature,
        "top_k": sp.top_k, "top_p": sp.top_p, "min_p": sp.min_p, "p_less": sp.p_less,
        "xtc_probability": sp.xtc_probability, "xtc_threshold": sp.xtc_threshold,
        "repeat_last_n": sp.repetition_context_size or -1, "repeat_penalty":
        sp.repetition_penalty, "presence_penalty": sp.presence_penalty,
        "frequency_penalty": sp.frequency_penalty, "dry_multiplier": sp.dry_multiplier,
        "dry_base": sp.dry_base, "dry_allowed_length": sp.dry_allowed_length,
        "dry_penalty_last_n": sp.dry_penalty_last_n or -1,
        "dry_sequence_breakers": list(sp.dry_sequence_breakers),
        "stop": list(plan.request.stop), "ignore_eos": plan.request.ignore_eos,
        "logit_bias": bias_settings(sp.logit_bias),
        "stream": stream, "n_probs": plan.n_probs,
        "cache_prompt": plan.request.cache_prompt,
        "reasoning_budget": -1 if plan.reasoning_budget is None else plan.reasoning_budget,
        "n_ctx": ctx.engine.context_size, "model": ctx.model_name,
        "grammar": grammar, "grammar_lazy": req.guide_lazy is not None,
        "grammar_triggers": list(body.grammar_triggers or []) if body is not None else [],
        "preserved_tokens": list(body.preserved_tokens or []) if body is not None else [],
        "speculative.n_max": ctx.settings.draft_max if req.draft_max is None
        else req.draft_max,
        "speculative.n_min": ctx.settings.draft_min if req.draft_min is None
        else req.draft_min,
    }


def body_prompts(body: CompletionRequest, max_prompts: int) -> list[Any]:
    """The request's prompts; streaming takes one (llama-server interleaves several
    prompts' chunks, which this server does not). At most ``max_prompts`` (the slots,
    ``--parallel``), so one request cannot take every slot and the whole queue."""
    prompts = split_prompts(body.prompt)
    if len(prompts) > max_prompts:
        raise InvalidRequest(f"'prompt' holds {len(prompts)} prompts; a request takes at most "
                             f"{max_prompts} (the server's slots): send the rest in "
                             "another request", param="prompt")
    if body.stream and len(prompts) > 1:
        raise InvalidRequest("a streaming request takes one prompt; send the prompts as "
                             "separate requests, or without 'stream'", param="prompt")
    return prompts

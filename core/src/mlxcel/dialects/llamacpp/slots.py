"""``GET /slots``: one object per slot, then one per queued request.

Each carries the spec's fields (``id``, ``state``, ``model``, ``context_size``,
``is_processing``) and llama-server's (``server_slot::to_json``, as ``/slots`` shows it
without ``--slots-debug``): ``n_ctx`` and ``speculative``, and for a slot that holds a
request ``id_task``, ``n_prompt_tokens``, ``n_prompt_tokens_processed``,
``n_prompt_tokens_cache``, ``params`` (the request's sampling settings under llama-server's
names) and ``next_token`` (a one-element array, as llama-server writes it). Sampling
features this engine does not have carry the value that turns them off in llama-server
(``mirostat: 0``, ``typical_p: 1.0``, ...), so a client reads what the slot really does.

With a drafter (``--prompt-lookup``, ``-md``, ...), ``params`` holds the row's draft
limits under llama-server's ``speculative.n_max`` / ``speculative.n_min``, and a decoding
slot carries ``draft``: its row's verify rounds, drafted and accepted tokens, and its
governors' state (``Speculation.row_state``: drafting, backed off or paused until a step,
or off, and the draft length allowed now), an mlxcel field llama-server does not have.
"""

from __future__ import annotations

from typing import Any

from mlxcel.chat.request import SEED_UNSET

# the engine's sampling chain, in llama-server's sampler names (docs/explanation/sampling.md)
SAMPLERS = ("penalties", "dry", "top_k", "top_p", "min_p", "xtc", "temperature")
# llama-server's sampling features this engine does not have, at their "off" values
OFF = {"dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "top_n_sigma": -1.0,
       "typical_p": 1.0, "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1,
       "n_keep": 0, "n_discard": 0, "min_keep": 0, "post_sampling_probs": False,
       "lora": []}


def params(req: Any) -> dict[str, Any]:
    """A running request's ``params``, as llama-server's ``task_params::to_json`` names
    them (the ``/slots`` subset)."""
    sp = req.sampling
    return {
        "seed": SEED_UNSET if sp.seed is None else sp.seed,
        "temperature": sp.temperature, "top_k": sp.top_k, "top_p": sp.top_p,
        "min_p": sp.min_p, "xtc_probability": sp.xtc_probability,
        "xtc_threshold": sp.xtc_threshold,
        "repeat_last_n": sp.repetition_context_size or -1,
        "repeat_penalty": sp.repetition_penalty, "presence_penalty": sp.presence_penalty,
        "frequency_penalty": sp.frequency_penalty, "dry_multiplier": sp.dry_multiplier,
        "dry_base": sp.dry_base, "dry_allowed_length": sp.dry_allowed_length,
        "dry_penalty_last_n": sp.dry_penalty_last_n or -1,
        "max_tokens": req.max_tokens, "n_predict": req.max_tokens,
        "ignore_eos": req.ignore_eos, "n_probs": sp.top_logprobs,
        "samplers": list(SAMPLERS), **OFF,
    }


def running(seq: Any, tokenizer: Any, spec: Any = None, rows: int = 1) -> dict[str, Any]:
    """The fields of a slot that holds ``seq`` (an engine ``Sequence``); ``spec``: the
    engine's ``Speculation`` (None: no drafter), ``rows``: the rows decoding now."""
    req = seq.req
    prompt, cached, generated = len(req.prompt_tokens), seq.cached, seq.generated
    text = tokenizer.decode(seq.generated_ids) if generated else ""
    out = {
        "id_task": seq.order, "n_prompt_tokens": prompt,
        "n_prompt_tokens_processed": prompt - cached, "n_prompt_tokens_cache": cached,
        "params": params(req),
        "next_token": [{"has_next_token": not seq.finished, "has_new_line": "\n" in text,
                        "n_remain": max(0, req.max_tokens - generated),
                        "n_decoded": generated}],
    }
    if spec is not None:
        draft = spec.row_state(seq, rows)
        out["params"].update({"speculative.n_max": draft["n_max"],
                              "speculative.n_min": draft["n_min"]})
        out["draft"] = draft
    return out


def slots_payload(ctx: Any) -> list[dict[str, Any]]:
    """Slots ("decoding" / "idle"), then queued requests ("queued"), in that order."""
    engine = ctx.engine
    context_size = engine.context_size  # raises ModelLoading (503) while loading
    rows = engine.slot_rows()
    states = [*engine.slot_states(), *["queued"] * engine.queue_depth]
    speculative = engine.speculative
    spec = getattr(engine, "speculation", None)
    tokenizer = ctx.checkpoint.tokenizer
    out = []
    for i, state in enumerate(states):
        slot = {"id": i, "state": state, "model": ctx.model_name,
                "context_size": context_size, "n_ctx": context_size,
                "speculative": speculative, "is_processing": state == "decoding"}
        if state == "decoding" and i < len(rows):
            slot.update(running(rows[i], tokenizer, spec, len(rows)))
        out.append(slot)
    return out

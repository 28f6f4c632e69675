"""llama-server routes: /completion(s), /infill, /apply-template, /tokenize, /detokenize,
/health (and /), /props, /slots, the prompt cache, and the side models' native routes
(``retrieval``: embedding and rerank)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from litestar import Request, Response, get, post

from mlxcel.chat.prompt import render_chat
from mlxcel.chat.request import SEED_UNSET, server_sampling_defaults
from mlxcel.context import AppContext
from mlxcel.dialects.media_options import media_options
from mlxcel.dialects.openai.schemas import ChatCompletionRequest
from mlxcel.dialects.openai.translate import prompt_request
from mlxcel.dialects.prepare import check_fits, prepare_for
from mlxcel.dialects.wire import decode_body
from mlxcel.errors import (
    CapabilityNotSupported,
    ContextLengthExceeded,
    InvalidRequest,
    MlxcelError,
    TokenOutOfVocabulary,
)
from mlxcel.model.tokenizer import TooManyTokens

from . import media, retrieval
from .completion import body_prompts, n_predict_of, native_prompt, refuse_unsupported
from .infill import answer_reserve, fim_markers, infill_prompt
from .pieces import with_pieces
from .run import respond
from .schemas import CompletionRequest, DetokenizeRequest, InfillRequest, TokenizeRequest
from .slots import slots_payload

TOKENIZE_MAX_TOKENS = 1 << 20
OBSERVABILITY = ("sequences_started", "sequences_completed", "total_prefill_tokens",
                 "total_decode_tokens", "decode_steps_processed", "prefill_chunks_processed",
                 "draft_rounds", "draft_tokens", "draft_accepted")


def _engine_error(message: str) -> tuple[int, dict[str, Any]]:
    return 503, {"status": "error", "error": message}


def health_payload(ctx: AppContext) -> tuple[int, dict[str, Any]]:
    """llama-server's shapes; an engine that failed (or whose checkpoint cannot be read)
    is a 503 ``error`` with its message, so that a supervisor can restart the server.
    ``tool_call_parser`` is the spec's ``"mlxcel"`` when the loaded model has a tool format
    (selected once at startup), else null: it says whether tool calls are parsed, and the
    format's name is in the ``tool_format_selected`` log line and ``mlxcel-server plugins``.
    ``capabilities``: the tasks served (``completion``, ``embedding``, ``rerank``)."""
    if not ctx.has_chat:
        return side_health(ctx)
    engine = ctx.engine
    if engine.state == "loading":
        return 503, {"status": "loading model", "tool_call_parser": None}
    world = distributed_info(engine)
    if engine.state == "failed":
        status, payload = _engine_error(str(getattr(engine.worker, "error", None)
                                            or "engine failed"))
        return status, {**payload, **world}
    try:
        ckpt = ctx.checkpoint
    except MlxcelError as exc:
        return _engine_error(exc.message)
    parallel, active, queued = engine.parallel, engine.active_count, engine.queue_depth
    full = active >= parallel
    stats = engine.stats
    return (503 if full else 200), {
        "status": "no slot available" if full else "ok",
        "model": ctx.model_name,
        "batch": {"active_sequences": active, "queue_depth": queued,
                  "max_batch_size": parallel},
        "observability": {**{k: getattr(stats, k, 0) for k in OBSERVABILITY},
                          "current_batch_size": active, "cache_pool_active": active},
        "context_size": engine.context_size,
        "tool_call_parser": "mlxcel" if ckpt.tool_format is not None else None,
        "capabilities": ctx.capabilities(),
        **world,
    }


def side_health(ctx: AppContext) -> tuple[int, dict[str, Any]]:
    """A process of side models only (``--embeddings``, ``-m`` an embedder): loading and
    failed as for a chat model, else ``ok`` with the models and what they serve."""
    states = {side.state for side in ctx.sides.values()}
    if "failed" in states:
        failed = next(s for s in ctx.sides.values() if s.state == "failed")
        return _engine_error(f"the {failed.task} model failed to load: {failed.error}")
    if "loading" in states:
        return 503, {"status": "loading model", "tool_call_parser": None}
    return 200, {"status": "ok", "model": ctx.model_name, "tool_call_parser": None,
                 "capabilities": ctx.capabilities(),
                 "models": [{"id": side.name, "task": task} for task, side in ctx.sides.items()]}


def distributed_info(engine: Any) -> dict[str, Any]:
    """``{"distributed": ...}`` (world size, mode, backend, each rank's device, status)
    when the model is served over several ranks, else nothing."""
    dist = getattr(engine.worker, "dist", None)
    info = dist.info() if dist is not None else None
    return {"distributed": info} if info is not None else {}


def check_detokenize_ids(tokenizer: Any, ids: list[int]) -> None:
    """Every id must be in ``[0, vocab_size)``, checked before anything is decoded; the
    first one that is not, in request order, is a 500 ``server_error`` naming it, as the
    spec and llama-server answer (ids are read as 64-bit, so a wide one reaches this)."""
    bad = tokenizer.first_invalid_id(ids)
    if bad is not None:
        raise TokenOutOfVocabulary(f"token id {bad} is out of vocabulary range (vocab_size "
                                   f"{tokenizer.vocab_size})")


def generation_routes(ctx: AppContext) -> list[Any]:
    """``/completion`` (and ``/completions``), ``/infill`` and ``/apply-template``."""
    engine = ctx.engine

    @post(["/completion", "/completions"], status_code=200)
    async def completion(request: Request) -> Any:
        ctx.require_chat()
        body = await decode_body(request, CompletionRequest)
        refuse_unsupported(body)
        prompts = body_prompts(body, max(1, engine.parallel))
        options = media_options(body)
        raws = media.gather(ctx, prompts)  # 501 / 400 before anything is decoded
        done = await prepare_for(request, lambda: [
            native_prompt(ctx, p, raw, options) for p, raw in zip(prompts, raws, strict=True)],
            heavy=any(raw is not None for raw in raws))
        return await respond(ctx, request, body, [ids for ids, _ in done],
                             media=[found for _, found in done])

    @post("/infill", status_code=200)
    async def infill(request: Request) -> Any:
        ctx.require_chat()
        fim = fim_markers(ctx.checkpoint.tokenizer)  # 501 before the body is read
        body = await decode_body(request, InfillRequest)
        refuse_unsupported(body)
        reserve = answer_reserve(engine.context_size, n_predict_of(body, ctx.settings))
        ids, cut = await prepare_for(request,
                                     lambda: infill_prompt(engine, body, fim, reserve))
        return await respond(ctx, request, body, [ids], truncated=cut)

    @post("/apply-template", status_code=200)
    async def apply_template(request: Request) -> dict[str, Any]:
        """The chat prompt as ``/v1/chat/completions`` would render it (the same wire
        format, read by the OpenAI dialect's schema), without generating; each image is
        a ``<__media__>`` marker, as llama-server answers (``media.with_markers``)."""
        ctx.require_chat()
        body = await decode_body(request, ChatCompletionRequest)
        prompt = await prepare_for(request, lambda: prompt_request(body))
        images = media.template_media(ctx, prompt)  # 501 on a text-only model
        text = await prepare_for(request, lambda: render_chat(
            prompt, ctx.checkpoint.template, ctx.settings.chat_template_kwargs,
            media=bool(images)))
        return {"prompt": media.with_markers(ctx, text, images)}

    return [completion, infill, apply_template]


def build(ctx: AppContext) -> list[Any]:
    engine = ctx.engine

    @get(["/health", "/"])
    async def health() -> Response:
        status, payload = health_payload(ctx)
        return Response(payload, status_code=status)

    @get("/live")
    async def live() -> dict[str, str]:
        """Liveness for load balancers: the process answers. ``/health`` keeps llama-server's
        meaning (503 while every slot is busy), which would drop a busy, healthy server."""
        return {"status": "ok"}

    def encode(body: TokenizeRequest) -> list[int]:
        """A text too long for any prompt is refused (the same byte bound as prompts), and
        so is one of more than ``TOKENIZE_MAX_TOKENS`` tokens (or the context size, when
        larger): building and sending a longer list stalls every other request. This is
        a limit of this server, not a prompt over the context: it stays an
        ``invalid_request_error`` (no ``exceed_context_size_error`` counts)."""
        try:
            check_fits(engine, body.content, "content")
        except ContextLengthExceeded as exc:
            raise ContextLengthExceeded(exc.message, param="content") from None
        limit = max(engine.context_size, TOKENIZE_MAX_TOKENS)
        try:
            return ctx.checkpoint.tokenizer.encode(body.content, body.add_special,
                                                      max_tokens=limit)
        except TooManyTokens as exc:
            raise InvalidRequest(f"'content' has {exc.count} tokens; /tokenize returns at "
                                 f"most {limit}", param="content") from None

    @post("/tokenize", status_code=200)
    async def tokenize(request: Request) -> dict[str, Any]:
        """Token ids; with ``with_pieces``, ``{"id", "piece"}`` objects (``pieces``)."""
        ctx.require_chat()
        body = await decode_body(request, TokenizeRequest)
        if not body.with_pieces:
            return {"tokens": await prepare_for(request, lambda: encode(body))}
        tok = ctx.checkpoint.tokenizer
        return {"tokens": await prepare_for(request, lambda: with_pieces(tok, encode(body)))}

    @post("/detokenize", status_code=200)
    async def detokenize(request: Request) -> dict[str, Any]:
        ctx.require_chat()
        body = await decode_body(request, DetokenizeRequest)
        tok = ctx.checkpoint.tokenizer
        check_detokenize_ids(tok, body.tokens)
        content = await prepare_for(request, lambda: tok.decode(body.tokens, skip_special=False))
        return {"content": content}

    @get("/props")
    async def props() -> dict[str, Any]:
        if not ctx.has_chat:
            return {"model_alias": ctx.model_name, "total_slots": 0,
                    "capabilities": ctx.capabilities(),
                    **{f"{task}_model": side.name for task, side in ctx.sides.items()}}
        ckpt = ctx.checkpoint
        d = server_sampling_defaults(ckpt, ctx.settings)
        return {
            "default_generation_settings": {
                "n_predict": ctx.settings.n_predict, "temperature": d["temperature"],
                "top_k": d["top_k"], "top_p": d["top_p"], "min_p": d["min_p"],
                "repeat_penalty": d["repetition_penalty"],
                "repeat_last_n": d["repetition_context_size"],
                "seed": SEED_UNSET if d["seed"] is None else d["seed"],
                "frequency_penalty": d["frequency_penalty"],
                "presence_penalty": d["presence_penalty"],
                "dry_multiplier": d["dry_multiplier"], "dry_base": d["dry_base"],
                "dry_allowed_length": d["dry_allowed_length"],
                "dry_penalty_last_n": d["dry_penalty_last_n"],
                "xtc_probability": d["xtc_probability"], "xtc_threshold": d["xtc_threshold"],
                "ignore_eos": False, "logit_bias": [],  # a request's own: chat.logit_bias
            },
            "total_slots": engine.parallel,
            "model_alias": ctx.model_name,
            "model_path": Path(str(ckpt.path)).name,  # never the server's directory layout
            "chat_template": ckpt.template.source,
            "chat_template_caps": ckpt.template.caps.wire(),
            "n_ctx": engine.context_size,
            "capabilities": ctx.capabilities(),
            **media.props(ckpt.model),
            **distributed_info(engine),
        }

    # in a worker thread: both wait for a prompt-cache store the engine has announced
    @get("/v1/cache/stats", sync_to_thread=True)
    def cache_stats() -> dict[str, Any]:
        return engine.prompt_cache.stats()

    @post("/v1/cache/reset", status_code=200, sync_to_thread=True)
    def cache_reset() -> dict[str, Any]:
        return engine.prompt_cache.reset()

    handlers: list[Any] = [health, live, tokenize, detokenize, props, cache_stats, cache_reset,
                           *generation_routes(ctx), *retrieval.build(ctx)]
    if ctx.settings.slots:
        @get("/slots")
        async def slots() -> list[dict[str, Any]]:
            return slots_payload(ctx)

        handlers.append(slots)
    else:
        handlers.append(switched_off("/slots", "--slots"))
    return handlers  # /metrics: mounted by the app with --metrics, absent (404) without


def switched_off(path: str, flag: str) -> Any:
    """A route the operator left off answers 501 naming the flag that mounts it, as
    llama-server does, rather than a 404 that reads as a wrong URL."""
    @get(path, name=f"off:{path}")
    async def handler() -> None:
        raise CapabilityNotSupported(f"the {path} endpoint is off on this server; start it "
                                     f"with {flag}")
    return handler

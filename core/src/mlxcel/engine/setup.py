"""The engine thread's first act: load the model, choose the caches its rows decode on and
the device choices, and apply them to the model (attention path, fused projections, bound
submodules, BLAS threads, warm-up).

``EngineSetup`` is a mixin of ``EngineWorker`` and sets its state (``checkpoint``,
``policy``, ``path``, ``rope``, ``align``, ``batch``, ...); the worker module holds the loop.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import mlx.core as mx
import structlog

from mlxcel.drafters.api import DraftOptions, DraftTarget
from mlxcel.engine import distributed, mixed_batch
from mlxcel.engine.accel import attention, cpu_blas, fused_proj, lean_decode, module_attrs
from mlxcel.engine.accel.warmup import (
    media_lifecycle,
    media_prompt,
    mixed_plan,
    run_items,
    shared_plan,
)
from mlxcel.engine.cache.kinds import reuse_rule
from mlxcel.engine.cache.kvcache import BatchCache, shared_position_rope
from mlxcel.engine.cache.rollback import rollback_reason
from mlxcel.engine.heads import Heads
from mlxcel.engine.media_rows import batches_media
from mlxcel.engine.memory import compute_dtype_bytes, request_budget
from mlxcel.engine.parts import Warming
from mlxcel.engine.policy import resolve_policy
from mlxcel.engine.side import load_sides
from mlxcel.engine.spec_probe import TOLERANCE, check_pairing, verify_deviation
from mlxcel.engine.speculative import Speculation
from mlxcel.engine.trace import Trace
from mlxcel.families.media import media_kinds
from mlxcel.lazy import resolve

log = structlog.get_logger("mlxcel.engine")


def _rollback_off(path: str, model: Any, checkpoint: Any) -> str | None:
    """Why verify steps cannot roll this model's caches back per row, or None."""
    if path == "shared":
        return None
    if path == "single":
        return "the model's caches cannot be batched"
    return rollback_reason(model, checkpoint.family, mixed_batch.pads_state(model))


class EngineSetup:
    """The worker's setup methods (see the module docstring)."""

    def setup(self) -> bool:
        """Load the model and get ready to schedule (the thread's first act); False if the
        model failed to load."""
        cfg = self.config
        try:
            self.checkpoint = self._load()
            self.dist = distributed.attach(self)
            self.eos_ids = set(self.checkpoint.tokenizer.eos_ids)
            model, family = self.checkpoint.model, self.checkpoint.family
            self.policy = self.policy or resolve_policy(cfg)
            self._choose_path(model, family)
            self.dist.agree(self)  # every rank takes rank 0's plan-shaping policy
            self._open_disk(model, family)
            self._prepare(model, family)
            self.memory_budget = request_budget(cfg.request_memory_budget)
            self.dtype_bytes = compute_dtype_bytes(self.checkpoint.model.model)
            self.trace = Trace.to(cfg.engine_trace)
            self.lane.trace = self.trace  # one line per side batch, between iterations
            load_sides(self.sides)
            self.state = "ready"
        except Exception as exc:
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            log.error("model_load_failed", error=self.error)
            return False
        finally:
            self.ready.set()
        return True

    def _prepare(self, model: Any, family: Any) -> None:
        """Apply the policy to the model and the batch: positions, the attention path,
        fused projections, bound submodules, BLAS threads, prefill alignment, warm-up."""
        cfg, policy = self.config, self.policy
        since = time.perf_counter()  # each step's seconds go in the log line: startup time
        shared = cfg.shared_positions and family.relative_positions
        self.rope = shared_position_rope(model, shared) if self.path == "shared" else None
        path = attention.install(model, choice=policy.decode_attention) \
            if self.batchable else None
        fused = fused_proj.fuse(model) if policy.fuse_projections else 0
        bound = module_attrs.bind(model) if policy.bind_modules else 0  # weights final
        fused_at = time.perf_counter()
        self.forward, lean = lean_decode.forward_for(
            model, policy.lean_decode and self.path == "shared" and not self.dist.active,
            self._decode_checks(model))
        # a distributed engine's ranks would each run the check's forwards (and a pipeline
        # rank's collectives) alone: full logits there
        self.heads = Heads(None) if self.dist.active else Heads.for_model(model)
        checked_at = time.perf_counter()
        log.info("engine_batch", cache=self.path,
                 positions="shared" if self.rope is not None else "absolute",
                 masked_decode_attention=path or "mlx", fused_projections=fused,
                 bound_attributes=bound, lean_decode=lean,
                 prompt_cache_reuse=self.prompt_cache.reuse.mode,
                 attention_and_fuse_s=round(fused_at - since, 2),
                 decode_check_s=round(checked_at - fused_at, 2))
        if policy.limit_blas_threads:
            threads = cpu_blas.limit_threads(self.checkpoint.config, self.prefill_chunk)
            if threads is not None:
                log.info("engine_blas_threads", threads=threads, reason="small matmuls")
        # prefill columns a multiple of the policy's where rows may be padded
        self.align = policy.prefill_align if self.grouped else 1
        self.spec = self._speculation(model)
        if self.spec is not None and self.spec.tap is not None:
            # the lean decode step runs its own copy of the layers and norms, on [B, D]:
            # a drafter that reads hidden states needs the model's own forward
            self.forward = lean_decode.generic(model)
        self.batch = self._new_batch()
        if policy.warm_up and self.batchable:
            self._warm_up(model)

    def _warm_up(self, model: Any) -> None:
        """Run the warm-up's first part now and leave the rest to ``warming``, which the
        loop runs between steps (``accel.warmup.WarmPlan``); a failure only logs: the
        warm-up is a speed-up, so the engine serves without it."""
        vocab = self.checkpoint.tokenizer.vocab_size
        try:
            if self.path == "shared":
                width = 1 + self.spec.options.draft_max if self.spec is not None else 0
                plan = shared_plan(model, self.rope, self.parallel, self.prefill_chunk,
                                   self.align, self.burst_chunks, vocab, self.forward, width)
            else:
                plan = mixed_plan(model, self.merge, vocab, self.prefill_chunk, self.align)
            if media_kinds(model):
                plan.first.append(("media", functools.partial(self._warm_media, model, vocab)))
            spent = run_items(plan.first)
        except Exception as exc:
            log.warning("engine_warmup_failed", error=f"{type(exc).__name__}: {exc}")
            return
        self.warming = Warming(plan.later)
        log.info("engine_warmup", cache=self.path, first_items=len(plan.first),
                 later_items=len(plan.later), seconds=round(sum(spent.values()), 2),
                 **{f"{phase}_s": round(s, 2) for phase, s in spent.items()})

    def _warm_media(self, model: Any, vocab: int) -> None:
        """``media_lifecycle`` on a synthetic image; a failure only logs, and the rest of
        the warm-up goes on (an image request then compiles the tower itself)."""
        try:
            prompt = media_prompt(model, self.checkpoint.tokenizer)
            media_lifecycle(model, self.rope, vocab, prompt, self.forward,
                            self.merge if self.path == "mixed" else None, self.align)
        except Exception as exc:
            log.warning("engine_media_warmup_failed", error=f"{type(exc).__name__}: {exc}")

    def _speculation(self, model: Any) -> Speculation | None:
        """The drafter's session (``EngineConfig.drafter``), where verify steps can roll
        the caches back per row, in one process: the shared path's ``BatchCache``, and the
        mixed path where every cache the model makes can (``cache.rollback``)."""
        cfg = self.config
        if cfg.drafter is None:
            return None
        reason = "--distributed" if self.dist.active else _rollback_off(self.path, model,
                                                                         self.checkpoint)
        if reason is not None:
            log.info("speculation_off", drafter=cfg.drafter_kind, reason=reason)
            return None
        ckpt = self.checkpoint
        if not self._verify_exact(model) and cfg.drafter_kind == "prompt-lookup" \
                and cfg.prompt_lookup == "auto":
            log.info("speculation_off", drafter=cfg.drafter_kind,
                     reason="a verify forward rounds differently from a one-token step on "
                            "this device and dtype, so greedy output could change; "
                            "--prompt-lookup on serves it anyway")
            return None
        options = DraftOptions(draft_max=max(1, cfg.draft_max), draft_min=max(0, cfg.draft_min),
                               model=cfg.model_draft, block_size=max(0, cfg.draft_block_size))
        target = DraftTarget(model, ckpt.tokenizer, str(ckpt.path), dict(ckpt.config))
        session = resolve(cfg.drafter)(target, options)
        if cfg.drafter_kind != "prompt-lookup":  # lookup copies the context: exact as built
            check_pairing(model, ckpt.tokenizer, session, options, cfg.drafter_kind,
                          cfg.draft_force)
        log.info("speculation_on", drafter=cfg.drafter_kind, draft_max=options.draft_max,
                 governed=cfg.prompt_lookup != "on")
        return Speculation(session, cfg.drafter_kind, options,
                           governed=cfg.prompt_lookup != "on", model=model)

    def _verify_exact(self, model: Any) -> bool:
        """Whether a verify forward's logits equal one-token steps' here, within
        ``spec_probe.TOLERANCE``; logged either way. Prompt lookup, on by default, stays
        off where they do not (exactness first); a drafter the user named still serves,
        with the warning. A probe that fails counts as exact: it decides a default."""
        try:
            deviation = verify_deviation(model, self.checkpoint.tokenizer)
        except Exception as exc:
            log.warning("speculation_numerics", error=f"{type(exc).__name__}: {exc}"[:300])
            return True
        exact = deviation <= TOLERANCE
        (log.info if exact else log.warning)(
            "speculation_numerics", exact=exact, deviation=float(f"{deviation:.3g}"),
            dtype=self.checkpoint.dtype, device=str(mx.default_device()))
        return exact

    def _decode_checks(self, model: Any) -> list[Any]:
        """Prefilled caches for ``lean_decode.forward_for``: the shared path's
        ``BatchCache``, two rows, the second padded."""

        def shared() -> tuple[list[Any], mx.array]:
            cache = [BatchCache([0, 2], self.rope) for _ in model.make_cache()]
            model(mx.array([[3, 4, 5, 6, 7], [0, 0, 8, 9, 10]], dtype=mx.uint32), cache)
            return cache, mx.array([11, 12], dtype=mx.uint32)

        return [shared]

    def _open_disk(self, model: Any, family: Any) -> None:
        """Open the prompt cache's disk tier (``--cache-disk-dir``) for this model: its
        files are bound to the weights, dtype, family, cache layout and the versions of the
        code that computed them (``cache.files.model_fingerprint``). Not where entries are
        not kept, nor on a distributed engine, whose ranks would each need their shard."""
        disk = self.prompt_cache.disk
        if disk is None:
            return
        if not self.prompt_cache.enabled or self.dist.active:
            disk.enabled, disk.disabled_reason = False, (
                "the prompt cache is off" if not self.prompt_cache.enabled
                else "not with --distributed")
            return
        from importlib.metadata import PackageNotFoundError, version

        from mlxcel.engine.cache.files import model_fingerprint

        def of(dist: str) -> str:
            try:
                return version(dist)
            except PackageNotFoundError:  # run from a source tree
                return "source"

        layout = ",".join(f"{type(c).__name__}:{getattr(c, 'max_size', '')}"
                          for c in model.make_cache())
        parts = {"dtype": self.checkpoint.dtype, "family": family.name, "path": self.path,
                 "caches": layout, "rope": str(self.rope is not None),
                 "mlx": mx.__version__, "mlx-lm": of("mlx-lm"), "mlxcel": of("mlxcel")}
        disk.open(model_fingerprint(self.checkpoint.path, parts))

    def _choose_path(self, model: Any, family: Any) -> None:
        """Which caches the rows decode on (``mixed_batch.cache_path``); one slot and no
        prompt cache where none batches."""
        self.path, self.merge, self.grouped = mixed_batch.cache_path(model, family)
        self.batchable = self.path != "single"
        self.media_grouped = self.grouped and batches_media(model)
        if self.path == "mixed":
            self.prompt_cache.reuse = reuse_rule(model.make_cache())
        elif self.path == "single":
            log.info("engine_single_slot", reason="the model's caches cannot be batched")
            self.parallel = 1
            self.prompt_cache.disable("the model's caches cannot be batched: no prefix reuse")

"""The process's engines by task, from the settings: the chat model's engine (``-m``), side
models (``--embedding-model``, ``--reranker-model``, or ``-m`` with an embedder), and the
thread that runs the side models' job lane (the chat engine's, else a ``LaneWorker``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from mlxcel.engine.cache.disk import DiskTier
from mlxcel.engine.cache.prompt_cache import PromptCache
from mlxcel.engine.client import EngineClient
from mlxcel.engine.config import EngineConfig
from mlxcel.engine.lane_worker import LaneWorker
from mlxcel.engine.lanes import LaneClient, LaneLimits
from mlxcel.engine.side import SideEngine
from mlxcel.families.tasks import TaskOptions
from mlxcel.plugins import Plugins
from mlxcel.settings import MODES, SIDE_FLAGS, Settings


def prompt_cache_from(settings: Settings) -> PromptCache:
    capacity = settings.prompt_cache_capacity_bytes or settings.cache_ram * (1 << 20)
    cache = PromptCache(capacity, settings.prompt_cache_max_entries, settings.prompt_cache_ttl,
                        enabled=not settings.no_cache_prompt,
                        max_checkpoints=settings.ctx_checkpoints)
    if settings.cache_disk_dir:
        cache.disk = DiskTier(settings.cache_disk_dir, settings.cache_disk_bytes)
    return cache


def display_name(model: str) -> str:
    return Path(model.rstrip("/")).name or model


AUDIO_TASKS = ("transcribe", "speak")
AUDIO_BATCH = 4  # transcriptions or utterances one speech call takes


def lane_limits(settings: Settings, task: str) -> LaneLimits:
    """A side task's queue depth, timeout and batch size, from its flags."""
    if task in AUDIO_TASKS:
        return LaneLimits(depth=settings.audio_queue_depth,
                          timeout_s=settings.audio_request_timeout_secs,
                          batch_items=AUDIO_BATCH)
    batch = settings.rerank_batch_size if task == "rerank" else settings.embedding_batch_size
    return LaneLimits(depth=settings.embedding_queue_depth,
                      timeout_s=settings.embedding_request_timeout_secs,
                      batch_items=max(1, batch))


def plan_models(settings: Settings, plugins: Plugins) -> tuple[str | None, dict[str, str]]:
    """(the chat model or None, side task -> model). ``-m`` serves its own task (a chat
    checkpoint ``generate``, an embedder ``embed``); ``--embeddings`` / ``--reranking``
    restrict the process to those tasks, ``-m`` serving the first whose own flag is
    unset."""
    sides = {task: getattr(settings, field) for task, field in SIDE_FLAGS
             if getattr(settings, field)}
    modes = [task for task, toggle in MODES.items() if getattr(settings, toggle)]
    main = settings.model
    if main is None:
        return None, sides
    if modes:
        free = [task for task in modes if task not in sides]
        if free:
            sides[free[0]] = main
        return None, {task: model for task, model in sides.items() if task in modes}
    from mlxcel.model.loader import served_task

    task = served_task(main, plugins.families)
    if task == "generate":
        return main, sides
    sides.setdefault(task, main)
    return None, sides


class Engines:
    """What the app serves: ``chat`` (None without a chat model) and ``sides`` by task;
    ``threads`` are the engine threads to start, watch and stop."""

    def __init__(self, chat: EngineClient | None, sides: dict[str, SideEngine],
                 lane_worker: LaneWorker | None) -> None:
        self.chat = chat
        self.sides = sides
        self.lane_worker = lane_worker

    @property
    def threads(self) -> list[Any]:
        chat = [self.chat.worker] if self.chat is not None else []
        return chat + ([self.lane_worker] if self.lane_worker is not None else [])

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def shutdown(self) -> None:
        for thread in self.threads:
            thread.shutdown()


def side_engine(settings: Settings, plugins: Plugins, task: str, model: str,
                lanes: LaneClient) -> SideEngine:
    options = TaskOptions(pooling=settings.pooling, max_length=settings.embedding_max_length)

    def load() -> Any:
        from mlxcel.model.loader import load_task_model

        return load_task_model(model, plugins.families, task, dtype=settings.dtype,
                               options=options)[2]

    return SideEngine(task, display_name(model), load, lanes, lane_limits(settings, task))


def engine_config(settings: Settings, plugins: Plugins) -> EngineConfig:
    """The chat engine's config: the settings' share, and the drafter from the plugins.
    ``-md`` (``--model-draft``) picks the drafter its checkpoint is for (a draft model,
    or an MTP assistant: ``mlxcel.drafters.select``), over prompt lookup (the batch
    governor stays on unless ``--prompt-lookup on``); otherwise the one that
    ``--prompt-lookup`` names (none when it is off or not registered)."""
    from mlxcel.drafters.select import choose

    config = EngineConfig.from_settings(settings)
    if (drafter := choose(settings, plugins.drafters)) is not None:
        return msgspec.structs.replace(config, drafter=drafter.session,
                                       drafter_kind=drafter.kind)
    if settings.prompt_lookup == "off" or "prompt-lookup" not in plugins.drafters:
        return msgspec.structs.replace(config, prompt_lookup="off")
    drafter = plugins.drafters.get("prompt-lookup")
    return msgspec.structs.replace(config, drafter=drafter.session, drafter_kind=drafter.kind)


def build_engines(settings: Settings, plugins: Plugins,
                  chat: EngineClient | None = None) -> Engines:
    """The engines ``settings`` ask for; ``chat`` given (tests) replaces the chat model's."""
    from mlxcel.model.loader import checkpoint_loader

    main, side_models = plan_models(settings, plugins) if chat is None else (None, {})
    if chat is None and main is not None:
        chat = EngineClient(
            checkpoint_loader(settings, plugins), parallel=settings.parallel,
            ctx_size=settings.ctx_size, prefill_chunk=settings.prefill_chunk(),
            max_queue_depth=settings.max_queue_depth, prompt_cache=prompt_cache_from(settings),
            config=engine_config(settings, plugins))
    lane_worker = None if chat is not None or not side_models \
        else LaneWorker([], trace=settings.engine_trace)
    lanes = chat.lanes if chat is not None else \
        lane_worker.client() if lane_worker is not None else None
    sides = {task: side_engine(settings, plugins, task, model, lanes)
             for task, model in side_models.items()}
    host = chat.worker if chat is not None else lane_worker
    if host is not None:
        host.sides = list(sides.values())
    return Engines(chat, sides, lane_worker)

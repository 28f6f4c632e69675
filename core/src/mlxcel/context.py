"""What route handlers share: settings, plugins, the engines by task (the chat model's
client and the side models), the model's name, the request metrics."""

from __future__ import annotations

import time
from typing import Any

import msgspec

from mlxcel.engine.client import EngineClient
from mlxcel.engine.side import SideEngine
from mlxcel.errors import NoModelForRoute
from mlxcel.metrics import Metrics
from mlxcel.plugins import Plugins
from mlxcel.settings import Settings


class AppContext(msgspec.Struct, kw_only=True):
    """``engine``: the chat model's client (None when the server serves no ``generate``
    task: an embedding-only process); ``sides``: the side models by task (``embed``,
    ``rerank``, ...)."""

    settings: Settings
    plugins: Plugins
    engine: EngineClient | None
    model_name: str
    metrics: Metrics
    sides: dict[str, SideEngine] = {}
    created: int = msgspec.field(default_factory=lambda: int(time.time()))
    extra: dict[str, Any] = {}

    @property
    def chat(self) -> EngineClient:
        """The chat model's engine; a 501 naming the routes served where there is none."""
        if self.engine is None:
            raise NoModelForRoute(
                "this server has no chat model loaded (it serves "
                f"{', '.join(self.served_tasks())}); start it with -m <chat model>")
        return self.engine

    @property
    def checkpoint(self) -> Any:
        """The chat model's loaded checkpoint: tokenizer, template, reasoning, tool format
        (``mlxcel.model.loader.LoadedCheckpoint``); raises while it loads."""
        return self.chat.checkpoint

    def side(self, task: str) -> SideEngine | None:
        return self.sides.get(task)

    def served_tasks(self) -> tuple[str, ...]:
        """The tasks this process serves, chat's ``generate`` first."""
        return (("generate",) if self.engine is not None else ()) + tuple(self.sides)

    def constraint_compiler(self) -> Any:
        """The loaded model's constraint compiler, made on first use (its vocabulary is
        built on a worker thread then): a server that never sees a schema never pays for
        it, nor imports outlines-core."""
        compiler = self.extra.get("constraint_compiler")
        if compiler is None:
            from mlxcel.engine.constraints import CacheBudget, ConstraintCompiler

            tok, settings = self.checkpoint.tokenizer, self.settings
            budget = CacheBudget(memory_bytes=settings.grammar_cache_ram,
                                 disk_bytes=settings.grammar_cache_disk,
                                 compile_bytes=settings.grammar_compile_memory)
            compiler = ConstraintCompiler.for_tokenizer(
                tok, eos_ids=set(tok.eos_ids), timeout=settings.grammar_compile_timeout,
                cache_dir=settings.grammar_cache_dir, budget=budget)
            self.extra["constraint_compiler"] = compiler
        return compiler

"""What route handlers share: settings, plugins, the engine client, the model's name,
the request metrics."""

from __future__ import annotations

import time
from typing import Any

import msgspec

from mlxcel.engine.client import EngineClient
from mlxcel.metrics import Metrics
from mlxcel.plugins import Plugins
from mlxcel.settings import Settings


class AppContext(msgspec.Struct, kw_only=True):
    settings: Settings
    plugins: Plugins
    engine: EngineClient
    model_name: str
    metrics: Metrics
    created: int = msgspec.field(default_factory=lambda: int(time.time()))
    extra: dict[str, Any] = {}

    def constraint_compiler(self) -> Any:
        """The loaded model's constraint compiler, made on first use (its vocabulary is
        built on a worker thread then): a server that never sees a schema never pays for
        it, nor imports outlines-core."""
        compiler = self.extra.get("constraint_compiler")
        if compiler is None:
            from mlxcel.engine.constraints import CacheBudget, ConstraintCompiler

            tok, settings = self.engine.checkpoint.tokenizer, self.settings
            budget = CacheBudget(memory_bytes=settings.grammar_cache_ram,
                                 disk_bytes=settings.grammar_cache_disk,
                                 compile_bytes=settings.grammar_compile_memory)
            compiler = ConstraintCompiler.for_tokenizer(
                tok, eos_ids=set(tok.eos_ids), timeout=settings.grammar_compile_timeout,
                cache_dir=settings.grammar_cache_dir, budget=budget)
            self.extra["constraint_compiler"] = compiler
        return compiler

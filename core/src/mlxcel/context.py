"""What route handlers share: settings, plugins, the engines by task (the chat model's
client and the side models), the model's name, the request metrics."""

from __future__ import annotations

import time
from typing import Any

import msgspec

from mlxcel.engine.client import EngineClient
from mlxcel.engine.side import SideEngine
from mlxcel.errors import NoModelForRoute
from mlxcel.families.tasks import TASKS
from mlxcel.media.decode import recent_images
from mlxcel.metrics import Metrics
from mlxcel.plugins import Plugins
from mlxcel.settings import Settings

# each task's routes, named in the 501 a route of another task answers
TASK_ROUTES = {"generate": ("/v1/chat/completions", "/v1/completions", "/v1/responses",
                            "/v1/messages", "/completion"),
               "embed": ("/v1/embeddings", "/embedding", "/embeddings"),
               "rerank": ("/v1/rerank", "/v1/reranking", "/rerank", "/reranking"),
               "transcribe": ("/v1/audio/transcriptions", "/v1/audio/translations",
                              "/audio/transcriptions", "/audio/translations"),
               "speak": ("/v1/audio/speech", "/audio/speech")}
CAPABILITIES = {"generate": "completion", "embed": "embedding", "rerank": "rerank",
                "transcribe": "transcription", "speak": "speech"}


class NoChatModel:
    """The chat engine of a process that serves none (``-m`` an embedder,
    ``--embeddings``): whatever a generation route asks of it is a 501 naming the routes
    this server does serve, in the route's own dialect."""

    state = "ready"

    def __init__(self, served: tuple[str, ...]) -> None:
        self._served = served

    def __bool__(self) -> bool:
        return False

    def refuse(self) -> None:
        raise NoModelForRoute("this server has no chat model loaded; it serves "
                              f"{', '.join(self._served) or 'no model routes'}")

    def __getattr__(self, name: str) -> Any:
        self.refuse()


class AppContext(msgspec.Struct, kw_only=True):
    """``engine``: the chat model's client, or a ``NoChatModel`` when the server serves
    no ``generate`` task; ``sides``: the side models by task (``embed``, ``rerank``)."""

    settings: Settings
    plugins: Plugins
    engine: Any
    model_name: str
    metrics: Metrics
    sides: dict[str, SideEngine] = {}
    created: int = msgspec.field(default_factory=lambda: int(time.time()))
    extra: dict[str, Any] = {}
    # images decoded lately, for the conversation's next turn (``mlxcel.media.decode``)
    decoded: Any = msgspec.field(default_factory=recent_images)

    def __post_init__(self) -> None:
        if self.engine is None:
            self.engine = NoChatModel(self.served_routes())

    @property
    def has_chat(self) -> bool:
        return self.engine is not None and not isinstance(self.engine, NoChatModel)

    def require_chat(self) -> None:
        """A generation route's first act: a 501 naming the routes served when this
        process has no chat model, before the body is read (a body that suits no route
        here should not get a 400 about its fields)."""
        if not self.has_chat:
            self.engine.refuse()

    @property
    def chat(self) -> EngineClient:
        """The chat model's engine; a 501 naming the routes served where there is none."""
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
        return (("generate",) if self.has_chat else ()) + \
            tuple(sorted(self.sides, key=TASKS.index))

    def served_routes(self) -> tuple[str, ...]:
        return tuple(path for task in self.served_tasks() for path in TASK_ROUTES[task])

    def capabilities(self) -> list[str]:
        """The served tasks by their wire names (``completion``, ``embedding``, ...)."""
        return [CAPABILITIES.get(task, task) for task in self.served_tasks()]

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

"""Engine helpers for tests: a worker or an engine on a tiny checkpoint, driven by hand or
through ``submit``, greedy outputs run one request at a time, and the whole app in process
with its model loaded (``app_client``).

A worker (``worker_for``) is set up on the calling thread and driven with
``run_until_done``, one ``step()`` at a time, so which requests share a step is
deterministic; an engine (``engine_for``) runs its own thread behind ``EngineClient``, as
the server does. ``policy`` changes are ``EnginePolicy`` fields (a CUDA choice forced on
the CPU). Importing this module imports the engine (and so MLX).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from mlxcel.engine.cache.prompt_cache import PromptCache
from mlxcel.engine.client import EngineClient
from mlxcel.engine.config import EngineConfig
from mlxcel.engine.policy import EnginePolicy, resolve_policy
from mlxcel.engine.worker import EngineWorker
from mlxcel.model.loader import load_checkpoint
from mlxcel.plugins import load_plugins
from mlxcel.types import GenerationEvent, GenerationRequest, SamplingParams

GREEDY = SamplingParams(temperature=0.0)
_ids = itertools.count()


class ListSink:
    """A sink that keeps every event (``cancelled`` may be set to leave)."""

    cancelled = False

    def __init__(self) -> None:
        self.events: list[GenerationEvent] = []

    def emit(self, event: GenerationEvent) -> None:
        self.events.append(event)

    @property
    def tokens(self) -> list[int]:
        return [t for e in self.events for t in e.token_ids]

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1].finish_reason is not None

    @property
    def last(self) -> GenerationEvent:
        return self.events[-1]


def cpu_policy(**changes: Any) -> EnginePolicy:
    """This machine's EnginePolicy with ``changes``."""
    import msgspec

    return msgspec.structs.replace(resolve_policy(EngineConfig()), **changes)


def _load(checkpoint: Any):
    """A loader for a checkpoint path; a callable is already one (a test that changes the
    loaded model wraps ``load_checkpoint`` itself)."""
    if callable(checkpoint):
        return checkpoint
    families = load_plugins().families
    return lambda: load_checkpoint(str(checkpoint), families)


def with_family(checkpoint: Any, **changes: Any) -> Callable[[], Any]:
    """A loader of ``checkpoint`` whose family has ``changes`` (``Family`` fields): for a
    test of what core does with a family's choices (``batch_cache``, ...)."""
    import msgspec

    families = load_plugins().families

    def load() -> Any:
        ckpt = load_checkpoint(str(checkpoint), families)
        ckpt.family = msgspec.structs.replace(ckpt.family, **changes)
        return ckpt
    return load


def _cache(cache: bool | int | PromptCache) -> PromptCache | None:
    """``cache``: a prompt cache, True (1 GiB), a capacity in bytes, or False (none)."""
    if isinstance(cache, PromptCache):
        return cache
    if cache is True:
        return PromptCache(1 << 30)
    return PromptCache(cache) if cache else None


def worker_for(checkpoint: Any, cache: bool | int = False, chunk: int = 512,
               parallel: int = 8, config: EngineConfig | None = None,
               **policy: Any) -> EngineWorker:
    """A worker set up (not started) on ``checkpoint`` (a path, or a loader callable);
    ``cache``: a prompt cache (True: 1 GiB, or its size in bytes); ``config``: engine
    settings; ``policy``: EnginePolicy fields to change."""
    worker = EngineWorker(_load(checkpoint), parallel=parallel, prefill_chunk=chunk,
                          prompt_cache=_cache(cache), config=config,
                          policy=cpu_policy(**policy) if policy else None)
    assert worker.setup(), worker.error
    return worker


def request(prompt: Sequence[int], max_tokens: int = 6, sampling: SamplingParams = GREEDY,
            **kw: Any) -> GenerationRequest:
    """A request that ignores EOS (so it yields exactly ``max_tokens`` tokens)."""
    return GenerationRequest(request_id=f"t{next(_ids)}", prompt_tokens=tuple(prompt),
                             max_tokens=max_tokens, ignore_eos=True, sampling=sampling, **kw)


def media_request(prompt: Any, max_tokens: int = 6, **kw: Any) -> GenerationRequest:
    """``request`` for a family's expanded media prompt (``expand_media``'s result): its
    tokens, the prompt as the row's media and its digest positions (the prompt cache's
    key past each image)."""
    return request(prompt.token_ids, max_tokens, media=prompt,
                   media_digests=prompt.digest_positions(), **kw)


def submit(worker: EngineWorker, prompt: Sequence[int], max_tokens: int = 6,
           sampling: SamplingParams = GREEDY) -> ListSink:
    sink = ListSink()
    worker.enqueue(request(prompt, max_tokens, sampling), sink)
    return sink


def run_until_done(worker: EngineWorker, sinks: Sequence[ListSink], settle: bool = False,
                   limit: int = 2000) -> None:
    """Iterate the worker until every sink has its finish event; ``settle``: one more
    iteration, so that the finished rows have left the batch."""
    for _ in range(limit):
        if all(s.done for s in sinks):
            if settle:
                worker.step()
            return
        worker.step()
    raise AssertionError("requests did not finish")


def run_joining(checkpoint: Any, reqs: Sequence[GenerationRequest],
                config: EngineConfig | None = None, parallel: int = 8, chunk: int = 512,
                **policy: Any) -> tuple[list[list[int]], list[Any], EngineWorker]:
    """``reqs`` on a worker, each enqueued one engine step after the one before, so rows
    join a running batch (and, asking for different lengths, leave it at different
    times); run until all finished. Returns each row's tokens, each finish's usage, and
    the worker. ``policy``: EnginePolicy fields to change."""
    worker = worker_for(checkpoint, parallel=parallel, config=config, chunk=chunk, **policy)
    sinks = []
    for req in reqs:
        sink = ListSink()
        worker.enqueue(req, sink)
        sinks.append(sink)
        worker.step()
    run_until_done(worker, sinks)
    return [s.tokens for s in sinks], [s.last.usage for s in sinks], worker


def solo_outputs(checkpoint: Any, prompts: Sequence[Sequence[int]],
                 max_tokens: int | Sequence[int] = 6, chunk: int = 512) -> list[list[int]]:
    """Each prompt's greedy tokens, run alone (``max_tokens``: one for all, or per prompt)."""
    worker = worker_for(checkpoint, chunk=chunk, parallel=12)
    lengths = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else max_tokens
    out = []
    for prompt, n in zip(prompts, lengths, strict=True):
        sink = submit(worker, prompt, max_tokens=n)
        run_until_done(worker, [sink])
        out.append(sink.tokens)
    return out


def engine_for(checkpoint: Any, parallel: int, cache: bool | int | PromptCache = False,
               chunk: int = 512,
               policy: EnginePolicy | None = None, **kw: Any) -> EngineClient:
    """A started, ready engine on ``checkpoint`` (shut it down when done)."""
    engine = EngineClient(_load(checkpoint), parallel=parallel, prefill_chunk=chunk,
                          prompt_cache=_cache(cache) or PromptCache(0, enabled=False),
                          policy=policy, **kw)
    engine.start()
    assert engine.worker.ready.wait(60) and engine.worker.state == "ready", engine.worker.error
    return engine


async def collect(engine: EngineClient, req: GenerationRequest) -> tuple[list[int], Any]:
    """A request's tokens and its last event."""
    ids, last = [], None
    async for event in engine.submit(req):
        ids.extend(event.token_ids)
        last = event
    return ids, last


def run(engine: EngineClient, reqs: Sequence[GenerationRequest],
        then: Sequence[GenerationRequest] = (), stagger: float = 0.0) -> list[tuple]:
    """``reqs`` submitted at once, then ``then`` one every ``stagger`` seconds; each
    request's (tokens, last event)."""
    async def go():
        tasks = [asyncio.create_task(collect(engine, r)) for r in reqs]
        for r in then:
            await asyncio.sleep(stagger)
            tasks.append(asyncio.create_task(collect(engine, r)))
        return await asyncio.gather(*tasks)
    return asyncio.run(go())


def solo_tokens(checkpoint: Any, reqs: Sequence[GenerationRequest]) -> list[list[int]]:
    """Each request's tokens on an engine of one slot, one request at a time."""
    engine = engine_for(checkpoint, parallel=1, chunk=16)
    try:
        return [run(engine, [r])[0][0] for r in reqs]
    finally:
        engine.shutdown()


@contextlib.contextmanager
def app_client(checkpoint: Any, timeout: float = 120.0, **settings: Any) -> Iterator[Any]:
    """Litestar's ``TestClient`` on the real app serving ``checkpoint`` (``Settings``
    fields in ``settings``; the model is named ``tiny`` unless ``alias`` says otherwise),
    yielded once ``/health`` no longer says the model is loading."""
    from litestar.testing import TestClient

    from mlxcel.app import create_app
    from mlxcel.settings import Settings

    app = create_app(Settings(model=str(checkpoint), **{"alias": "tiny", **settings}))
    with TestClient(app, raise_server_exceptions=False) as client:
        wait_ready(client, timeout)
        yield client


def wait_ready(client: Any, timeout: float = 60.0) -> None:
    """Wait until an app's ``/health`` no longer says the model is loading."""
    deadline = time.time() + timeout
    while client.get("/health").json()["status"] == "loading model":
        assert time.time() < deadline, "model did not load"
        time.sleep(0.05)


def warm_up_layers(model: Any, layers: Sequence[Any], rows: int = 2, cols: int = 8
                   ) -> tuple[int, list[int]]:
    """What one warm-up prefill shape (``rows`` x ``cols``) runs on ``model``
    (``mlxcel.engine.accel.warmup.one_layer``): (the layer count it yields, the indices
    of ``layers``, the decoder's, that ran). Each layer is spied on for the call, and its
    class restored after."""
    import mlx.core as mx

    from mlxcel.engine.accel.warmup import one_layer
    from mlxcel.engine.cache.kvcache import BatchCache

    calls: list[int] = []
    classes = [type(layer) for layer in layers]
    for i, layer in enumerate(layers):
        base = classes[i]
        layer.__class__ = type("Spied", (base,), {
            "__call__": lambda self, *a, i=i, base=base, **k: (
                calls.append(i), base.__call__(self, *a, **k))[1]})
    try:
        with one_layer(model) as running:
            model(mx.zeros((rows, cols), mx.uint32),
                  [BatchCache([0] * (rows - 1) + [1]) for _ in range(running)])
    finally:
        for layer, cls in zip(layers, classes, strict=True):
            layer.__class__ = cls
    return running, calls


def padded_attention(model: Any, lengths: Sequence[int] = (5, 3)) -> tuple[int, float]:
    """Rows of ``lengths`` tokens, left-padded in the engine's ``BatchCache``, prefilled and
    then decoded one step through ``model`` twice: with MLX's own attention, and with the
    engine's masked path installed (``mlxcel.engine.accel.attention``, ``grouped``, as on
    CUDA). Returns (the calls that path took, the largest logit difference between the
    two runs); a model whose attention the engine cannot reach takes no call."""
    import mlx.core as mx

    from mlxcel.engine.accel import attention
    from mlxcel.engine.cache.kvcache import BatchCache

    width = max(lengths)
    prompt = mx.array([[0] * (width - n) + [7 + i] * n for i, n in enumerate(lengths)],
                      dtype=mx.uint32)
    step = mx.array([[3]] * len(lengths), dtype=mx.uint32)

    def logits() -> mx.array:
        cache = [BatchCache([width - n for n in lengths]) for _ in model.make_cache()]
        model(prompt, cache)
        return model(step, cache)

    plain = logits()
    calls: list[int] = []
    real = attention.grouped_decode_attention

    def spied(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    attention.grouped_decode_attention = spied
    try:
        routed = attention.install(model, enable=True, choice="grouped") is not None
        got = logits() if routed else plain
    finally:
        attention.uninstall(model)
        attention.grouped_decode_attention = real
    return len(calls), float(mx.abs(got - plain).max())

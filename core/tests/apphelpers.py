"""In-process app helpers: a real app with a real engine behind Litestar's TestClient."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from litestar.testing import TestClient
from mlxcel.app import create_app
from mlxcel.settings import Settings
from mlxcel.testing.engine import wait_ready  # noqa: F401 (the tests import it from here)


def make_client(checkpoint, **settings):
    app = create_app(Settings(model=str(checkpoint), alias="tiny", **settings))
    return TestClient(app, raise_server_exceptions=False)


def client_fixture(**settings):
    """A module-scoped fixture: an app on the tiny checkpoint with ``settings``, ready."""

    @pytest.fixture(scope="module")
    def fixture(tiny_checkpoint):
        with ready_client(tiny_checkpoint, **settings) as client:
            yield client

    return fixture


@contextmanager
def ready_client(checkpoint, **settings):
    """``make_client``, entered, once its engine is ready (a module fixture yields it)."""
    with make_client(checkpoint, **settings) as client:
        wait_ready(client)
        yield client




# prompts the engine-level tests share: two that share a 33-token prefix, and a short one
BASE = [(7 * i) % 200 + 3 for i in range(40)]
PROMPTS = [BASE[:33] + [5, 6, 7], BASE[:36] + [9] * 7, [11, 12, 13, 14, 15]]


def forced_answers(checkpoint, constraint, max_tokens: int, prefix: str = "f"):
    """Two seeded answers of the tiny engine under ``constraint`` (a forced call's
    grammar), compiled for its tokenizer: the tokenizer and ``[(token ids, last event),
    ...]``."""
    from mlxcel.engine.constraints import ConstraintCompiler
    from mlxcel.testing.engine import engine_for, run
    from mlxcel.types import GenerationRequest, SamplingParams

    engine = engine_for(checkpoint, 2)
    try:
        tok = engine.worker.checkpoint.tokenizer
        compiler = ConstraintCompiler.for_tokenizer(tok, eos_ids=set(tok.eos_ids))
        guide = compiler.compile(constraint)
        reqs = [GenerationRequest(request_id=f"{prefix}{seed}", prompt_tokens=(5, 6, 7 + seed),
                                  max_tokens=max_tokens, guide=guide,
                                  sampling=SamplingParams(temperature=1.0, seed=seed))
                for seed in (1, 2)]
        return tok, run(engine, reqs)
    finally:
        engine.shutdown()

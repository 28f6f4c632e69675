"""Shared fixtures: an in-process app (real engine, real tiny model)."""

from __future__ import annotations

import pytest
from apphelpers import make_client, wait_ready


@pytest.fixture(scope="module")
def path(mlxcel_checkpoint_cache):
    """A float32 qwen3 test checkpoint (the engine-level tests drive a worker on it)."""
    from mlxcel.testing.checkpoint import cached_checkpoint

    return cached_checkpoint("qwen3", cache_dir=mlxcel_checkpoint_cache, dtype="float32")


@pytest.fixture(scope="module")
def tokenizer(path):
    """The tokenizer of ``path`` (the constraint tests compile against its vocabulary)."""
    from mlxcel.model.tokenizer import Tokenizer

    return Tokenizer.from_dir(path)


@pytest.fixture(scope="module")
def vocabulary(tokenizer):
    from mlxcel.engine.constraints import TokenVocabulary

    return TokenVocabulary.from_tokenizer(tokenizer)


@pytest.fixture(scope="module")
def client(tiny_checkpoint):
    with make_client(tiny_checkpoint, parallel=2) as c:
        wait_ready(c)
        yield c


@pytest.fixture(scope="module")
def llama_client(tiny_llama_checkpoint):
    with make_client(tiny_llama_checkpoint, parallel=1) as c:
        wait_ready(c)
        yield c


@pytest.fixture(scope="module")
def template(tiny_checkpoint):
    """The tiny checkpoint's chat template, loaded as the server loads it."""
    import json

    from mlxcel.model.chat_template import load_chat_template

    config = json.loads((tiny_checkpoint / "tokenizer_config.json").read_text())
    return load_chat_template(tiny_checkpoint, config, override=None, bos_token=None,
                              eos_token="<|im_end|>")

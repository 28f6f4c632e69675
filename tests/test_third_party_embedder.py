"""A third party's family with an ``embed`` task, installed from a temporary directory,
serves ``/v1/embeddings`` on the real server with no core edit: its ``check`` claims the
checkpoint before the server forks, its ``load`` and runner run on the engine's job lane,
and core normalizes what the runner returns."""

from __future__ import annotations

import json
import os

import httpx
import numpy as np
import pytest
from mlxcel.testing.servers import MlxcelServer
from test_third_party_plugin import _install, _write_dist

pytestmark = pytest.mark.slow

PLUGIN = """
from mlxcel import hookimpl
from mlxcel.families.api import Family


@hookimpl
def mlxcel_register_families(registry):
    registry.add(Family(
        name="acme-hash", model_types=("acme_hash",), check="acme_hash.model:check",
        load="acme_hash.model:load", tasks={"embed": "acme_hash.model:embedder"}))
"""

MODEL = """
import numpy as np
from mlxcel.families.api import Loaded
from mlxcel.families.tasks import Encoded


def check(path, config):
    return True if config.get("dim") else "no 'dim' in config.json"


def load(path, options):
    return Loaded(model=None, tasks=("embed",), config={})


class HashEmbedder:
    dimensions, max_length, pooling, vocab_size = 4, 32, "mean", 1000

    def tokenize(self, text):
        return Encoded([len(w) for w in text.split()])

    def embed(self, inputs, pooling):
        return [np.array([sum(e.ids), len(e.ids), 1.0, 0.0], dtype=np.float32)
                for e in inputs]


def embedder(loaded, options):
    return HashEmbedder()
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("third-party-embed")
    src = _write_dist(root, "acme-hash-plugin", "acme_hash", "family-acme-hash",
                      {"plugin": PLUGIN, "model": MODEL})
    return _install(src, root / "site")


def test_a_third_party_embedder_serves_v1_embeddings(site, tmp_path):
    from safetensors.numpy import save_file

    ckpt = tmp_path / "acme-hash-model"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "acme_hash", "dim": 4}))
    save_file({"w": np.zeros(1, dtype=np.float32)}, str(ckpt / "model.safetensors"))
    paths = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    srv = MlxcelServer(["-m", str(ckpt)], env={"PYTHONPATH": paths})
    try:
        body = httpx.post(srv.base_url + "/v1/embeddings",
                          json={"input": ["ab cde", "x"]}, timeout=30).json()
        health = httpx.get(srv.base_url + "/health").json()
    finally:
        srv.stop()
    first = np.array([5.0, 2.0, 1.0, 0.0])
    assert np.allclose(body["data"][0]["embedding"], first / np.linalg.norm(first))
    assert body["usage"]["prompt_tokens"] == 3
    assert health["capabilities"] == ["embedding"]

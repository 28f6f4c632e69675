"""In-process app helpers: a real app with a real engine behind Litestar's TestClient."""

from __future__ import annotations

from litestar.testing import TestClient
from mlxcel.app import create_app
from mlxcel.settings import Settings
from mlxcel.testing.engine import wait_ready  # noqa: F401 (the tests import it from here)


def make_client(checkpoint, **settings):
    app = create_app(Settings(model=str(checkpoint), alias="tiny", **settings))
    return TestClient(app, raise_server_exceptions=False)




# prompts the engine-level tests share: two that share a 33-token prefix, and a short one
BASE = [(7 * i) % 200 + 3 for i in range(40)]
PROMPTS = [BASE[:33] + [5, 6, 7], BASE[:36] + [9] * 7, [11, 12, 13, 14, 15]]

"""Fixtures the end-to-end tests share: a server process on the tiny checkpoint and an
OpenAI SDK client of it. A module that needs other flags defines its own ``server``, which
pytest prefers to this one."""

from __future__ import annotations

import pytest
from mlxcel.testing.servers import MlxcelServer

E2E_KEY = "k-e2e"


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    srv = MlxcelServer(["--model", str(tiny_checkpoint), "--parallel", "2",
                        "--api-key", E2E_KEY])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(server, request):
    """An httpx client of ``server``, sending the test module's ``KEY`` headers if any."""
    import httpx

    headers = getattr(request.module, "KEY", None)
    with httpx.Client(base_url=server.base_url, headers=headers, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def sdk(server):
    import openai

    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=E2E_KEY, max_retries=0)

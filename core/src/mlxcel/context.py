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

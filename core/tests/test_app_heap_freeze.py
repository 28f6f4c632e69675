"""The served process freezes its heap once the model has loaded, and only then: a full
collection later walks what serving allocated, not the startup heap."""

from __future__ import annotations

import gc
import threading

from mlxcel.engine.client import EngineClient
from mlxcel.model.loader import load_checkpoint
from mlxcel.plugins import load_plugins
from mlxcel.serving import _freeze_heap_once_loaded


def _freezer() -> threading.Thread:
    return next(t for t in threading.enumerate() if t.name == "mlxcel-gc-freeze")


def test_heap_is_frozen_after_the_model_loads(tiny_checkpoint):
    families = load_plugins().families
    engine = EngineClient(lambda: load_checkpoint(str(tiny_checkpoint), families), parallel=1)
    gc.unfreeze()
    try:
        _freeze_heap_once_loaded([engine.worker])
        thread = _freezer()
        assert gc.get_freeze_count() == 0  # nothing frozen while the model is not loaded
        engine.start()
        thread.join(60)
        assert engine.state == "ready" and not thread.is_alive()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        engine.shutdown()


def test_a_failed_load_freezes_nothing(tmp_path):
    def fail() -> None:
        raise FileNotFoundError(tmp_path / "missing")

    engine = EngineClient(fail, parallel=1)
    gc.unfreeze()
    try:
        _freeze_heap_once_loaded([engine.worker])
        thread = _freezer()
        engine.start()
        thread.join(60)
        assert engine.state == "failed" and not thread.is_alive()
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
        engine.shutdown()

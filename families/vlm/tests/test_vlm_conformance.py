"""The family passes mlxcel's family conformance runner on tiny VLM checkpoints: the
server selects it, and text rows batch (batched greedy equals solo greedy) and reuse the
prompt cache. Image rows are the engine's to add (issue #30)."""

from __future__ import annotations

import pytest
from mlxcel.testing.conformance import check_family


@pytest.mark.parametrize("shape", ["qwen2_vl", "gemma3"])
def test_family_conforms_on_text_rows(vlm_checkpoint, shape):
    check_family(vlm_checkpoint(shape), "vlm")

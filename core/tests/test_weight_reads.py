"""Weights read in threads (``mlxcel.builtin.weight_reads``): the same parameters as
mlx-lm's own load, for plain, quantized and sanitized checkpoints, and nothing read where
the files would not fit the model."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model
from mlxcel.builtin import text_loader, weight_reads
from mlxcel.builtin.text_loader import load
from mlxcel.families.api import LoadOptions
from mlxcel.testing.checkpoint import cached_checkpoint


def params(model) -> dict[str, np.ndarray]:
    return {k: np.array(v.astype(mx.float32)) if v.dtype != mx.uint32 else np.array(v)
            for k, v in tree_flatten(model.parameters())}


@pytest.mark.parametrize("shape,bits", [("qwen3", None), ("llama", 4), ("gemma3_text", None)])
def test_threaded_reads_give_mlx_lms_parameters(shape, bits, mlxcel_checkpoint_cache):
    path = cached_checkpoint(shape, mlxcel_checkpoint_cache, quantize_bits=bits)
    own = params(load(path, LoadOptions()).model.model)
    model, _ = load_model(path, lazy=True)
    assert weight_reads.load_in_threads(model, path, threads=3) is True
    threaded = params(model)
    assert own.keys() == threaded.keys() and own
    for name, value in own.items():
        assert value.dtype == threaded[name].dtype, name
        np.testing.assert_array_equal(value, threaded[name], err_msg=name)


def test_the_text_loader_reads_in_threads_when_asked(tiny_checkpoint, monkeypatch):
    calls = []
    real = weight_reads.load_in_threads
    monkeypatch.setattr(text_loader, "load_in_threads",
                        lambda model, path, threads: calls.append(threads) or real(
                            model, path, threads))
    load(tiny_checkpoint, LoadOptions())
    load(tiny_checkpoint, LoadOptions(read_threads=4, lazy=True))  # --distributed: lazy
    assert calls == []
    loaded = load(tiny_checkpoint, LoadOptions(read_threads=4))
    assert calls == [4]
    logits = loaded.model(mx.array([[1, 2, 3]]), loaded.model.make_cache())
    assert logits.shape[:2] == (1, 3) and mx.isfinite(logits).all().item()


def test_read_weights_deals_every_tensor_once(tiny_checkpoint):
    files = sorted(tiny_checkpoint.glob("model*.safetensors"))
    expected = {}
    for f in files:
        expected.update(mx.load(str(f)))
    got = weight_reads.read_weights(files, threads=5)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert mx.array_equal(value, got[name]).item(), name


def test_files_that_do_not_fit_are_not_read(mlxcel_checkpoint_cache, tmp_path, monkeypatch):
    """A model whose parameters differ from the files (here another checkpoint's shape)
    keeps its own lazy parameters, and no thread reads anything."""
    small = cached_checkpoint("qwen3", mlxcel_checkpoint_cache)
    wide = cached_checkpoint("qwen3", mlxcel_checkpoint_cache, hidden_size=128)
    model, _ = load_model(small, lazy=True)
    before = {k: id(v) for k, v in tree_flatten(model.parameters())}
    reads = []
    monkeypatch.setattr(weight_reads, "read_weights",
                        lambda files, *rest: reads.append(files) or {})
    assert weight_reads.load_in_threads(model, wide, threads=4) is False
    assert reads == []
    assert {k: id(v) for k, v in tree_flatten(model.parameters())} == before


def test_a_failing_thread_fails_the_read(tiny_checkpoint, monkeypatch):
    """An error in a reading thread reaches the caller instead of leaving a part empty."""
    files = sorted(tiny_checkpoint.glob("model*.safetensors"))
    real = weight_reads.mx.load

    def load(path, stream=None):
        if stream is not None:  # the threads' loads
            raise RuntimeError("this thread cannot read")
        return real(path)

    monkeypatch.setattr(weight_reads.mx, "load", load)
    with pytest.raises(RuntimeError, match="this thread cannot read"):
        weight_reads.read_weights(files, threads=2)

"""Projections that read the same input, computed as one matmul.

A Llama-shaped decode step is bound by the host on CUDA: each op costs a few microseconds
to build in Python and to encode, whatever its size, and a layer issues three input
projections (q, k, v) and two MLP projections (gate, up) of the same activations.
``fuse(model)`` stacks each such group's weights into one matrix, so a layer issues two
matmuls where it issued five, without touching the mlx-lm code that calls them: the first
projection of a group called on an input computes the stacked product (split once), and
the other projections of the group return their part of it. A projection called on the
same input twice computes its own product from its rows of the stacked weight, so the
result is the same in every case; only the number of kernels changes. A group whose parts
turn out to take different inputs (cross-attention) computes each part on its own from then
on.

Groups: ``q_proj``/``k_proj``/``v_proj`` of one module and ``gate_proj``/``up_proj`` of
one module, when they are all ``nn.Linear`` (bias on all or none) or all
``nn.QuantizedLinear`` of one quantization. On by default on CUDA only
(``--fuse-projections``, ``MLXCEL_FUSE_PROJECTIONS``): fewer, larger matmuls shorten the
step's kernel encoding on CUDA, while on the CPU they did not make a step faster
(docs/explanation/batching.md, "Fused projections").
"""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx
import mlx.nn as nn

GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class _Stacked(nn.Module):
    """A group's weights stacked along the output dimension (what ``parameters()`` sees)."""

    def __init__(self, parts: list[nn.Module]) -> None:
        super().__init__()
        first = parts[0]
        for key in ("weight", "scales", "biases", "bias"):
            if first.get(key) is not None:
                self[key] = mx.concatenate([p[key] for p in parts])
        self.quant = (first.group_size, first.bits, getattr(first, "mode", "affine")) \
            if isinstance(first, nn.QuantizedLinear) else None


class _Group:
    """The hot path's state, kept off ``nn.Module`` (plain attribute lookups)."""

    __slots__ = ("weight", "weight_t", "scales", "biases", "bias", "quant", "cuts", "bounds",
                 "input", "outputs", "pending", "split", "full")

    def __init__(self, stacked: _Stacked, sizes: list[int]) -> None:
        for key in ("weight", "scales", "biases", "bias"):
            setattr(self, key, stacked.get(key))
        self.quant = stacked.quant
        # transposed once, a view of the stacked weight: not one transpose per call
        self.weight_t = self.weight.T if self.quant is None else None
        self.bounds = [(sum(sizes[:i]), sum(sizes[:i + 1])) for i in range(len(sizes))]
        self.cuts = [hi for _, hi in self.bounds[:-1]]
        self.full = (1 << len(sizes)) - 1
        self.input: mx.array | None = None
        self.outputs: list[mx.array] = []
        self.pending = 0  # bit i: part i of ``outputs`` not handed out yet
        self.split = False  # the parts take different inputs: each computes its own

    def stacked(self, x: mx.array) -> mx.array:
        """The whole group's product with ``x``."""
        if self.quant is None:
            y = x @ self.weight_t
        else:
            group_size, bits, mode = self.quant
            y = mx.quantized_matmul(x, self.weight, scales=self.scales, biases=self.biases,
                                    transpose=True, group_size=group_size, bits=bits,
                                    mode=mode)
        return y if self.bias is None else y + self.bias

    def own(self, i: int, x: mx.array) -> mx.array:
        """Part ``i``'s product with ``x`` from its rows of the stacked weight alone."""
        rows = slice(*self.bounds[i])

        def pick(a: mx.array | None) -> mx.array | None:
            return a if a is None else a[rows]

        if self.quant is None:
            y = x @ self.weight[rows].T
        else:
            group_size, bits, mode = self.quant
            y = mx.quantized_matmul(x, pick(self.weight), scales=pick(self.scales),
                                    biases=pick(self.biases), transpose=True,
                                    group_size=group_size, bits=bits, mode=mode)
        return y if self.bias is None else y + pick(self.bias)

    def project(self, i: int, x: mx.array) -> mx.array:
        """Part ``i`` of the group's product with ``x``."""
        bit = 1 << i
        if x is self.input and self.pending & bit:  # a later part of the same input
            self.pending ^= bit
            out = self.outputs[i]
            if not self.pending:
                self.input, self.outputs = None, []
            return out
        if self.split:
            return self.own(i, x)
        if self.pending & bit:  # a part still owed takes another input: cross-attention
            self.split, self.input, self.outputs, self.pending = True, None, [], 0
            return self.own(i, x)
        if x is self.input:  # the same input twice: its own rows
            return self.own(i, x)
        # a new input (or a forward that stopped half-way): the stacked product
        self.input = x
        self.outputs = mx.split(self.stacked(x), self.cuts, axis=-1)
        self.pending = self.full ^ bit
        return self.outputs[i]


def _bind(module: nn.Module, name: str, group: _Group, index: int) -> None:
    """Put part ``index`` of ``group`` where projection ``name`` of ``module`` stood: a
    ``functools.partial`` of ``group.project`` in the module's instance attributes, which
    the mlx-lm code's ``self.q_proj(x)`` finds and calls without a Python frame of its own
    (an ``nn.Module`` child is found through ``Module.__getattr__``, a Python call, and
    would add its own ``__call__``); the projection leaves the module's children, whose
    parameters the stacked weights (``mlxcel_<first>_stacked``) now hold."""
    del module[name]
    object.__setattr__(module, name, functools.partial(group.project, index))


def _compatible(parts: list[Any]) -> bool:
    kinds = {type(p) for p in parts}
    if kinds == {nn.Linear}:
        return len({("bias" in p, p.weight.shape[1], p.weight.dtype) for p in parts}) == 1
    if kinds == {nn.QuantizedLinear}:
        return len({(p.group_size, p.bits, getattr(p, "mode", "affine"), "bias" in p,
                     p.get("biases") is None, p.weight.shape[1]) for p in parts}) == 1
    return False


def fuse(model: Any) -> int:
    """Fuse every group of ``model`` (see the module docstring); returns how many groups."""
    if not isinstance(model, nn.Module):  # an engine wrapper (TextModel): its mlx-lm model
        model = getattr(model, "model", None)
        if not isinstance(model, nn.Module):
            return 0
    fused = 0
    for _, module in list(model.named_modules()):
        for names in GROUPS:
            parts = [getattr(module, n, None) for n in names]
            if any(p is None for p in parts) or not _compatible(parts):
                continue
            stacked = _Stacked(parts)
            group = _Group(stacked, [p.weight.shape[0] for p in parts])
            mx.eval(stacked.parameters(), *([group.weight_t] if group.weight_t is not None
                                            else []))
            setattr(module, f"mlxcel_{names[0]}_stacked", stacked)
            for i, name in enumerate(names):
                _bind(module, name, group, i)
            fused += 1
    return fused

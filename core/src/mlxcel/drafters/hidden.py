"""The target's hidden states, for drafters that read them (``DraftSession.needs_hidden``).

The state an MTP head or an assistant drafter continues from is the target's last hidden
state: the output of the text model's final norm, the vector its LM head reads. mlx-lm's
models compute it inside their forward and return only the logits, so ``tap(model)``
makes that norm module record its latest output: the instance's class becomes a subclass
whose ``__call__`` keeps a reference to what the norm returns. The module's parameters,
its place in the model and the graph the forward builds are unchanged, and the reference
is the forward's own array, so reading it copies nothing. A tap is installed only for a
drafter that needs it; every other engine leaves the model as loaded.

A DFlash drafter reads the outputs of chosen decoder layers instead
(``DraftSession.hidden_layers``): ``tap(model, layers)`` makes each of those layers
record its output the same way, and ``take`` joins them on the last axis, in the order
given. The join is one lazy concatenation, evaluated only where a session's states are. A layer that returns a
tuple (Gemma 4's: its output, then the keys and values it shares and their offset)
records its first item, the hidden state the next layer reads.

The recording is whatever the module computed last, prefill chunks included: the engine
reads it right after the decode or verify forward it wants (``take``), and a forward
that does not call the module (a path that inlines it) leaves nothing, so its rows do
not draft with such a drafter.
"""

from __future__ import annotations

from typing import Any

import mlx.nn as nn

# where mlx-lm's text models keep their final norm, on the inner model
NORM_NAMES = ("norm", "final_layernorm", "ln_f", "norm_f")
_ATTR = "_mlxcel_tap"
_TAPPED: dict[type, type] = {}


class Tap:
    """The latest output of a tapped module (``last``: [B, L, H], or None)."""

    def __init__(self) -> None:
        self.last: Any = None

    def take(self) -> Any:
        """The latest output, forgotten here (the next forward records its own)."""
        out, self.last = self.last, None
        return out

    def clear(self) -> None:
        """Forget what was recorded: what the next forward records is that forward's."""
        self.last = None


class LayerTap:
    """The latest outputs of tapped decoder layers, joined on the last axis
    ([B, L, len(layers) * H]); None where one of them recorded nothing."""

    def __init__(self, taps: list[Tap]) -> None:
        self.taps = taps

    def take(self) -> Any:
        """The layers' latest outputs joined, forgotten here."""
        import mlx.core as mx

        outs = [t.take() for t in self.taps]
        if any(o is None for o in outs) or len({tuple(o.shape[:-1]) for o in outs}) != 1:
            return None
        return outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=-1)

    def clear(self) -> None:
        for t in self.taps:
            t.clear()


def network(model: Any) -> Any:
    """The mlx-lm module behind ``model`` (an engine wrapper may hold it as ``.model``)."""
    return model if isinstance(model, nn.Module) else getattr(model, "model", None)


def text_model(model: Any) -> Any:
    """The inner text model whose layers and final norm the forward runs: ``.model`` of
    the network, or of its ``language_model`` (multimodal checkpoints)."""
    net = network(model)
    for outer in (net, getattr(net, "language_model", None)):
        inner = getattr(outer, "model", None)
        if isinstance(inner, nn.Module) and hasattr(inner, "layers"):
            return inner
    return None


def final_norm(model: Any) -> nn.Module | None:
    """The module whose output the LM head reads, or None where it is not found."""
    inner = text_model(model)
    for name in NORM_NAMES:
        norm = getattr(inner, name, None) if inner is not None else None
        if isinstance(norm, nn.Module):
            return norm
    return None


def _tapped(cls: type) -> type:
    if cls not in _TAPPED:
        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = cls.__call__(self, *args, **kwargs)
            self.__dict__[_ATTR].last = out[0] if isinstance(out, tuple) else out
            return out

        _TAPPED[cls] = type(f"Tapped{cls.__name__}", (cls,), {"__call__": __call__})
    return _TAPPED[cls]


def decoder_layers(model: Any) -> list[Any] | None:
    """The text model's decoder layers, in the order the forward runs them, or None."""
    layers = getattr(text_model(model), "layers", None)
    return list(layers) if isinstance(layers, (list, tuple)) else None


def _record(module: nn.Module) -> Tap:
    """``module`` made to record its output (once: a second call returns the same
    ``Tap``)."""
    found = module.__dict__.get(_ATTR)
    if found is not None:
        return found
    module.__dict__[_ATTR] = Tap()  # an instance attribute: not one of the module's children
    module.__class__ = _tapped(type(module))
    return module.__dict__[_ATTR]


def session_layers(session: Any) -> tuple[int, ...] | None:
    """The decoder layers whose outputs ``session`` reads (``DraftSession.hidden_layers``),
    or None: the final norm's."""
    layers = getattr(session, "hidden_layers", None)
    return None if layers is None else tuple(int(i) for i in layers)


def tap_for(model: Any, session: Any) -> Tap | LayerTap | None:
    """``model`` tapped where ``session`` reads it (``tap``), or None for a session that
    reads no hidden states (no ``needs_hidden``) or a model without those modules."""
    if not getattr(session, "needs_hidden", False):
        return None
    return tap(model, session_layers(session))


def tap(model: Any, layers: tuple[int, ...] | None = None) -> Tap | LayerTap | None:
    """``model``'s final norm made to record its output, or with ``layers`` (decoder
    layer indices) those layers; None where the model has no such modules (no final
    norm, an index past its layers)."""
    if layers is None:
        norm = final_norm(model)
        return None if norm is None else _record(norm)
    found = decoder_layers(model)
    if not layers or found is None or any(not 0 <= i < len(found) for i in layers):
        return None
    return LayerTap([_record(found[i]) for i in layers])


def bind_head(head: Any, target: Any) -> Any:
    """An mlx-vlm drafter module (MTP heads, an assistant) bound to ``target``'s network,
    cast to the target's compute dtype unless it is quantized: the hidden states it reads
    come in that dtype, and a mismatched head would recompute them in its own."""
    import mlx.core as mx

    from mlxcel.backend import model_dtype

    dtype = model_dtype(network(target))
    if dtype in ("float32", "float16", "bfloat16") and \
            getattr(head.config, "quantization", None) is None:
        head.set_dtype(getattr(mx, dtype))
    return head.bind(network(target))


def first_line(exc: BaseException) -> str:
    """What a one-line startup refusal says of ``exc``: its first line, at most 300
    characters, else its type's name."""
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__

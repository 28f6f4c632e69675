"""Embedding vectors after the model: llama-server's normalization codes, Matryoshka
truncation, OpenAI's base64 encoding, and the finiteness check."""

from __future__ import annotations

import base64

import numpy as np

from mlxcel.errors import InvalidRequest, ServerError

INT16_MAX = 32760.0  # llama-server's max-abs scale (code 0)


def normalize(vector: np.ndarray, code: int) -> np.ndarray:
    """``--embd-normalize``: -1 none, 0 max-abs scaled to int16's range, 1 taxicab,
    2 euclidean, above 2 the p-norm of that order. Along the last axis (a row per token
    is normalized per row). A zero vector stays zero."""
    v = np.asarray(vector, dtype=np.float32)
    if code < 0:
        return v
    if code == 0:
        norm = np.abs(v).max(axis=-1, keepdims=True) / INT16_MAX
    elif code == 2:
        norm = np.sqrt((v.astype(np.float64) ** 2).sum(axis=-1, keepdims=True))
    else:
        norm = (np.abs(v.astype(np.float64)) ** code).sum(axis=-1, keepdims=True) ** (1 / code)
    return (v / np.where(norm > 0, norm, 1)).astype(np.float32)


def check_dimensions(dimensions: int | None, full: int) -> None:
    """``dimensions`` is a size the model's ``full`` vector can be cut to (OpenAI's rule: a
    larger or non-positive size is the client's error); checked before the model runs."""
    if dimensions is not None and not 1 <= dimensions <= full:
        raise InvalidRequest(f"'dimensions' must be between 1 and the model's {full}, "
                             f"not {dimensions}", param="dimensions")


def truncate(vector: np.ndarray, dimensions: int | None, full: int) -> np.ndarray:
    """The first ``dimensions`` values (Matryoshka), checked against the model's ``full``
    size; normalization comes after, so a truncated vector is re-normalized."""
    if dimensions is None:
        return vector
    check_dimensions(dimensions, full)
    return vector[..., :dimensions]


def check_finite(vectors: list[np.ndarray]) -> None:
    """A NaN or infinity is the model's failure, never the client's: a 500."""
    if not all(np.isfinite(v).all() for v in vectors):
        raise ServerError("the embedding model produced a non-finite value")


def to_base64(vector: np.ndarray) -> str:
    """OpenAI's ``encoding_format: base64``: little-endian float32 bytes."""
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")

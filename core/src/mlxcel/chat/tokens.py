"""A prompt's text to token ids, within the context window.

The checks run before (or while) tokenizing, so that a prompt too long for the context is
refused without holding the GIL for a list of ids that will be thrown away.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlxcel.errors import ContextLengthExceeded
from mlxcel.model.tokenizer import TooManyTokens


def byte_bound(engine: Any) -> int | None:
    """The most UTF-8 bytes a text may have and still fit the context window, or None when
    the tokenizer gives no such bound (see ``Tokenizer.max_token_bytes``)."""
    per_token = engine.checkpoint.tokenizer.max_token_bytes
    return None if per_token is None else engine.context_size * per_token


def check_fits(engine: Any, text: str, param: str) -> None:
    """Refuse a text that cannot fit the context window whatever it tokenizes to, before
    tokenizing it: every token stands for at most ``max_token_bytes`` bytes of text."""
    bound = byte_bound(engine)
    if bound is None or len(text) <= bound // 4 or len(text.encode("utf-8")) <= bound:
        return
    ctx = engine.context_size
    at_least = -(-len(text.encode("utf-8")) // (bound // ctx))  # bytes / max bytes per token
    raise ContextLengthExceeded(
        f"'{param}' is too long: no tokenization of it fits the context window of "
        f"{ctx} tokens", param=param, n_prompt_tokens=at_least, n_ctx=ctx)


def encode_prompt(engine: Any, text: str, param: str, add_special: bool) -> list[int]:
    """Tokenize a prompt that must leave room for one generated token in the context; the
    byte bound is checked first, and a prompt over the limit is refused before its ids
    become a Python list."""
    return _encode(engine, text, param, lambda tok, limit: tok.encode(text, add_special,
                                                                      max_tokens=limit))


def encode_prompt_spans(engine: Any, text: str, param: str, add_special: bool
                        ) -> tuple[list[int], Sequence[tuple[int, int]]]:
    """``encode_prompt`` with each token's character span (``Tokenizer.encode_spans``)."""
    return _encode(engine, text, param, lambda tok, limit: tok.encode_spans(
        text, add_special, max_tokens=limit))


def check_length(engine: Any, count: int, param: str) -> None:
    """Refuse a prompt of ``count`` tokens (media expanded) that leaves no room for one
    generated token in the context."""
    ctx = engine.context_size
    if count > ctx - 1:
        raise ContextLengthExceeded(
            f"the prompt has {count} tokens (its media included), more than the context "
            f"window of {ctx} tokens allows (leave room for at least one generated token)",
            param=param, n_prompt_tokens=count, n_ctx=ctx)


def _encode(engine: Any, text: str, param: str, encode: Any) -> Any:
    check_fits(engine, text, param)
    ctx = engine.context_size
    try:
        return encode(engine.checkpoint.tokenizer, ctx - 1)
    except TooManyTokens as exc:
        raise ContextLengthExceeded(
            f"the prompt has {exc.count} tokens, more than the context window of {ctx} "
            "tokens allows (leave room for at least one generated token)", param=param,
            n_prompt_tokens=exc.count, n_ctx=ctx) from None

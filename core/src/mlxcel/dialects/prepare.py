"""Request preparation off the event loop: parsing, template rendering and tokenizing.

Large bodies are handled in a small fixed pool of threads so that the event loop keeps
answering (``/health``, running streams) while one is prepared; the pool's size bounds the
threads a flood of large bodies can occupy. Small bodies are prepared inline, since a
thread hop costs more than the work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from litestar import Request

from mlxcel.engine.tokenizer import TooManyTokens
from mlxcel.errors import ContextLengthExceeded, InvalidRequest

T = TypeVar("T")
PREPARE_THREADS = 2
INLINE_BODY_BYTES = 64 << 10  # bodies below this are prepared on the event loop
_pool = ThreadPoolExecutor(max_workers=PREPARE_THREADS, thread_name_prefix="mlxcel-prepare")


async def prepare(size: int, fn: Callable[[], T]) -> T:
    """``fn()`` for a request body of ``size`` bytes: inline when small, else in the pool."""
    if size < INLINE_BODY_BYTES:
        return fn()
    return await asyncio.get_running_loop().run_in_executor(_pool, fn)


async def prepare_for(request: Request, fn: Callable[[], T]) -> T:
    """``prepare`` sized by the request's (already read, cached) body."""
    return await prepare(len(await request.body()), fn)


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
    raise ContextLengthExceeded(
        f"'{param}' is too long: no tokenization of it fits the context window of "
        f"{engine.context_size} tokens", param=param)


def encode_prompt(engine: Any, text: str, param: str, add_special: bool) -> list[int]:
    """Tokenize a prompt that must leave room for one generated token in the context; the
    byte bound is checked first, and a prompt over the limit is refused before its ids
    become a Python list."""
    check_fits(engine, text, param)
    ctx = engine.context_size
    try:
        return engine.checkpoint.tokenizer.encode(text, add_special, max_tokens=ctx - 1)
    except TooManyTokens as exc:
        raise ContextLengthExceeded(
            f"the prompt has {exc.count} tokens, more than the context window of {ctx} "
            "tokens allows (leave room for at least one generated token)", param=param
        ) from None


def check_token_ids(tokenizer: Any, ids: list[int], param: str) -> None:
    """Every id must be in ``[0, vocab_size)``; the first one that is not is named."""
    bad = tokenizer.first_invalid_id(ids)
    if bad is not None:
        raise InvalidRequest(f"token id {bad} is out of vocabulary range (vocab_size "
                             f"{tokenizer.vocab_size})", param=param)

"""Request preparation off the event loop: parsing, template rendering and tokenizing.

Large bodies are handled in a small fixed pool of threads so that the event loop keeps
answering (``/health``, running streams) while one is prepared; the pool's size bounds the
threads a flood of large bodies can occupy. Small bodies are prepared inline, since a
thread hop costs more than the work, unless the work decodes media (``heavy``): an
image's decode and its processor's resizing take milliseconds whatever the body's size,
and inline they would hold up every stream the loop serves and the requests behind it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from litestar import Request

# the prompt-size rules live in the chat layer; their names stay importable from here
from mlxcel.chat.tokens import byte_bound as byte_bound
from mlxcel.chat.tokens import check_fits as check_fits
from mlxcel.chat.tokens import encode_prompt as encode_prompt
from mlxcel.errors import InvalidRequest

T = TypeVar("T")
PREPARE_THREADS = 2
INLINE_BODY_BYTES = 64 << 10  # bodies below this are prepared on the event loop
_pool = ThreadPoolExecutor(max_workers=PREPARE_THREADS, thread_name_prefix="mlxcel-prepare")


async def prepare(size: int, fn: Callable[[], T]) -> T:
    """``fn()`` for a request body of ``size`` bytes: inline when small, else in the pool."""
    if size < INLINE_BODY_BYTES:
        return fn()
    return await asyncio.get_running_loop().run_in_executor(_pool, fn)


async def prepare_for(request: Request, fn: Callable[[], T], *, heavy: bool = False) -> T:
    """``prepare`` sized by the request's (already read, cached) body; ``heavy`` work
    (media to decode) always in the pool."""
    return await prepare(INLINE_BODY_BYTES if heavy else len(await request.body()), fn)


def check_token_ids(tokenizer: Any, ids: list[int], param: str) -> None:
    """Every id must be in ``[0, vocab_size)``; the first one that is not is named."""
    bad = tokenizer.first_invalid_id(ids)
    if bad is not None:
        raise InvalidRequest(f"token id {bad} is out of vocabulary range (vocab_size "
                             f"{tokenizer.vocab_size})", param=param)

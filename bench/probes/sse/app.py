"""Two SSE routes streaming the same chunk: Litestar's Stream and a raw ASGI handler
(bench/probes/sse/overhead.py serves this with Granian)."""

import asyncio

from litestar import Litestar, get
from litestar.handlers import asgi
from litestar.response import Stream
from litestar.types import Receive, Scope, Send

N = 2000
CHUNK = b'data: {"id":"chatcmpl-x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hello"}}]}\n\n'

async def gen():
    for _ in range(N):
        await asyncio.sleep(0)
        yield CHUNK

@get("/litestar")
async def lit() -> Stream:
    return Stream(gen(), media_type="text/event-stream")

@asgi("/raw")
async def raw(scope: "Scope", receive: "Receive", send: "Send") -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})
    async for chunk in gen():
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})

app = Litestar([lit, raw])

"""OpenAI logprobs shapes: chat (``content`` list) and legacy completions (parallel lists)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlxcel.model.tokenizer import Tokenizer
from mlxcel.types import TokenLogprob


def _text(tok: Tokenizer, token_id: int) -> str:
    return tok.decode([token_id], skip_special=False)


def _entry(tok: Tokenizer, token_id: int, logprob: float) -> dict[str, Any]:
    text = _text(tok, token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(tok: Tokenizer, items: Sequence[TokenLogprob]) -> dict[str, Any]:
    return {"content": [{**_entry(tok, it.token, it.logprob),
                         "top_logprobs": [_entry(tok, t, lp) for t, lp in it.top]}
                        for it in items], "refusal": None}


def completion_logprobs(tok: Tokenizer, items: Sequence[TokenLogprob], offset: int = 0,
                        with_top: bool = True) -> dict[str, Any]:
    tokens = [_text(tok, it.token) for it in items]
    offsets, position = [], offset
    for text in tokens:
        offsets.append(position)
        position += len(text)
    return {"tokens": tokens, "token_logprobs": [it.logprob for it in items],
            "top_logprobs": [{_text(tok, t): lp for t, lp in it.top} for it in items]
            if with_top else None,
            "text_offset": offsets}

"""llama-server's ``__verbose`` debug field (``-v`` / ``--verbose``): a whole OpenAI chat
or completion answer also carries the answer as llama-server's native ``/completion``
reports it (``content``, ``stop``, ``tokens_predicted``, ``tokens_evaluated``,
``stop_type``, ``stopping_word``, ``tokens_cached``, ...), so a client debugging against
llama-server sees the same object. Only whole (non-streamed) answers carry it."""

from __future__ import annotations

from typing import Any

import msgspec

from mlxcel.chat.answer import Answer

# answer finish reasons -> llama-server's stop_type ("stop": "word" with a stop string)
_STOP_TYPES = {"length": "limit", "stop": "eos", "tool_calls": "eos"}


def native_answer(answer: Answer, model: str) -> dict[str, Any]:
    """The answer in llama-server's ``/completion`` final shape."""
    finish = answer.finish
    assert finish is not None and finish.usage is not None
    usage, word = finish.usage, finish.stop_sequence or ""
    stop_type = "word" if word else _STOP_TYPES.get(finish.reason, "eos")
    return {"index": 0, "content": answer.content, "tokens": [], "id_slot": -1,
            "stop": True, "model": model, "tokens_predicted": usage.completion_tokens,
            "tokens_evaluated": usage.prompt_tokens, "has_new_line": "\n" in answer.content,
            "truncated": False, "stop_type": stop_type, "stopping_word": word,
            "tokens_cached": usage.cached_tokens}


def with_verbose(body: msgspec.Struct, answer: Answer, model: str, on: bool) -> Any:
    """``body`` as it is, or (``on``) as a dict with ``__verbose`` added."""
    if not on:
        return body
    out = msgspec.to_builtins(body)
    out["__verbose"] = native_answer(answer, model)
    return out

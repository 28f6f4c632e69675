"""llama-server's ``__verbose`` debug field (``-v`` / ``--verbose``): an OpenAI chat or
completion answer also carries the answer as llama-server's native ``/completion``
reports it, so a client debugging against llama-server sees the same objects. Where it
goes follows llama-server (``server-task.cpp``):

- a whole answer: the native final object (``content``, ``stop``, ``tokens_predicted``,
  ``tokens_evaluated``, ``stop_type``, ``stopping_word``, ``tokens_cached``, ...);
- a ``text_completion`` stream: every chunk carries the native chunk it stands for
  (``content``, ``tokens``, ``stop: false``, ``tokens_predicted``, ``tokens_evaluated``,
  and ``timings`` / ``prompt_progress`` / ``completion_probabilities`` as the native
  chunk has them), and the finishing chunk the final object with ``content`` empty;
- a ``chat.completion.chunk`` stream: only the finishing chunk, with the final object
  (``content`` empty: the text was streamed); its other chunks carry none.
"""

from __future__ import annotations

from typing import Any

import msgspec

from mlxcel.chat.answer import Answer
from mlxcel.types import Finish

# answer finish reasons -> llama-server's stop_type ("stop": "word" with a stop string)
_STOP_TYPES = {"length": "limit", "stop": "eos", "tool_calls": "eos"}


def native_final(finish: Finish, content: str, model: str, has_new_line: bool,
                 index: int = 0) -> dict[str, Any]:
    """The answer in llama-server's ``/completion`` final shape (``content``: the whole
    text, or "" at the end of a stream; ``has_new_line``: any generated text had one)."""
    usage, word = finish.usage, finish.stop_sequence or ""
    assert usage is not None
    stop_type = "word" if word else _STOP_TYPES.get(finish.reason, "eos")
    return {"index": index, "content": content, "tokens": [], "id_slot": -1,
            "stop": True, "model": model, "tokens_predicted": usage.completion_tokens,
            "tokens_evaluated": usage.prompt_tokens, "has_new_line": has_new_line,
            "truncated": False, "stop_type": stop_type, "stopping_word": word,
            "tokens_cached": usage.cached_tokens}


def native_chunk(index: int, content: str, tokens: list[int], predicted: int,
                 evaluated: int, **extra: Any) -> dict[str, Any]:
    """A streamed chunk in llama-server's ``/completion`` shape; ``extra``: its
    ``timings``, ``prompt_progress`` or ``completion_probabilities``."""
    return {"index": index, "content": content, "tokens": tokens, "stop": False,
            "id_slot": -1, "tokens_predicted": predicted, "tokens_evaluated": evaluated,
            **extra}


def native_answer(answer: Answer, model: str) -> dict[str, Any]:
    """A whole answer in llama-server's ``/completion`` final shape."""
    assert answer.finish is not None
    return native_final(answer.finish, answer.content, model, "\n" in answer.content)


def with_verbose(body: msgspec.Struct, answer: Answer, model: str, on: bool) -> Any:
    """``body`` as it is, or (``on``) as a dict with ``__verbose`` added."""
    if not on:
        return body
    out = msgspec.to_builtins(body)
    out["__verbose"] = native_answer(answer, model)
    return out

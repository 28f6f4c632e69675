"""Errors in the request's own names: the chat layer names ``messages`` (``messages[2]
.content``), but a Responses client sent ``input``. ``InputPaths`` renames a message's
path to the input item it came from (``input[j]...``), to ``instructions`` for the leading
system message, or to the field that brought a stored item in (``previous_response_id``,
``conversation``); a bare ``messages`` is ``input``. After a compaction the items no longer
line up with the input, and a message is named ``input`` only."""

from __future__ import annotations

import re
from typing import Any

from mlxcel.errors import MlxcelError

from .items import messages

Item = dict[str, Any]
_PARAM = re.compile(r"^messages(?:\[(\d+)\])?(.*)$", re.S)
_TEXT = re.compile(r"\bmessages\[(\d+)\]")


class InputPaths:
    """``history``: the request's items (stored ones first, then its ``n_input`` input
    items); ``lead``: the messages before them (1 with ``instructions``)."""

    def __init__(self, body: Any, history: list[Item], n_input: int, lead: int) -> None:
        self.history, self.lead = history, lead
        self.stored = len(history) - n_input
        self.earlier = "previous_response_id" if body.previous_response_id else "conversation"
        self._sources: list[int] | None = None

    def _source(self, i: int) -> int | None:
        if any(item["type"] == "compaction" for item in self.history):
            return None
        if self._sources is None:
            self._sources = []
            messages(self.history, self._sources)
        return self._sources[i] if 0 <= i < len(self._sources) else None

    def path(self, index: int) -> str:
        """The request's path of the prompt's message ``index``."""
        if index < self.lead:
            return "instructions"
        at = self._source(index - self.lead)
        if at is None:
            return "input"
        return self.earlier if at < self.stored else f"input[{at - self.stored}]"

    def _param(self, param: str) -> str:
        found = _PARAM.match(param)
        if found is None:
            return param
        if found.group(1) is None:
            return "input" + found.group(2)
        path = self.path(int(found.group(1)))
        return path + found.group(2) if path.startswith("input[") else path

    def rename(self, exc: MlxcelError) -> MlxcelError:
        """``exc`` with its ``param`` and message in the request's names."""
        if exc.param:
            exc.param = self._param(exc.param)
        text = _TEXT.sub(lambda m: self.path(int(m.group(1))), exc.message)
        exc.message = text.replace("'messages'", "'input'")
        exc.args = (exc.message,)
        return exc


def input_count(value: Any) -> int:
    """How many items the request's ``input`` makes (``history.input_items``: one each)."""
    if isinstance(value, list):
        return len(value)
    return 0 if value is None else 1

"""A request's history: the stored items that ``previous_response_id`` or ``conversation``
names, then its own ``input``; and what a finished turn leaves for the next one
(``history + response.output``)."""

from __future__ import annotations

from typing import Any

import msgspec

from mlxcel.errors import InvalidRequest
from mlxcel.types.messages import Message

from .compaction import open_capsule, replay
from .items import messages, normalize
from .schemas import History, Response
from .store import Stored, Stores

Item = dict[str, Any]


def input_items(value: str | list[Any] | None, where: str = "input") -> list[Item]:
    """A request's ``input``, checked (compaction capsules included): a string is one
    user message."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": value}]}]
    out = []
    for i, raw in enumerate(value):
        item = normalize(raw, f"{where}[{i}]")
        if item["type"] == "compaction":
            open_capsule(item["encrypted_content"], f"{where}[{i}].encrypted_content")
        out.append(item)
    return out


def conversation_id(value: str | dict[str, Any] | None) -> str | None:
    """``conversation``: an id string (or ``{"id": ...}``, the SDK's other form)."""
    if value is None:
        return None
    cid = value.get("id") if isinstance(value, dict) else value
    if not isinstance(cid, str) or not cid:
        raise InvalidRequest("'conversation' must be a conversation id string",
                             param="conversation")
    return cid


def disabled(what: str, flag: str, param: str) -> InvalidRequest:
    return InvalidRequest(f"{what} storage is disabled on this server ({flag} 0)",
                          param=param)


def stored_response(stores: Stores, response_id: str, param: str) -> Stored | None:
    """The stored response (None: not there); a 400 when storing is off."""
    if not stores.responses.enabled:
        raise disabled("response", "--responses-store-max-entries", param)
    return stores.responses.get(response_id)


def earlier(stores: Stores, body: History) -> list[Item]:
    """The stored items the request continues from."""
    cid = conversation_id(body.conversation)
    if body.previous_response_id is not None and cid is not None:
        raise InvalidRequest("'previous_response_id' and 'conversation' cannot be used "
                             "together", param="previous_response_id")
    if body.previous_response_id is not None:
        found = stored_response(stores, body.previous_response_id, "previous_response_id")
        if found is None:
            raise InvalidRequest(f"previous response '{body.previous_response_id}' was not "
                                 "found (it may have expired)", code="previous_response_not_found",
                                 param="previous_response_id")
        return [*found.history, *output_items(found.response)]
    if cid is not None:
        if not stores.conversations.enabled:
            raise disabled("conversation", "--conversation-store-max-entries", "conversation")
        return list(stores.conversations.get(cid) or ())
    return []


def history_of(stores: Stores, body: History) -> list[Item]:
    """The whole history of the request: what it continues from, then its input."""
    items = earlier(stores, body) + input_items(body.input)
    if not items:
        raise InvalidRequest("'input' must hold at least one item", param="input")
    return items


def chat_messages(items: list[Item]) -> list[Message]:
    return messages(replay(items))


def output_items(response: Response) -> list[Item]:
    """A response's output as the input items it reads back as."""
    return msgspec.to_builtins(response.output)


def remember(stores: Stores, body: Any, response: Response, history: list[Item]) -> None:
    """Store a finished response (``store``) and extend its conversation."""
    after = [*history, *output_items(response)]
    if body.store:
        stores.responses.put(response.id, Stored(response=response, history=history))
    cid = conversation_id(body.conversation)
    if cid is not None:
        stores.conversations.put(cid, after)

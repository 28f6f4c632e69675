"""A request's history: the stored items that ``previous_response_id`` or ``conversation``
names (within the request's API key scope), then its own ``input``; and what a finished
turn leaves for the next one (``history + response.output``, cut down by ``bounds.slim``).

A conversation exists only once ``POST /v1/conversations`` made it; an unknown, expired or
evicted id (or another key's) is a 404 ``conversation_not_found``, never a fresh one."""

from __future__ import annotations

from typing import Any

import msgspec

from mlxcel.errors import InvalidRequest, NotFound
from mlxcel.types.messages import Message

from .bounds import check_id, slim
from .compaction import open_capsule, replay
from .items import messages, normalize
from .schemas import Conversation, History, Response
from .store import Stored, Stores, scoped, size_of

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
    check_id(cid, "conversation")
    return cid


def disabled(what: str, flag: str, param: str) -> InvalidRequest:
    return InvalidRequest(f"{what} storage is disabled on this server ({flag} 0)",
                          param=param)


def stored_response(stores: Stores, scope: str, response_id: str,
                    param: str) -> Stored | None:
    """The stored response of this key scope (None: not there); a 400 when storing is off."""
    if not stores.responses.enabled:
        raise disabled("response", "--responses-store-max-entries", param)
    check_id(response_id, param)
    return stores.responses.get(scoped(scope, response_id))


def conversation_not_found(cid: str) -> NotFound:
    shown = cid if len(cid) <= 64 else cid[:64] + "..."
    return NotFound(f"conversation '{shown}' was not found (it may have expired)",
                    code="conversation_not_found", param="conversation")


def stored_conversation(stores: Stores, scope: str, cid: str) -> Conversation:
    """The conversation of this key scope; 404 when there is none, 400 when storing is off."""
    if not stores.conversations.enabled:
        raise disabled("conversation", "--conversation-store-max-entries", "conversation")
    check_id(cid, "conversation")
    found = stores.conversations.get(scoped(scope, cid))
    if found is None:
        raise conversation_not_found(cid)
    return found


def earlier(stores: Stores, scope: str, body: History) -> list[Item]:
    """The stored items the request continues from."""
    cid = conversation_id(body.conversation)
    if body.previous_response_id is not None and cid is not None:
        raise InvalidRequest("'previous_response_id' and 'conversation' cannot be used "
                             "together", param="previous_response_id")
    if body.previous_response_id is not None:
        found = stored_response(stores, scope, body.previous_response_id,
                                "previous_response_id")
        if found is None:
            raise InvalidRequest(f"previous response '{body.previous_response_id}' was not "
                                 "found (it may have expired)", code="previous_response_not_found",
                                 param="previous_response_id")
        return [*found.history, *output_items(found.response)]
    if cid is not None:
        return list(stored_conversation(stores, scope, cid).items)
    return []


def history_of(stores: Stores, scope: str, body: History) -> list[Item]:
    """The whole history of the request: what it continues from, then its input."""
    items = earlier(stores, scope, body) + input_items(body.input)
    if not items:
        raise InvalidRequest("'input' must hold at least one item", param="input")
    return items


def chat_messages(items: list[Item]) -> list[Message]:
    return messages(replay(items))


def output_items(response: Response) -> list[Item]:
    """A response's output as the input items it reads back as."""
    return msgspec.to_builtins(response.output)


def check_room(stores: Stores, scope: str, body: Any, history: list[Item]) -> None:
    """Before generating: a conversation already at its byte budget takes no more turns."""
    cid = conversation_id(body.conversation)
    if cid is None:
        return
    convo = stored_conversation(stores, scope, cid)
    grown = msgspec.structs.replace(convo, items=slim(history))
    if size_of(grown) > stores.conversations.max_bytes:
        raise InvalidRequest(
            f"conversation is over this server's {stores.conversations.max_bytes}-byte "
            "budget (--conversation-store-max-bytes); compact it with /v1/responses/compact "
            "and go on in a new conversation", code="conversation_too_large",
            param="conversation")


def remember(stores: Stores, scope: str, body: Any, response: Response,
             history: list[Item]) -> None:
    """Store a finished response (``store``) and extend its conversation (a conversation
    that this turn took past its budget, or that is gone meanwhile, is dropped)."""
    if body.store:
        stores.responses.put(scoped(scope, response.id), Stored(
            response=response, history=slim(history, open_end=True)))
    cid = conversation_id(body.conversation)
    if cid is None:
        return
    key = scoped(scope, cid)
    convo = stores.conversations.get(key)
    if convo is not None:
        items = slim([*history, *output_items(response)])
        stores.conversations.put(key, msgspec.structs.replace(convo, items=items))

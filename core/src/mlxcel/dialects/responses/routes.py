"""Responses routes: create, retrieve, delete, cancel, input_tokens and compact, each under
``/v1/responses`` and without ``/v1``; and ``/v1/conversations`` (create, retrieve,
delete), which makes the server's conversation ids. Every stored entry belongs to the API
key that made it: another key gets 404."""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec
from litestar import Request, delete, get, post

from mlxcel.context import AppContext
from mlxcel.dialects.wire import client_closed, decode_body
from mlxcel.errors import InvalidRequest, MlxcelError, NotFound
from mlxcel.middleware import key_scope

from . import schemas as s
from .bounds import check_metadata
from .compactor import Compactor, keep_tokens, summary_tokens
from .create import Create
from .history import (
    check_room,
    history_of,
    input_items,
    stored_conversation,
    stored_response,
)
from .params import InputPaths, input_count
from .store import Stored, Stores, scoped
from .stream import wire_usage
from .translate import prompt_request, tool_choice_of, tools_of, turn_options

STORES = "responses.stores"  # AppContext.extra key of the app's stores


def paths(tail: str = "", base: str = "responses") -> list[str]:
    return [f"/v1/{base}{tail}", f"/{base}{tail}"]


def _stored(stores: Stores, request: Request, response_id: str) -> Stored:
    found = stored_response(stores, key_scope(request.scope), response_id, "response_id")
    if found is None:
        raise NotFound(f"no stored response with id '{response_id}' (it may have expired)")
    return found


def _new_conversation(stores: Stores, request: Request,
                      body: s.ConversationRequest) -> s.Conversation:
    """A server-made conversation id, stored (empty, or with ``items``) for this key."""
    if not stores.conversations.enabled:
        raise InvalidRequest("conversation storage is disabled on this server "
                             "(--conversation-store-max-entries 0)")
    check_metadata(body.metadata)
    convo = s.Conversation(id=f"conv_{uuid.uuid4().hex}", created_at=int(time.time()),
                           metadata=body.metadata or {}, items=input_items(body.items, "items"))
    if not stores.conversations.put(scoped(key_scope(request.scope), convo.id), convo):
        raise InvalidRequest("'items' are over this server's conversation byte budget "
                             "(--conversation-store-max-bytes)", param="items")
    return convo


def _refuse_for_compact(body: s.CompactRequest) -> None:
    """Compaction reads the whole history from ``input`` and answers once."""
    for field in ("stream", "previous_response_id", "conversation"):
        if getattr(body, field):
            raise InvalidRequest(f"'{field}' is not supported by /v1/responses/compact; send "
                                 "the whole history as 'input'", param=field)


def build(ctx: AppContext) -> list[Any]:
    stores = ctx.extra.setdefault(STORES, Stores(ctx.settings))

    @post(paths(), status_code=200)
    async def create(request: Request) -> Any:
        ctx.require_chat()
        body = await decode_body(request, s.CreateRequest)
        return await Create(ctx, request, stores, body).answer()

    @get(paths("/{response_id:str}"))
    async def retrieve(request: Request, response_id: str) -> s.Response:
        return _stored(stores, request, response_id).response

    @delete(paths("/{response_id:str}"), status_code=200)
    async def remove(request: Request, response_id: str) -> dict[str, Any]:
        _stored(stores, request, response_id)
        stores.responses.delete(scoped(key_scope(request.scope), response_id))
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    @post(paths("/{response_id:str}/cancel"), status_code=200)
    async def cancel(request: Request, response_id: str) -> s.Response:
        found = _stored(stores, request, response_id)
        response = msgspec.structs.replace(found.response, status="cancelled")
        stores.responses.put(scoped(key_scope(request.scope), response_id),
                             Stored(response=response, history=found.history))
        return response

    @post(paths(base="conversations"), status_code=200)
    async def new_conversation(request: Request) -> dict[str, Any]:
        body = await decode_body(request, s.ConversationRequest)
        return _new_conversation(stores, request, body).wire()

    @get(paths("/{conversation_id:str}", "conversations"))
    async def conversation(request: Request, conversation_id: str) -> dict[str, Any]:
        return stored_conversation(stores, key_scope(request.scope), conversation_id).wire()

    @delete(paths("/{conversation_id:str}", "conversations"), status_code=200)
    async def remove_conversation(request: Request, conversation_id: str) -> dict[str, Any]:
        scope = key_scope(request.scope)
        stored_conversation(stores, scope, conversation_id)
        stores.conversations.delete(scoped(scope, conversation_id))
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    @post(paths("/input_tokens"), status_code=200)
    async def input_tokens(request: Request) -> dict[str, Any]:
        ctx.require_chat()
        body = await decode_body(request, s.CreateRequest)
        tools, choice = tools_of(body.tools), tool_choice_of(body.tool_choice)
        compactor = Compactor(ctx, request, lambda messages: prompt_request(
            body, body.instructions, messages, tools=tools, tool_choice=choice),
            turn_options(body))
        scope = key_scope(request.scope)
        history = history_of(stores, scope, body)
        check_room(stores, scope, body, history)
        try:
            count = await compactor.count(history)
        except MlxcelError as exc:
            raise InputPaths(body, history, input_count(body.input),
                             1 if body.instructions else 0).rename(exc) from None
        return {"object": "response.input_tokens", "input_tokens": count}

    @post(paths("/compact"), status_code=200)
    async def compact(request: Request) -> Any:
        ctx.require_chat()
        body = await decode_body(request, s.CompactRequest)
        _refuse_for_compact(body)
        keep, limit = keep_tokens(ctx, body.keep_tokens), summary_tokens(body.max_output_tokens)
        items = input_items(body.input)
        if not items:
            raise InvalidRequest("'input' must hold the history to compact", param="input")
        compactor = Compactor(ctx, request, lambda messages: prompt_request(
            body, body.instructions, messages), turn_options(body))
        result = await compactor.run(items, keep, limit)
        if result is None:
            return client_closed()
        return s.CompactedResponse(id=f"resp_{uuid.uuid4().hex}", created_at=int(time.time()),
                                   model=body.model or ctx.model_name, output=result.output,
                                   usage=wire_usage(result.usage))

    return [create, retrieve, remove, cancel, input_tokens, compact, new_conversation,
            conversation, remove_conversation]

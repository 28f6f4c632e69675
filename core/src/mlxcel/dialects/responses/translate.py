"""A Responses request's fields -> the chat layer's ``PromptRequest`` and ``TurnOptions``:
function tools, ``tool_choice``, ``text.format``, the generation fields; and the 400s for
what this server does not do (built-in tools, ``truncation`` other than ``"disabled"``,
``background``), so that a client never gets something other than it asked for."""

from __future__ import annotations

from typing import Any

from mlxcel.chat.prompt import pick_template_kwargs
from mlxcel.chat.request import REASONING_BUDGET_ALIASES, SAMPLING_DEFAULTS, reasoning_budget
from mlxcel.dialects.media_options import media_options
from mlxcel.dialects.turn import TurnOptions
from mlxcel.errors import InvalidRequest
from mlxcel.types.constraints import Constraint, JsonSchemaConstraint
from mlxcel.types.messages import FunctionChoice, Message, PromptRequest, TextPart, Tool

from .schemas import CreateRequest, Sampling

COMPACT_THRESHOLD_MAX = 100_000_000


def check_request(body: CreateRequest) -> None:
    """Refuse what would run otherwise than asked: there are no background jobs, and the
    input is never cut to fit."""
    if body.background:
        raise InvalidRequest("'background': true is not supported; send the request "
                             "without it (streaming or not)", param="background")
    if body.truncation not in (None, "disabled"):
        raise InvalidRequest("only 'truncation': \"disabled\" is supported; the input is "
                             "never truncated (use context_management compaction)",
                             param="truncation")


def _tool(tool: Any, where: str) -> Tool:
    if not isinstance(tool, dict):
        raise InvalidRequest(f"'{where}' must be a tool object", param=where)
    kind = tool.get("type")
    if kind != "function":
        raise InvalidRequest(f"'{where}': built-in tool type {kind!r} is not supported; only "
                             "'function' tools are", param=f"{where}.type")
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"'{where}.name' must be a non-empty string",
                             param=f"{where}.name")
    fn: dict[str, Any] = {"name": name}
    if isinstance(tool.get("description"), str):
        fn["description"] = tool["description"]
    fn["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
    return Tool(name=name, definition={"type": "function", "function": fn})


def tools_of(value: list[Any] | None) -> tuple[Tool, ...]:
    """Function tools in the chat-completions shape chat templates read."""
    return tuple(_tool(tool, f"tools[{i}]") for i, tool in enumerate(value or ()))


def tool_choice_of(value: Any) -> Any:
    """``"auto"`` (or absent), ``"none"``, ``"required"`` or
    ``{"type": "function", "name": ...}``; a built-in tool's choice is a 400."""
    if value is None:
        return "auto"
    if value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function":
        if not isinstance(value.get("name"), str):
            raise InvalidRequest("'tool_choice' must name the function: {\"type\": "
                                 "\"function\", \"name\": ...}", param="tool_choice")
        return FunctionChoice(name=value["name"])
    raise InvalidRequest("'tool_choice' must be \"auto\", \"none\", \"required\" or "
                         "{\"type\": \"function\", \"name\": ...}", param="tool_choice")


def response_of(text: dict[str, Any] | None) -> Constraint | None:
    """``text.format``: ``{"type": "text"}`` (or absent) is free text; ``{"type":
    "json_schema", "schema": ...}`` constrains the answer to the schema (``name`` and
    ``strict`` are accepted and change nothing, as on chat completions)."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    param = "text.format"
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_schema"):
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        raise InvalidRequest(f"'{param}.type' must be 'text' or 'json_schema' (got "
                             f"{kind!r})", param=f"{param}.type")
    if fmt["type"] == "text":
        return None
    schema = fmt.get("schema")
    if not isinstance(schema, (dict, bool)):
        raise InvalidRequest(f"'{param}.schema' must be a JSON schema object",
                             param=f"{param}.schema")
    return JsonSchemaConstraint.from_schema(schema)


def turn_options(body: Sampling, response: Constraint | None = None) -> TurnOptions:
    """The body's generation fields in the chat layer's names."""
    budget = reasoning_budget({k: getattr(body, k) for k in REASONING_BUDGET_ALIASES})
    return TurnOptions(
        sampling={k: getattr(body, k, None) for k in SAMPLING_DEFAULTS},
        limit=body.max_output_tokens, limit_field="max_output_tokens",
        ignore_eos=body.ignore_eos, cache_prompt=body.cache_prompt is not False,
        response=response, reasoning_budget=budget,
        return_progress=body.return_progress and bool(getattr(body, "stream", False)))


def prompt_request(body: Sampling, instructions: str | None, history: list[Message], *,
                   tools: tuple[Tool, ...] = (), tool_choice: Any = "auto") -> PromptRequest:
    """``instructions`` as the leading system message, then the history's messages."""
    lead = [Message(role="system", content=(TextPart(text=instructions),))] \
        if instructions else []
    return PromptRequest(
        messages=(*lead, *history), tools=tools, tool_choice=tool_choice,
        template_kwargs=pick_template_kwargs(body.chat_template_kwargs, body.extra_body),
        media_options=media_options(body))


def compact_threshold(value: list[Any] | None) -> int | None:
    """``context_management: [{"type": "compaction", "compact_threshold": N}]``: the
    rendered input size (tokens, 1..100000000) from which the history is compacted first."""
    threshold = None
    for i, entry in enumerate(value or ()):
        where = f"context_management[{i}]"
        if not isinstance(entry, dict) or entry.get("type") != "compaction":
            raise InvalidRequest(f"'{where}.type' must be \"compaction\"",
                                 param=f"{where}.type")
        n = entry.get("compact_threshold")
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= COMPACT_THRESHOLD_MAX:
            raise InvalidRequest(f"'{where}.compact_threshold' must be an integer from 1 to "
                                 f"{COMPACT_THRESHOLD_MAX}", param=f"{where}.compact_threshold")
        threshold = n
    return threshold

"""Structured output: a request's ``response_format`` -> the constraint its answer obeys.

The rule (the spec's table): ``text`` or no ``response_format`` is free generation;
``json_schema`` constrains every generated token to the given schema (``name`` and
``strict`` are accepted for the SDKs and change nothing); ``json_object`` is refused, as
is any other type. Compiling happens off the event loop and the engine thread
(``engine.constraints.ConstraintCompiler``); a request waits for its own compile only, so
other streams keep flowing.
"""

from __future__ import annotations

import asyncio
from typing import Any

from mlxcel.errors import InvalidRequest
from mlxcel.lazy import resolve
from mlxcel.types.constraints import Constraint, JsonSchemaConstraint

PARAM = "response_format"


def response_constraint(response_format: Any, param: str = PARAM) -> Constraint | None:
    """The constraint a ``response_format`` object asks for (None: free generation)."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise InvalidRequest(f"'{param}' must be an object with a 'type'", param=param)
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        raise InvalidRequest("'response_format' type 'json_object' is not supported; send "
                             "'json_schema' with a schema", param=f"{param}.type")
    if kind != "json_schema":
        raise InvalidRequest(f"'{param}.type' must be 'text' or 'json_schema'",
                             param=f"{param}.type")
    wrapper = response_format.get("json_schema")
    if not isinstance(wrapper, dict) or "schema" not in wrapper:
        raise InvalidRequest(f"'{param}.json_schema' must be an object with a 'schema'",
                             param=f"{param}.json_schema")
    schema = wrapper["schema"]
    if not isinstance(schema, (dict, bool)):
        raise InvalidRequest(f"'{param}.json_schema.schema' must be a JSON schema object",
                             param=f"{param}.json_schema.schema")
    return JsonSchemaConstraint.from_schema(schema)


async def compile_constraint(compiler: Any, constraint: Constraint) -> Any:
    """The compiled constraint; its checks and compile errors are 400s
    (``InvalidRequest`` subclasses), raised before the request is queued."""
    return await asyncio.wrap_future(compiler.submit(constraint))


def tool_constraint(checkpoint: Any, prompt: Any, response: Constraint | None
                    ) -> Constraint | None:
    """The output constraint of a forced ``tool_choice``: the checkpoint's tool format's
    grammar for the tools left (None: not forced, or a format without one, which gets the
    prompt's directive only). Forcing a call and constraining the answer's JSON both
    shape one output, so asking for both is refused."""
    if not prompt.forced:
        return response
    if response is not None:
        raise InvalidRequest("a forced 'tool_choice' cannot be combined with a constrained "
                             "'response_format'", param="tool_choice")
    fmt = checkpoint.tool_format
    if fmt is None or fmt.grammar is None:
        return None
    return resolve(fmt.grammar)(prompt.tools, "required")

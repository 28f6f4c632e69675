"""Structured output: a request's ``response_format`` -> the constraint its answer obeys.

The rule (the spec's table): ``text`` or no ``response_format`` is free generation;
``json_schema`` constrains every generated token to the given schema (``name`` and
``strict`` are accepted for the SDKs and change nothing); ``json_object`` is refused, as
is any other type. Compiling happens off the event loop and the engine thread
(``engine.constraints.ConstraintCompiler``); a request waits for its own compile only, so
other streams keep flowing.

llama-server's own fields ask the same way: ``grammar`` (a GBNF grammar the whole answer
matches, compiled by llguidance; "" asks for nothing) and, on ``/completion``,
``json_schema`` (a schema, as ``response_format`` gives one). A request gives at most one
of them: llama-server refuses a grammar with a schema ("Cannot use both json_schema and
grammar"), and a grammar beside ``response_format`` is refused the same way rather than
one of them dropped.
"""

from __future__ import annotations

import asyncio
from typing import Any

from mlxcel.errors import InvalidRequest
from mlxcel.lazy import resolve
from mlxcel.types.constraints import Constraint, GrammarConstraint, JsonSchemaConstraint

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


def grammar_constraint(grammar: Any, param: str = "grammar") -> Constraint | None:
    """The constraint of llama-server's ``grammar`` field (None or "": none); the
    grammar's own syntax is checked when it compiles (a 400 naming the place)."""
    if grammar is None or grammar == "":
        return None
    if not isinstance(grammar, str):
        raise InvalidRequest(f"'{param}' must be a string holding a GBNF grammar",
                             param=param)
    return GrammarConstraint(grammar=grammar)


def schema_constraint(schema: Any, param: str = "json_schema") -> Constraint | None:
    """The constraint of llama-server's ``json_schema`` field (None: none)."""
    if schema is None:
        return None
    if not isinstance(schema, (dict, bool)):
        raise InvalidRequest(f"'{param}' must be a JSON schema object", param=param)
    return JsonSchemaConstraint.from_schema(schema)


def request_constraint(response_format: Any = None, *, grammar: Any = None,
                       json_schema: Any = None, tools: bool = False) -> Constraint | None:
    """The answer's constraint from whichever structured-output field the request uses
    (module docstring); two of them at once is a 400, and so is a grammar beside
    ``tools`` (llama-server's rule: the grammar would leave no room for a call)."""
    if tools and grammar not in (None, ""):
        raise InvalidRequest("Cannot use custom grammar constraints with tools",
                             param="grammar")
    found = [(name, c) for name, c in (
        ("response_format", response_constraint(response_format)),
        ("json_schema", schema_constraint(json_schema)),
        ("grammar", grammar_constraint(grammar))) if c is not None]
    if len(found) > 1:
        names = " and ".join(f"'{name}'" for name, _ in found)
        raise InvalidRequest(f"Cannot use both {names}: give one constraint",
                             param=found[-1][0])
    return found[0][1] if found else None


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

"""What a request's output must match: a tagged union of constraint kinds.

A constraint carries its source in one canonical text, so that two requests that ask for
the same thing share one compiled index (``cache_text`` is what the compile cache hashes,
with the tokenizer's fingerprint and the backend's version). Today the one kind is a JSON
schema; a regex or grammar kind joins as another subclass with its own ``kind`` tag.
Checking a constraint's limits and compiling it are the engine's
(``mlxcel.engine.constraints``); this module only describes it.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Constraint(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """Base of every constraint kind; ``kind`` tells them apart on the wire and in logs."""

    @property
    def cache_text(self) -> str:
        """The text that identifies this constraint for the compile cache: the kind and
        the canonical source, so that equal constraints of two kinds never collide."""
        raise NotImplementedError


class JsonSchemaConstraint(Constraint, tag="json_schema"):
    """The output is one JSON value valid under ``schema``.

    ``schema`` is the schema as compact JSON text with the client's key order kept: the
    order of ``properties`` is the order the fields are generated in, so sorting keys
    would change the output. Build it with ``from_schema`` so that two spellings of one
    schema (whitespace, escapes) give one text.
    """

    schema: str

    @classmethod
    def from_schema(cls, schema: Any) -> JsonSchemaConstraint:
        """From a decoded JSON schema (an object or a boolean), re-encoded compactly."""
        return cls(schema=msgspec.json.encode(schema).decode())

    @property
    def cache_text(self) -> str:
        return f"json_schema:{self.schema}"


class WrappedJsonConstraint(Constraint, tag="wrapped_json"):
    """The output is ``prefix``, then one JSON value valid under ``schema``, then
    ``suffix``: a tool call in a format that wraps a JSON object in fixed markup (Hermes'
    ``<tool_call>``, Mistral Nemo's ``[TOOL_CALLS]``), forced by ``tool_choice``."""

    prefix: str
    schema: str
    suffix: str = ""

    @classmethod
    def around(cls, prefix: str, schema: Any, suffix: str = "") -> WrappedJsonConstraint:
        return cls(prefix=prefix, schema=msgspec.json.encode(schema).decode(), suffix=suffix)

    def json(self) -> JsonSchemaConstraint:
        """The JSON part alone (what the schema checks and limits apply to)."""
        return JsonSchemaConstraint(schema=self.schema)

    @property
    def cache_text(self) -> str:
        return "wrapped_json:" + msgspec.json.encode([self.prefix, self.schema,
                                                      self.suffix]).decode()

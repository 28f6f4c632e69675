"""What a request's output must match: a tagged union of constraint kinds.

A constraint carries its source in one canonical text, so that two requests that ask for
the same thing share one compiled index (``cache_text`` is what the compile cache hashes,
with the tokenizer's fingerprint and the backend's version). The kinds: a JSON schema
(``response_format``), a JSON schema in fixed markup (a forced call of a JSON-in-markup
tool format), a regular expression (a forced call of a format with a syntax of its own)
and a GBNF grammar (llama-server's ``grammar`` field). Checking a constraint's limits and
compiling it are the engine's (``mlxcel.engine.constraints``); this module only
describes it.

Markers: a tool format's markup is often one added token of the tokenizer (``<tool_call>``,
``[TOOL_CALLS]``, ``<|"|>``). A constraint names such texts in ``markers``; where the
tokenizer has one added token whose text is the marker, the output writes that token (the
one the model was trained to write, never the text spelled in plain pieces), and
elsewhere the marker is its text.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

MAX_MARKERS = 8
# A regex character-class body of the mark characters (``mark``): free text in a pattern
# excludes them, e.g. ``[^<\x01-\x08]``.
MARKS = "\\x01-\\x08"
_META = frozenset("\\.+*?()|[]{}^$#&-~")


def literal(text: str) -> str:
    """``text`` as a pattern that matches it alone, in the ``RegexConstraint`` syntax:
    its metacharacters escaped, control characters as ``\\xNN`` (so none reads as a
    mark), nothing else (Rust reads ``\\<`` as a word boundary)."""
    return "".join("\\n" if ch == "\n" else f"\\x{ord(ch):02X}" if ch < " "
                   else "\\" + ch if ch in _META else ch for ch in text)


def mark(i: int) -> str:
    """The character that stands for ``markers[i]`` in a ``RegexConstraint`` pattern:
    the control character U+0001 + ``i``, which no constrained output holds."""
    if not 0 <= i < MAX_MARKERS:
        raise ValueError(f"a constraint has at most {MAX_MARKERS} markers")
    return chr(1 + i)


class Constraint(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """Base of every constraint kind; ``kind`` tells them apart on the wire and in logs.
    ``subject`` names it in error messages ("the JSON schema did not compile ...")."""

    subject: ClassVar[str] = "the constraint"

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

    subject: ClassVar[str] = "the JSON schema"
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
    ``<tool_call>``, Mistral Nemo's ``[TOOL_CALLS]``), forced by ``tool_choice``.
    Each of ``markers`` (module docstring) that occurs in ``prefix`` or ``suffix`` is
    written as its token where the tokenizer has one."""

    subject: ClassVar[str] = "the JSON schema"
    prefix: str
    schema: str
    suffix: str = ""
    markers: tuple[str, ...] = ()

    @classmethod
    def around(cls, prefix: str, schema: Any, suffix: str = "",
               markers: tuple[str, ...] = ()) -> WrappedJsonConstraint:
        return cls(prefix=prefix, schema=msgspec.json.encode(schema).decode(), suffix=suffix,
                   markers=markers)

    def json(self) -> JsonSchemaConstraint:
        """The JSON part alone (what the schema checks and limits apply to)."""
        return JsonSchemaConstraint(schema=self.schema)

    @property
    def cache_text(self) -> str:
        return "wrapped_json:" + msgspec.json.encode([self.prefix, self.schema,
                                                      self.suffix, self.markers]).decode()


class RegexConstraint(Constraint, tag="regex"):
    """The output, whole, matches ``pattern``: a tool call in a format whose syntax is
    not JSON (Qwen3-Coder's XML, Gemma 4's ``call:NAME{...}``), forced by
    ``tool_choice``, built by the format's ``grammar`` from the tool schemas.

    ``pattern`` is in the syntax outlines-core reads (Rust's ``regex`` crate: ``\\<`` is
    a word boundary there, so ``<`` and ``>`` stay bare). It writes ``markers[i]``
    (module docstring) as ``mark(i)``. Free text in it must exclude the mark characters
    (``MARKS``): a class that matched them would let a marker token into the text.
    """

    subject: ClassVar[str] = "the tool-call grammar"
    pattern: str
    markers: tuple[str, ...] = ()

    @property
    def cache_text(self) -> str:
        return "regex:" + msgspec.json.encode([self.pattern, self.markers]).decode()


class GrammarConstraint(Constraint, tag="gbnf"):
    """The output, whole, is a sentence of ``grammar``: a GBNF grammar as llama-server's
    ``grammar`` field takes it (``root`` is the start rule). It compiles through a
    context-free backend (llguidance), not the regex one: GBNF is not regular."""

    subject: ClassVar[str] = "the grammar"
    grammar: str

    @property
    def cache_text(self) -> str:
        return "gbnf:" + self.grammar

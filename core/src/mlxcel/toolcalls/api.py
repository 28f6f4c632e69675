"""Tool-call format contract, v1: detect a template's format, parse an answer into calls.

A format is a ``ToolFormat`` registered through ``mlxcel_register_tool_formats``. Its
``parser`` names ``new_parser(tools) -> ToolCallParser``; one parser serves one answer.

The parser is fed the answer text in the pieces the model produced them in, with the text
of special tokens kept (``<|python_tag|>``, ``[TOOL_CALLS]``, harmony's channel tokens:
``GenerationEvent.specials``) and the token ids behind each piece. It returns typed events
(``mlxcel.types.toolcalls``): answer text, a call's start, argument fragments, its end, or
markup that does not parse. It holds back whatever the text seen so far does not settle
(a partial marker at a token boundary), so its events, merged, are the same however the
text was cut; ``finish()`` gives back what it still held and the authoritative calls of
the whole answer. ``mlxcel.testing.conformance.check_tool_format`` checks all of this.

Arguments: each call's ``arguments`` is a JSON object that names every key once; where the
model writes a parameter twice in one call, the last value is the one (unless the format
gives a repeat a meaning of its own: MiniMax M3's repeated tag is a list). A format that
writes values as bare text (GLM-4.7, LongCat-Flash, MiniMax, Qwen3-Coder) types them by
the request's tool schema, and where the schema does not settle a value every such format
reads it by one rule (``mlxcel.toolcalls.values``, which a plugin imports):

- a parameter the schema does not describe (the tool has no ``parameters``, no
  ``properties`` entry for the name, or one without a type) is the JSON value its text
  spells, surrounding whitespace aside, when that is a number, a boolean, null, an object
  or an array (Python's ``True``/``False``/``None`` and literal containers too); any
  other text, a JSON string included, is the text as written;
- ``null``, ``None``, ``NULL`` and ``Null`` are null unless the schema allows a string
  and not null (then they are that string).

``mlxcel.testing.conformance.check_text_values`` checks a bare-text format against it.

Selection: ``--tool-call-format`` names one; else the family's ``default_tool_format``;
else every installed format's ``detect(template)`` is asked, and the most specific match
wins (``specificity``: a template that writes Qwen3-Coder's ``<function=`` also contains
Hermes' ``<tool_call>``). Two matches of equal, highest specificity are an error naming
both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from mlxcel.types.toolcalls import ParseResult, ToolEvent


class ToolCallParser(Protocol):
    """One per answer; all its state lives here."""

    def feed(self, text: str, token_ids: tuple[int, ...] = ()) -> list[ToolEvent]:
        """The events ``text`` settles (``token_ids``: the tokens behind it)."""
        ...

    def finish(self) -> ParseResult:
        """At the end of the answer: the events still held, and every call, parsed from
        the whole answer (what a response reports)."""
        ...


class ToolFormat(msgspec.Struct, frozen=True, kw_only=True):
    """A tool-call wire format.

    ``detect``: takes a chat template's source, says whether the template writes this
    format. ``specificity``: breaks a tie between formats that both detect a template;
    higher wins (a format whose markers contain another's is more specific).
    ``parser``: ``"module:attr"`` naming ``new_parser(tools) -> ToolCallParser``, where
    ``tools`` are the request's function tools after ``tool_choice``
    (``mlxcel.types.messages.Tool``, each with its wire ``definition``).
    ``grammar``: optional ``"module:attr"`` naming ``grammar(tools, choice) -> Constraint |
    None``, the output constraint that forces a call when ``tool_choice`` requires one
    (``tools``: those left after ``tool_choice``, so a named choice leaves one): a
    ``WrappedJsonConstraint`` for a JSON object in fixed markup, a ``RegexConstraint``
    for a syntax of the format's own (``mlxcel.types.constraints``), or None where
    these tools cannot be forced. Every output it allows must parse, by ``parser``,
    into calls of ``tools`` with their required arguments. Its ``markers`` name the
    markup that the tokenizer may hold as added tokens (``<tool_call>``, ``<|"|>``),
    so the answer writes those tokens as the model was trained to.
    """

    name: str
    detect: Callable[[str], bool]
    parser: str
    specificity: int = 0
    grammar: str | None = None


NewParser = Callable[[tuple[Any, ...]], ToolCallParser]

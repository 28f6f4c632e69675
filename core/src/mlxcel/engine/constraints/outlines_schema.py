"""How outlines-core reads a JSON schema, and what the backend does first about it.

outlines-core (0.2.14) turns a schema object into a regex by the first of ``properties``,
``allOf``, ``anyOf``, ``oneOf``, ``prefixItems``, ``enum``, ``const``, ``$ref``, ``type`` it
holds. Where that reading would let an invalid output through, ``prepare`` changes the
schema it is handed or refuses it (400), before anything is built:

- ``allOf`` of several schemas becomes their regexes one after the other (two JSON values
  in a row): refused.
- A string's ``minLength``/``maxLength`` make outlines-core drop the string's ``pattern``
  or ``format``: the lengths are dropped instead (documented as not enforced there).
- ``date``, ``time`` and ``date-time`` become RFC 3339 patterns (outlines-core's own let
  a 40-digit year and a time without offset through).
- A property whose ``$ref`` nests deeper than the unroll depth is left out, even when it
  is required (and the comma before it stays): a schema without a ``$ref`` cycle gets the
  depth its longest chain needs (up to ``MAX_REF_CHAIN``); a recursive one unrolls
  ``UNROLL`` levels, and is refused when one of its ``$ref`` is not under an optional
  property, since the property left out at the last level could be a required one.
- Arrays repeat their item's regex twice and optional properties repeat each other, so
  the regex doubles with each level of nesting: a schema whose regex would pass
  ``MAX_REGEX_BYTES`` (estimated from the schema, never built) is refused, because
  outlines-core builds it in memory while holding the GIL.
"""

from __future__ import annotations

import json
from typing import Any

from mlxcel.engine.constraints.limits import DEFINITIONS, children, subschemas
from mlxcel.errors import ConstraintTooComplex, UnsupportedSchema

UNROLL = 3  # outlines-core's default unroll depth for a recursive $ref
MAX_REF_CHAIN = 8
MAX_REGEX_BYTES = 1 << 20
MAX_FREE_DEPTH = 8  # outlines-core's own ``depth`` keyword for free-form values
_YEAR = r"(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
_DATE = (_YEAR + r"-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
         r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-9]))")
_TIME = (r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?"
         r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])")
# ASCII digits: the regex engine's \d is Unicode
FORMAT_PATTERNS = {"date": _DATE, "time": _TIME, "date-time": f"{_DATE}T{_TIME}"}
_TOO_BIG = "the JSON schema expands to a grammar too large to compile; nest it less"


def prepare(schema: Any) -> tuple[Any, int]:
    """The schema to hand outlines-core (changed in place) and the unroll depth."""
    for node in subschemas(schema):
        all_of = node.get("allOf")
        if isinstance(all_of, list) and len(all_of) > 1:
            raise UnsupportedSchema("`allOf` with more than one schema is not supported")
        fmt = node.get("format")
        pattern = FORMAT_PATTERNS.get(fmt) if isinstance(fmt, str) else None
        if pattern is not None and "pattern" not in node:
            del node["format"]
            node["pattern"] = pattern
        if "pattern" in node or "format" in node:
            node.pop("minLength", None)
            node.pop("maxLength", None)
    chain = ref_chain(schema)
    if chain is None and ref_under_required(schema):
        raise UnsupportedSchema("a recursive JSON schema is supported only where each `$ref` "
                                "is under an optional property")
    if chain is not None and chain > MAX_REF_CHAIN:
        raise ConstraintTooComplex(f"the JSON schema nests `$ref` deeper than {MAX_REF_CHAIN}")
    depth = UNROLL if chain is None else max(UNROLL, chain - 1)
    _Estimate(schema, depth).size(schema, 0)
    return schema, depth


def resolve(root: Any, ref: Any) -> Any:
    """A local ``$ref`` (``#/...``) in ``root``, or None."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    node = root
    for part in (p for p in ref[1:].split("/") if p):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def ref_chain(root: Any) -> int | None:
    """The most ``$ref`` nested along one path from the root, or None for a cycle."""
    memo: dict[str, int | None] = {}

    def longest(node: Any, visiting: frozenset[str]) -> int | None:
        best = 0
        for sub in subschemas(node, definitions=False):
            ref = sub.get("$ref")
            if not isinstance(ref, str):
                continue
            if ref in visiting:
                return None
            if ref not in memo:
                memo[ref] = longest(resolve(root, ref), visiting | {ref})
            if memo[ref] is None:
                return None
            best = max(best, 1 + memo[ref])
        return best

    return longest(root, frozenset())


def ref_under_required(root: Any) -> bool:
    """Whether some ``$ref`` (but the root's own) is not under an optional property.
    Inside a definition, "under" counts from the definition's top: where it is used is
    not known here, so it counts as required."""
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, required = stack.pop()
        if not isinstance(node, dict):
            continue
        if "$ref" in node and required:
            return True
        names = node.get("required") if isinstance(node.get("required"), list) else []
        for key, name, child in children(node):
            if key == "properties":
                stack.append((child, name in names))
            else:
                stack.append((child, True if key in DEFINITIONS else required))
    return False


class _Estimate:
    """An upper estimate of outlines-core's regex length, mirroring how it expands each
    keyword; raises ``ConstraintTooComplex`` as soon as a part passes the bound."""

    _LEAF = {"number": 60, "integer": 30, "boolean": 12, "null": 4}
    _FREE = ({"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"})

    def __init__(self, root: Any, unroll: int) -> None:
        self.root, self.unroll = root, unroll

    def size(self, node: Any, refs: int) -> int:
        total = self._size(node, refs) if isinstance(node, dict) else 0
        if total > MAX_REGEX_BYTES:
            raise ConstraintTooComplex(_TOO_BIG)
        return total

    def _size(self, node: dict, refs: int) -> int:
        if not node:
            return self._free(2, refs) + 60
        if isinstance(node.get("properties"), dict):
            return self._properties(node, refs)
        for key in ("allOf", "anyOf", "oneOf", "prefixItems"):
            if key in node:
                items = node[key] if isinstance(node[key], list) else []
                return sum(self.size(n, refs) + 8 for n in items)
        for key in ("enum", "const"):
            if key in node:
                return 2 * len(json.dumps(node[key])) + 8
        if "$ref" in node:
            return 0 if refs > self.unroll else self.size(
                resolve(self.root, node["$ref"]), refs + 1)
        kinds = node.get("type")
        kinds = kinds if isinstance(kinds, list) else [kinds]
        return sum(self._type(k, node, refs) + 8 for k in kinds)

    def _properties(self, node: dict, refs: int) -> int:
        props = node["properties"]
        required = node.get("required") if isinstance(node.get("required"), list) else []
        costs = [len(name) + 16 + self.size(value, refs) for name, value in props.items()]
        if any(name in required for name in props):
            return sum(costs) + 8
        return sum((len(costs) - i) * (c + 8) for i, c in enumerate(costs)) + 8

    def _type(self, kind: Any, node: dict, refs: int) -> int:
        if kind == "string":
            return len(str(node.get("pattern", ""))) + (700 if "format" in node else 60)
        if kind == "array":
            items = node.get("items")
            inner = self.size(items, refs) if isinstance(items, dict) else \
                self._free(node.get("depth", 2), refs)
            return 2 * inner + 40
        if kind == "object":
            extra = node.get("additionalProperties")
            value = self.size(extra, refs) if isinstance(extra, dict) else \
                self._free(node.get("depth", 2), refs)
            return 2 * value + 200
        return self._LEAF.get(kind, 0)

    def _free(self, depth: Any, refs: int) -> int:
        """A free-form value: scalars, then objects and arrays one level less deep."""
        if not isinstance(depth, int) or depth > MAX_FREE_DEPTH:
            raise ConstraintTooComplex(_TOO_BIG)
        total = sum(self.size(n, refs) for n in self._FREE) + 200
        if depth > 0:
            total += sum(self.size({"type": k, "depth": depth - 1}, refs)
                         for k in ("object", "array"))
        return total

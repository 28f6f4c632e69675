"""The outlines-core backend: a constraint -> regex -> token index, masks per state.

A JSON schema becomes a regex through outlines-core (after ``outlines_schema`` prepares
it), a wrapped schema gets its markup around that, and a regex constraint is its own
pattern; a constraint's markers are resolved for the vocabulary by ``marks``. outlines-
core's ``Guide`` knows one EOS id and raises on ``advance(eos)``, so this module never
hands it an EOS: the matcher tracks the end itself, and every EOS id of the model is set
in the mask of an accepting state. outlines-core's error messages quote the schema, so
none of them reaches a client; each becomes a short message of this module's.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from importlib.metadata import version

import msgspec
import numpy as np
import outlines_core

from mlxcel.engine.constraints import marks
from mlxcel.engine.constraints.limits import check_json_schema, check_regex
from mlxcel.engine.constraints.matcher import GatedMatcher, set_tokens
from mlxcel.engine.constraints.outlines_schema import prepare
from mlxcel.engine.constraints.protocol import mask_words
from mlxcel.engine.constraints.vocabulary import TokenVocabulary
from mlxcel.errors import ConstraintTooComplex, UnsupportedSchema
from mlxcel.types.constraints import (
    Constraint,
    JsonSchemaConstraint,
    RegexConstraint,
    WrappedJsonConstraint,
)

# masks kept per compiled index; a state's mask is one row, so the bound is in bytes
MASK_CACHE_BYTES = 32 << 20
_FORMATS = "date, date-time, time, email, uri, uuid"
RULES_VERSION = "2"  # bump when what this backend hands outlines-core changes
VOCABULARIES = 8  # outlines-core vocabularies kept: one per set of marker tokens
ROLLBACK = 256  # states a guide keeps for ``rollback`` (a speculative row's draft)


def _build_index(regex: str, vocabulary: outlines_core.Vocabulary) -> outlines_core.Index:
    """The slow step (outlines-core releases the GIL while it builds)."""
    return outlines_core.Index(regex, vocabulary)


class OutlinesBackend:
    """Constraints through outlines-core. ``whitespace`` is the regex a JSON schema's
    optional whitespace may match (outlines-core's default ``[ ]?`` when None)."""

    name = "outlines-core"

    def __init__(self, whitespace: str | None = None) -> None:
        self.whitespace = whitespace
        self.cache_tag = f"{version('outlines-core')}:ws={whitespace!r}:rules={RULES_VERSION}"
        self._lock = threading.Lock()
        self._vocabs: OrderedDict[tuple, outlines_core.Vocabulary] = OrderedDict()

    def __getstate__(self) -> dict:
        """What a compile worker process needs (``workers``): no lock, no vocabularies."""
        return {"whitespace": self.whitespace}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["whitespace"])

    def check(self, constraint: Constraint) -> None:
        self.regex(constraint)

    def regex(self, constraint: Constraint) -> str:
        """The regex the output must match, markers as marks; every refusal is a short
        message."""
        if isinstance(constraint, RegexConstraint):
            check_regex(constraint)
            return constraint.pattern
        if isinstance(constraint, WrappedJsonConstraint):
            marks.check_markers(constraint.markers)
            return (marks.marked(constraint.prefix, constraint.markers)
                    + self.regex(constraint.json())
                    + marks.marked(constraint.suffix, constraint.markers))
        if not isinstance(constraint, JsonSchemaConstraint):
            raise UnsupportedSchema(f"constraints of kind {type(constraint).__name__} are "
                                    "not supported by the outlines-core backend")
        return self._schema_regex(constraint)

    def _schema_regex(self, constraint: JsonSchemaConstraint) -> str:
        schema, unroll = prepare(check_json_schema(constraint))
        try:
            return outlines_core.json_schema.build_regex_from_schema(
                msgspec.json.encode(schema).decode(), self.whitespace, unroll)
        except (ValueError, TypeError) as exc:
            if str(exc).startswith("Format "):
                raise UnsupportedSchema(
                    f"the JSON schema uses a string format that is not supported "
                    f"(supported: {_FORMATS})") from None
            raise UnsupportedSchema(
                "the JSON schema uses a structure or keyword that is not supported") from None

    def compile(self, constraint: Constraint, vocabulary: TokenVocabulary) -> OutlinesCompiled:
        regex, keys = marks.resolve(self.regex(constraint),
                                    getattr(constraint, "markers", ()), vocabulary.added)
        try:
            index = _build_index(regex, self.vocabulary(vocabulary, keys))
        except ValueError as exc:
            if "size limit" in str(exc):
                raise ConstraintTooComplex(
                    f"{constraint.subject} is too large to compile") from None
            if str(exc).startswith("Failed to build"):
                raise UnsupportedSchema(
                    f"{constraint.subject} is not a valid regular expression") from None
            raise UnsupportedSchema(f"no output this model's tokenizer can write matches "
                                    f"{constraint.subject}") from None
        return OutlinesCompiled(index, vocabulary)

    def dump(self, compiled: OutlinesCompiled) -> bytes:
        _loader, (data,) = compiled.index.__reduce__()
        return data

    def load(self, data: bytes, constraint: Constraint,
             vocabulary: TokenVocabulary) -> OutlinesCompiled:
        return OutlinesCompiled(outlines_core.Index.from_binary(data), vocabulary)

    def vocabulary(self, vocabulary: TokenVocabulary,
                   marked: tuple[tuple[bytes, int], ...] = ()) -> outlines_core.Vocabulary:
        """outlines-core's vocabulary for ``vocabulary`` plus the marker tokens
        ``marked`` (mark byte, token id), built once per fingerprint and markers: the
        lowest EOS id is its one EOS, the others are added to the masks."""
        key = (vocabulary.fingerprint, marked)
        with self._lock:
            built = self._vocabs.get(key)
            if built is None:
                built = self._vocabs[key] = _outlines_vocabulary(vocabulary, marked)
                if len(self._vocabs) > VOCABULARIES:
                    self._vocabs.popitem(last=False)
            self._vocabs.move_to_end(key)
            return built


def _outlines_vocabulary(vocabulary: TokenVocabulary,
                         marked: tuple[tuple[bytes, int], ...]) -> outlines_core.Vocabulary:
    if not vocabulary.eos_ids:
        raise UnsupportedSchema("constrained decoding needs a model with an end-of-sequence "
                                "token")
    keys: dict[bytes, list[int]] = {}
    for token, raw in vocabulary.tokens.items():
        if raw and not marks.holds_mark(raw):
            keys.setdefault(raw, []).append(token)
    for raw, token in marked:
        keys[raw] = [token]
    return outlines_core.Vocabulary(min(vocabulary.eos_ids), keys)


class OutlinesCompiled:
    """An outlines-core index plus the per-state mask cache its matchers share."""

    def __init__(self, index: outlines_core.Index, vocabulary: TokenVocabulary) -> None:
        self.index = index
        self.eos_ids = tuple(sorted(vocabulary.eos_ids))
        self.words = mask_words(vocabulary.size)
        self.final_states = frozenset(index.get_final_states())
        self._masks: OrderedDict[int, np.ndarray] = OrderedDict()
        self._capacity = max(1, MASK_CACHE_BYTES // (4 * self.words))

    def matcher(self, *, active: bool = True) -> OutlinesMatcher:
        return OutlinesMatcher(self, active)

    def state_mask(self, guide: outlines_core.Guide) -> np.ndarray:
        """The mask of ``guide``'s state, with every EOS id set in an accepting state;
        cached per state (least recently used beyond the byte bound)."""
        state = guide.get_state()
        mask = self._masks.get(state)
        if mask is not None:
            self._masks.move_to_end(state)
            return mask
        mask = np.zeros(self.words, np.int32)
        guide.write_mask_into(mask.ctypes.data, mask.size, 4)
        if state in self.final_states:
            set_tokens(mask, self.eos_ids)
        self._masks[state] = mask
        if len(self._masks) > self._capacity:
            self._masks.popitem(last=False)
        return mask


class OutlinesMatcher(GatedMatcher):
    """``Matcher`` over an outlines-core ``Guide``: see the protocol for the rules. It is
    ``Rewindable``: the guide keeps its last ``ROLLBACK`` states, and an accepted EOS (the
    last advance there can be) is undone by clearing ``finished``."""

    max_rollback = ROLLBACK

    def __init__(self, compiled: OutlinesCompiled, active: bool) -> None:
        super().__init__(compiled, active)
        self._guide = outlines_core.Guide(compiled.index, max_rollback=ROLLBACK)

    @property
    def accepting(self) -> bool:
        return self._active and self._guide.get_state() in self._compiled.final_states

    @property
    def state(self) -> int:
        """outlines-core's state id (its ``Index.get_transitions()`` keys)."""
        return self._guide.get_state()

    def _write_live_mask(self, row: np.ndarray, words: int) -> None:
        row[:words] = self._compiled.state_mask(self._guide)

    def _consume(self, token: int) -> bool:
        try:
            self._guide.advance(token, return_tokens=False)
        except ValueError:
            return False
        return True

    def _take_back(self, n: int) -> None:
        self._guide.rollback_state(n)

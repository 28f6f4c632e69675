"""The llguidance backend: GBNF grammars (llama-server's ``grammar`` field) through an
Earley parser, since a context-free grammar is not a regex and has no finite index.

A grammar is converted to llguidance's Lark dialect (``gbnf_to_lark``), checked against
the vocabulary in the compile worker (``workers``: the conversion is recursive Python and
the build native code, so both run there, capped and killable), and kept as that text: the
"index" this backend dumps is the converted grammar, and ``load`` builds one template
``LLMatcher`` from it off the engine thread, which each row copies (``deep_copy``). There
is no per-state table to cache: the parser computes each step's mask itself, in native
code without the GIL.

The tokens are the ``TokenVocabulary``'s bytes (``llguidance_vocabulary``), so both
backends allow the same tokens for the same text: added tokens, EOS and unknown ids are
special (never text), and EOS is allowed only where the grammar may end. llguidance's
error messages point into the grammar with a line and column, which helps the client who
wrote it, so the first line of one (bounded) is the 400's message.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from importlib.metadata import version

import llguidance
import numpy as np
from llguidance.gbnf_to_lark import GbnfToLarkError, gbnf_to_lark

from mlxcel.engine.constraints.llguidance_vocabulary import llguidance_tokenizer
from mlxcel.engine.constraints.matcher import GatedMatcher
from mlxcel.engine.constraints.protocol import mask_words
from mlxcel.engine.constraints.vocabulary import TokenVocabulary
from mlxcel.errors import ConstraintTooComplex, UnsupportedSchema
from mlxcel.types.constraints import Constraint, GrammarConstraint

MAX_GRAMMAR_BYTES = 64 * 1024  # the bound a JSON schema is held to
MESSAGE_CHARS = 240  # of a grammar error quoted back to the client
RULES_VERSION = "1"  # bump when what this backend hands llguidance changes
TOKENIZERS = 4  # llguidance tokenizers kept: one per vocabulary
PARAM = "grammar"
ROLLBACK = 256  # advances a matcher takes back at most (a speculative row's draft)


def _short(message: str) -> str:
    """The first line of an error, bounded: what the client needs to find the mistake."""
    line = next((part.strip() for part in str(message).splitlines() if part.strip()), "")
    return line[:MESSAGE_CHARS] + ("..." if len(line) > MESSAGE_CHARS else "")


class LLGuidanceBackend:
    """Grammar constraints through llguidance (``ConstraintBackend``)."""

    name = "llguidance"

    def __init__(self) -> None:
        self.cache_tag = f"{version('llguidance')}:rules={RULES_VERSION}"
        self._lock = threading.Lock()
        self._tokenizers: OrderedDict[str, llguidance.LLTokenizer] = OrderedDict()

    def __getstate__(self) -> dict:
        """What a compile worker process needs (``workers``): nothing but the class."""
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def check(self, constraint: Constraint) -> None:
        if not isinstance(constraint, GrammarConstraint):
            raise UnsupportedSchema(f"constraints of kind {type(constraint).__name__} are "
                                    "not supported by the llguidance backend")
        if len(constraint.grammar.encode()) > MAX_GRAMMAR_BYTES:
            raise ConstraintTooComplex(f"the grammar is larger than "
                                       f"{MAX_GRAMMAR_BYTES // 1024} KiB", param=PARAM)
        if not constraint.grammar.strip():
            raise UnsupportedSchema("the grammar is empty", param=PARAM)

    def lark(self, constraint: Constraint) -> str:
        """The grammar in llguidance's Lark dialect; a GBNF syntax error is a 400 that
        names where it is."""
        self.check(constraint)
        assert isinstance(constraint, GrammarConstraint)
        try:
            return gbnf_to_lark(constraint.grammar)
        except GbnfToLarkError as exc:
            raise UnsupportedSchema(f"the grammar is not valid GBNF: {_short(exc)}",
                                    param=PARAM) from None
        except RecursionError:
            raise ConstraintTooComplex("the grammar nests too deeply", param=PARAM) from None
        except Exception as exc:  # the converter's own failures on odd input
            raise UnsupportedSchema(f"the grammar is not valid GBNF: {_short(exc)}",
                                    param=PARAM) from None

    def compile(self, constraint: Constraint, vocabulary: TokenVocabulary) -> LLGuidanceCompiled:
        grammar = llguidance.LLMatcher.grammar_from_lark(self.lark(constraint))
        tokenizer = self.tokenizer(vocabulary)
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar,
                                                                                tokenizer)
        if failed:
            raise UnsupportedSchema(f"the grammar is not valid: {_short(messages[0])}",
                                    param=PARAM)
        return LLGuidanceCompiled(grammar, tokenizer, vocabulary)

    def dump(self, compiled: LLGuidanceCompiled) -> bytes:
        return compiled.grammar.encode()

    def load(self, data: bytes, constraint: Constraint,
             vocabulary: TokenVocabulary) -> LLGuidanceCompiled:
        return LLGuidanceCompiled(data.decode(), self.tokenizer(vocabulary), vocabulary)

    def tokenizer(self, vocabulary: TokenVocabulary) -> llguidance.LLTokenizer:
        """llguidance's tokenizer for ``vocabulary``, built once per fingerprint."""
        key = vocabulary.fingerprint
        with self._lock:
            built = self._tokenizers.get(key)
            if built is None:
                built = self._tokenizers[key] = llguidance_tokenizer(vocabulary)
                if len(self._tokenizers) > TOKENIZERS:
                    self._tokenizers.popitem(last=False)
            self._tokenizers.move_to_end(key)
            return built


class LLGuidanceCompiled:
    """A grammar checked for one vocabulary, and the template matcher rows copy."""

    def __init__(self, grammar: str, tokenizer: llguidance.LLTokenizer,
                 vocabulary: TokenVocabulary) -> None:
        self.grammar = grammar
        self.eos_ids = tuple(sorted(vocabulary.eos_ids))
        self.words = mask_words(vocabulary.size)
        self._template = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if self._template.is_error():
            raise UnsupportedSchema(f"the grammar is not valid: "
                                    f"{_short(self._template.get_error())}", param=PARAM)

    def matcher(self, *, active: bool = True) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self, self._template.deep_copy(), active)


class LLGuidanceMatcher(GatedMatcher):
    """``Matcher`` over an ``LLMatcher``: see the protocol for the rules. A token the
    grammar refuses leaves the parser where it was (``try_consume_tokens`` consumes only
    a valid one), so ``advance`` can answer False without breaking the row's state. It is
    ``Rewindable`` through ``LLMatcher.rollback``; an accepted EOS (never handed to the
    parser) is undone by clearing ``finished``."""

    max_rollback = ROLLBACK
    contiguous_rows = True

    def __init__(self, compiled: LLGuidanceCompiled, matcher: llguidance.LLMatcher,
                 active: bool) -> None:
        super().__init__(compiled, active)
        self._matcher = matcher

    @property
    def accepting(self) -> bool:
        return self._active and not self._matcher.is_error() and self._matcher.is_accepting()

    def _write_live_mask(self, row: np.ndarray, words: int) -> None:
        self._matcher.unsafe_compute_mask_ptr(row.ctypes.data, words * 4)

    def _consume(self, token: int) -> bool:
        return self._matcher.try_consume_tokens([token]) == 1

    def _take_back(self, n: int) -> None:
        if not self._matcher.rollback(n):
            raise RuntimeError(f"the grammar matcher could not take back {n} tokens")

"""llama-server's lazy grammar fields -> where the engine starts the grammar
(``types.requests.LazyStart``; the engine's side: ``engine.lazy_guide``).

The rules are llama-server's (``params_from_json_cmpl``):

- ``grammar_lazy: true``: the ``grammar`` constrains the answer only from a trigger on
  (the trigger's own text included); without a trigger it is a 400 ("no triggers set for
  lazy grammar"). It is read beside a ``grammar`` only: a JSON schema is never lazy.
- ``grammar_triggers``: ``[{"type", "value", "token"}]``, checked whenever given (a
  malformed one is a 400 naming it): type 0 a token (``token``, its id), 1 a word, 2 a
  pattern found anywhere in the output, 3 a pattern the whole output matches (anchored
  with ``^`` and ``$``). A word that is one token must be listed in ``preserved_tokens``
  and then triggers on that token (a 400 otherwise, as llama-server refuses it); a longer
  word is a pattern that matches it literally. Patterns are Python regular expressions.
- ``preserved_tokens``: texts; each that is one token is preserved.
"""

from __future__ import annotations

import re
from typing import Any

from mlxcel.errors import InvalidRequest
from mlxcel.types.constraints import GrammarConstraint
from mlxcel.types.requests import LazyStart

TOKEN, WORD, PATTERN, PATTERN_FULL = range(4)
PARAM = "grammar_triggers"


def lazy_start_of(body: Any, tokenizer: Any, constraint: Any) -> LazyStart | None:
    """``lazy_start`` of a request body with llama-server's three fields."""
    return lazy_start(body.grammar_lazy, body.grammar_triggers, body.preserved_tokens,
                      tokenizer, constraint)


def lazy_start(lazy: bool, triggers: Any, preserved: Any, tokenizer: Any,
               constraint: Any) -> LazyStart | None:
    """The lazy start of ``constraint`` (None: it holds from the first token)."""
    start = _triggers(triggers, _preserved(preserved, tokenizer), tokenizer)
    grammar = isinstance(constraint, GrammarConstraint)
    if not lazy or (constraint is not None and not grammar):
        return None
    if not start.patterns and not start.tokens:
        raise InvalidRequest("no triggers set for lazy grammar: 'grammar_lazy' needs "
                             "'grammar_triggers'", param=PARAM)
    return start if grammar else None


def _preserved(preserved: Any, tokenizer: Any) -> set[int]:
    if preserved is None:
        return set()
    if not isinstance(preserved, list) or not all(isinstance(t, str) for t in preserved):
        raise InvalidRequest("'preserved_tokens' must be a list of strings",
                             param="preserved_tokens")
    ids = (tokenizer.encode(text) for text in preserved)
    return {found[0] for found in ids if len(found) == 1}


def _triggers(triggers: Any, preserved: set[int], tokenizer: Any) -> LazyStart:
    if triggers is None:
        return LazyStart()
    if not isinstance(triggers, list):
        raise InvalidRequest(f"'{PARAM}' must be a list of objects", param=PARAM)
    patterns: list[str] = []
    tokens: list[int] = []
    for i, trigger in enumerate(triggers):
        kind, value, token = _fields(trigger, f"{PARAM}[{i}]", tokenizer)
        if kind == TOKEN:
            tokens.append(token)
        elif kind == WORD:
            ids = tokenizer.encode(value)
            if len(ids) == 1 and ids[0] not in preserved:
                raise InvalidRequest("Grammar trigger word should be marked as preserved "
                                     f"token: {value}", param=f"{PARAM}[{i}].value")
            if len(ids) == 1:
                tokens.append(ids[0])
            else:
                patterns.append(re.escape(value))
        else:
            patterns.append(_pattern(value, kind == PATTERN_FULL, f"{PARAM}[{i}].value"))
    return LazyStart(patterns=tuple(patterns), tokens=tuple(tokens))


def _fields(trigger: Any, where: str, tokenizer: Any) -> tuple[int, str, int]:
    """A trigger's type, value and token id, each checked."""
    if not isinstance(trigger, dict):
        raise InvalidRequest(f"'{where}' must be an object with 'type' and 'value'",
                             param=where)
    kind, value, token = trigger.get("type"), trigger.get("value"), trigger.get("token")
    if type(kind) is not int or kind not in (TOKEN, WORD, PATTERN, PATTERN_FULL):
        raise InvalidRequest(f"Unknown grammar trigger type: '{where}.type' must be 0 "
                             "(token), 1 (word), 2 (pattern) or 3 (full pattern)",
                             param=f"{where}.type")
    if not isinstance(value, str):
        raise InvalidRequest(f"'{where}.value' must be a string", param=f"{where}.value")
    if kind == TOKEN and (type(token) is not int
                          or not 0 <= token < tokenizer.vocab_size):
        raise InvalidRequest(f"'{where}.token' must be a token id of the vocabulary",
                             param=f"{where}.token")
    return kind, value, token if kind == TOKEN else -1


def _pattern(value: str, whole: bool, where: str) -> str:
    """A pattern as it is matched: type 3 anchored at both ends, as llama-server does."""
    if whole:
        value = ("" if value.startswith("^") else "^") + value + \
            ("" if value.endswith("$") and value else "$")
    try:
        re.compile(value)
    except re.error as exc:
        raise InvalidRequest(f"'{where}' is not a valid regular expression: {exc}",
                             param=where) from None
    return value

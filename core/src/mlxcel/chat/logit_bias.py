"""``logit_bias``: amounts added to chosen tokens' logits, in llama-server's forms and
OpenAI's, and ``ignore_eos`` as llama-server expresses it.

The forms, read the same on every route (llama-server reads them all on each of its own):

- ``[[token, bias], ...]``, where ``token`` is an id or a text;
- ``{"token": bias, ...}``, where a key that is a decimal integer is an id (OpenAI's form)
  and any other key a text;
- a text stands for every token it tokenizes to (without special tokens), each biased;
- ``bias`` is a number, or ``false``: the token is never produced (-inf).

llama-server skips an entry of another shape and an id outside the vocabulary; this server
refuses them (400 naming the entry), since a client that sent them would get something
other than it asked for. OpenAI's routes hold a number to OpenAI's -100..100, as OpenAI
does. Biases add up when a token is named twice (the sampler's rule, ``engine.penalties``),
and are applied before the penalties and truncation samplers, as llama.cpp's chain does.

``ignore_eos`` adds -inf for every end-of-generation id (llama-server's rule), so the model
never ends by itself rather than ending and carrying on (an output constraint's end still
ends it: ``engine.penalties``). The request's biases, those
included, are reported in ``generation_settings.logit_bias`` as llama-server writes them:
``{"bias": b, "token": id}`` in order, -inf as ``null`` (JSON has no infinity).
"""

from __future__ import annotations

import math
import re
from typing import Any

from mlxcel.errors import InvalidRequest

PARAM = "logit_bias"
OPENAI_RANGE = 100.0
NEVER = float("-inf")
_ID = re.compile(r"\s*[+-]?[0-9]+")  # a key read as an id (llama-server: strtol, whole key)

Bias = tuple[tuple[int, float], ...]


def check_openai_range(value: Any) -> None:
    """OpenAI's bound on a bias: a number from -100 to 100 (``false`` stays allowed, a
    llama-server form); the shape itself is ``parse_logit_bias``'s to check."""
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = [tuple(e) for e in value if isinstance(e, list) and len(e) == 2]
    else:
        items = []
    for key, bias in items:
        if _number(bias) and not -OPENAI_RANGE <= bias <= OPENAI_RANGE:
            raise InvalidRequest(f"'logit_bias' for {key!r} must be between "
                                 f"-{OPENAI_RANGE:g} and {OPENAI_RANGE:g}", param=PARAM)


def parse_logit_bias(value: Any, tokenizer: Any) -> Bias:
    """``(token id, bias)`` pairs of a request's ``logit_bias`` (None: none), in the
    order given, a text expanded to its tokens."""
    if value is None:
        return ()
    if isinstance(value, dict):
        entries = [(key, bias, f"{PARAM}.{key}") for key, bias in value.items()]
    elif isinstance(value, list):
        entries = []
        for i, entry in enumerate(value):
            if not isinstance(entry, list) or len(entry) != 2:
                raise InvalidRequest(f"'{PARAM}[{i}]' must be a pair [token, bias]",
                                     param=f"{PARAM}[{i}]")
            entries.append((entry[0], entry[1], f"{PARAM}[{i}]"))
    else:
        raise InvalidRequest(f"'{PARAM}' must be an object of token -> bias or a list of "
                             "[token, bias] pairs", param=PARAM)
    out: list[tuple[int, float]] = []
    for token, bias, where in entries:
        amount = _bias(bias, where)
        ids = _tokens(token, tokenizer, where, keyed=isinstance(value, dict))
        out.extend((t, amount) for t in ids)
    return tuple(out)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _bias(value: Any, where: str) -> float:
    if value is False:
        return NEVER
    if not _number(value) or not math.isfinite(value):
        raise InvalidRequest(f"'{where}' must be a finite number, or false (never)",
                             param=where)
    return float(value)


def _tokens(token: Any, tokenizer: Any, where: str, keyed: bool) -> list[int]:
    """The ids ``token`` names: an id (a decimal key in the object form), or each token
    of a text."""
    if keyed and isinstance(token, str) and _ID.fullmatch(token):
        token = int(token)
    if type(token) is int:
        if not 0 <= token < tokenizer.vocab_size:
            raise InvalidRequest(f"'{where}': token id {token} is out of vocabulary range "
                                 f"(vocab_size {tokenizer.vocab_size})", param=where)
        return [token]
    if isinstance(token, str):
        ids = tokenizer.encode(token, False)
        if not ids:
            raise InvalidRequest(f"'{where}': the text is empty", param=where)
        return ids
    raise InvalidRequest(f"'{where}': a token must be an id or a text", param=where)


def eos_bans(eos_ids: Any) -> Bias:
    """``ignore_eos``: every end-of-generation id at -inf, lowest id first."""
    return tuple((t, NEVER) for t in sorted(eos_ids))


def request_bias(value: Any, tokenizer: Any, ignore_eos: bool) -> Bias:
    """The biases a request runs with: its own, then the EOS bans of ``ignore_eos``."""
    bias = parse_logit_bias(value, tokenizer)
    return bias + eos_bans(tokenizer.eos_ids) if ignore_eos else bias


def bias_settings(bias: Bias) -> list[dict[str, Any]]:
    """``generation_settings.logit_bias``: llama-server's entries, -inf as null."""
    return [{"bias": None if b == NEVER else b, "token": t} for t, b in bias]

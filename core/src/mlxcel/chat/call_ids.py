"""Tool-call ids that the model's template accepts.

Most templates take any id. Mistral's (Nemo, Small 3.x, Ministral, Devstral) refuse one
that is not 9 alphanumeric characters (``TemplateCaps.call_ids == "alnum9"``): the ids
the server makes for such a model are 9 alphanumerics, and a client's id that does not
fit is replaced by one derived from it (a hash), so a call and its result, each carrying
the same client id, still pair, and the next turn's prompt repeats this one's.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import string
import uuid

ALPHABET = string.ascii_letters + string.digits
_ALNUM9 = re.compile(r"[A-Za-z0-9]{9}")


def new_call_id(rule: str = "any") -> str:
    """A fresh id for a call the model made, in the form ``rule`` asks for."""
    if rule == "alnum9":
        return "".join(secrets.choice(ALPHABET) for _ in range(9))
    return f"call_{uuid.uuid4().hex[:24]}"


def fits(call_id: str, rule: str) -> bool:
    return rule != "alnum9" or bool(_ALNUM9.fullmatch(call_id))


def fitted(call_id: str, rule: str) -> str:
    """``call_id`` itself when it fits ``rule``, else the same 9 alphanumerics for the
    same id, every time."""
    if fits(call_id, rule):
        return call_id
    number = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    out = []
    for _ in range(9):
        number, digit = divmod(number, len(ALPHABET))
        out.append(ALPHABET[digit])
    return "".join(out)

"""llama-server's per-request speculative fields, ``speculative.n_max`` and
``speculative.n_min``, read the same way on ``/completion``, ``/completions``,
``/v1/completions`` and ``/v1/chat/completions``.

``n_max`` caps the request's draft length and ``n_min`` is its floor (a shorter draft is
not verified); the engine applies both within ``--draft-max`` (``engine.speculative``), and
``n_max`` 0 keeps the request from drafting. As llama-server does, a floor above the cap
is lowered to it. Each must be a whole number from 0 to ``MAX_DRAFT``: llama-server clamps
a negative one silently, but a client that sends one has a bug it should hear about, so
it is the dialect's 400. ``speculative.p_min`` (the draft model's confidence floor in
llama-server) is a field this server does not read, tolerated like any unknown field.
"""

from __future__ import annotations

from typing import Any

from mlxcel.errors import InvalidRequest

MAX_DRAFT = 1024
FIELDS = (("speculative.n_max", "speculative_n_max"), ("speculative.n_min", "speculative_n_min"))


def draft_limits(body: Any) -> dict[str, int | None]:
    """``GenerationRequest``'s ``draft_max`` / ``draft_min`` from a body with
    ``GenerationFields`` (None: the server's)."""
    values = []
    for wire, attr in FIELDS:
        value = getattr(body, attr, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 0 <= value <= MAX_DRAFT):
            raise InvalidRequest(f"'{wire}' must be a whole number between 0 and {MAX_DRAFT}",
                                 param=wire)
        values.append(value)
    n_max, n_min = values
    if n_max is not None and n_min is not None:
        n_min = min(n_min, n_max)
    return {"draft_max": n_max, "draft_min": n_min}

"""Where a rendered prompt's messages end, for the prompt cache's checkpoints.

A model whose caches cannot be cut back (recurrent or sliding-window layers) reuses a
cached prompt only from a point where a checkpoint was taken, so the points must be the
ones later prompts share: the end of the system + tools prefix (every conversation and
sub-agent of an agent starts with it), the boundary before the final user turn, and the
end of the messages before the generation prompt (a next turn that re-sends the answer
differently still shares it). They come from the template itself: each is the rendering of
the first k messages, kept only where the whole prompt starts with it, so a template that
renders earlier messages differently once later ones follow gives no false boundary.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Any


def boundaries(template: Any, messages: list[dict[str, Any]], tools: Any,
               kwargs: dict[str, Any], text: str) -> list[tuple[int, str]]:
    """``(character offset in text, kind)`` of each boundary (module docstring), in order;
    kinds are ``mlxcel.types.requests.CACHE_MARKS``. A prefix the template cannot render
    (one that refuses a conversation without a user turn) is skipped."""
    lead = 0
    while lead < len(messages) and messages[lead].get("role") in ("system", "developer"):
        lead += 1
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    cuts: list[tuple[int, str]] = []
    if lead or tools:
        cuts.append((lead, "system"))
    if users and users[-1] > lead:
        cuts.append((users[-1], "turn"))
    cuts.append((len(messages), "turn"))
    out: list[tuple[int, str]] = []
    for k, kind in cuts:
        try:
            prefix = template.render(messages[:k], tools=tools, add_generation_prompt=False,
                                     **kwargs)
        except Exception:  # the template's own refusal of this prefix: no boundary here
            continue
        if prefix and len(prefix) < len(text) and text.startswith(prefix) \
                and (not out or len(prefix) > out[-1][0]):
            out.append((len(prefix), kind))
    return out


def token_positions(offsets: Sequence[tuple[int, int]], chars: Sequence[tuple[int, str]]
                    ) -> tuple[tuple[int, str], ...]:
    """The token counts at character offsets ``chars``, given each token's ``(start, end)``
    character span: the tokens that end at or before the offset, when the next one starts
    at or after it (a token across the offset gives no position)."""
    ends = [end for _, end in offsets]
    out = []
    for char, kind in chars:
        n = bisect_right(ends, char)
        if 0 < n < len(offsets) and offsets[n][0] >= char:
            out.append((n, kind))
    return tuple(out)

"""Where a rendered prompt's messages end, for the prompt cache's checkpoints.

A model whose caches cannot be cut back (recurrent or sliding-window layers) reuses a
cached prompt only from a point where a checkpoint was taken, so the points must be the
ones later prompts share: the end of the system + tools prefix (every conversation and
sub-agent of an agent starts with it), the boundary before the final user turn, and the
end of the messages before the generation prompt (a next turn that re-sends the answer
differently still shares it). They come from the template itself: each is the rendering of
the first k messages, kept only where the whole prompt starts with it, so a template that
renders earlier messages differently once later ones follow gives no false boundary.

A template that cannot render the system prompt alone (one that refuses a conversation
without a user turn) or renders the tools into the first user turn still has a prefix
every sub-agent shares: what the prompt has in common with the same conversation whose
first user message is another text (``PROBE``), up to where that message's text starts.
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
        prefix = _render(template, messages[:k], tools, kwargs)
        if prefix is None or not text.startswith(prefix):
            prefix = _shared_with_probe(template, messages, lead, tools, kwargs, text) \
                if kind == "system" else None
        if prefix and len(prefix) < len(text) and (not out or len(prefix) > out[-1][0]):
            out.append((len(prefix), kind))
    return out


PROBE = "\u2063"  # a first user message no real one starts with (invisible separator)


def _render(template: Any, messages: list[dict[str, Any]], tools: Any,
            kwargs: dict[str, Any]) -> str | None:
    try:
        return template.render(messages, tools=tools, add_generation_prompt=False, **kwargs)
    except Exception:  # the template's own refusal of these messages: no boundary here
        return None


def _shared_with_probe(template: Any, messages: list[dict[str, Any]], lead: int,
                       tools: Any, kwargs: dict[str, Any], text: str) -> str | None:
    """The prompt's prefix up to its first user message's text (module docstring)."""
    first = next((i for i in range(lead, len(messages))
                  if messages[i].get("role") == "user"), None)
    if first is None or first != lead:
        return None
    probe = _render(template, [*messages[:lead], {"role": "user", "content": PROBE}],
                    tools, kwargs)
    if probe is None:
        return None
    n = 0
    for a, b in zip(text, probe, strict=False):
        if a != b:
            break
        n += 1
    return text[:n] if probe[n:].startswith(PROBE) else None


def token_positions(offsets: Sequence[tuple[int, int]], chars: Sequence[tuple[int, str]]
                    ) -> tuple[tuple[int, str], ...]:
    """The token counts at character offsets ``chars``, given each token's ``(start, end)``
    character span: the tokens that end at or before the offset, when the next one starts
    at or after it (a token across the offset gives no position). The spans are searched,
    not copied: a long prompt has tens of thousands, and a few marks."""
    out = []
    for char, kind in chars:
        n = bisect_right(offsets, char, key=_end)
        if 0 < n < len(offsets) and offsets[n][0] >= char:
            out.append((n, kind))
    return tuple(out)


def _end(span: tuple[int, int]) -> int:
    return span[1]

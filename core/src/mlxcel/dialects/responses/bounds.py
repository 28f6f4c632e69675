"""What the Responses stores may hold: ids and ``metadata`` bounded as OpenAI bounds them
(a 400 naming the field), and items cut down to what is rendered or returned, so that
bytes a client sends but the model never sees are not kept across turns.

``slim`` keeps, per item type, the keys that ``items.messages`` and the compaction read
(and an output item's ``id`` and ``status``, which the client got back); a ``reasoning``
item that no assistant output follows is dropped, since ``items.messages`` never renders
it.
"""

from __future__ import annotations

from typing import Any

from mlxcel.errors import InvalidRequest

Item = dict[str, Any]
MAX_ID_CHARS = 128
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512
_KEYS = {
    "message": ("id", "status", "role", "content"),
    "function_call": ("id", "status", "call_id", "name", "arguments"),
    "function_call_output": ("call_id", "output"),
    "reasoning": ("id", "status", "content", "summary"),
    "compaction": ("id", "encrypted_content"),
}
_PART_KEYS = ("type", "text", "refusal", "image_url", "detail", "input_audio")


def check_id(value: str | None, param: str) -> None:
    """An id names a stored entry: at most ``MAX_ID_CHARS`` characters."""
    if value is not None and len(value) > MAX_ID_CHARS:
        raise InvalidRequest(f"'{param}' is too long (at most {MAX_ID_CHARS} characters)",
                             param=param)


def check_metadata(value: dict[str, Any] | None) -> None:
    """``metadata``: at most 16 pairs of strings, keys up to 64 characters and values up
    to 512 (OpenAI's bounds)."""
    if not value:
        return
    if len(value) > METADATA_PAIRS:
        raise InvalidRequest(f"'metadata' holds at most {METADATA_PAIRS} key-value pairs",
                             param="metadata")
    for key, item in value.items():
        if len(key) > METADATA_KEY_CHARS:
            raise InvalidRequest(f"'metadata' keys are at most {METADATA_KEY_CHARS} "
                                 "characters", param="metadata")
        if not isinstance(item, str) or len(item) > METADATA_VALUE_CHARS:
            raise InvalidRequest(f"'metadata' values are strings of at most "
                                 f"{METADATA_VALUE_CHARS} characters", param="metadata")


def _part(part: Any) -> Any:
    if not isinstance(part, dict):
        return part
    return {k: part[k] for k in _PART_KEYS if k in part}


def _item(item: Item) -> Item:
    kind = item["type"]
    out = {"type": kind, **{k: item[k] for k in _KEYS.get(kind, ()) if k in item}}
    for key in ("content", "summary", "output"):
        if isinstance(out.get(key), list):
            out[key] = [_part(p) for p in out[key]]
    return out


def _answers(item: Item) -> bool:
    """Whether a reasoning item right before ``item`` is rendered with it."""
    return item["type"] == "function_call" or (
        item["type"] == "message" and item.get("role") == "assistant")


def slim(items: list[Item], *, open_end: bool = False) -> list[Item]:
    """Normalized items as stored: rendered keys only, unrendered reasoning dropped
    (``open_end``: the items go on with an output, so trailing reasoning stays)."""
    out: list[Item] = []
    pending: list[Item] = []  # reasoning items waiting for the output they belong to
    for item in items:
        if item["type"] == "reasoning":
            pending.append(_item(item))
            continue
        if _answers(item):
            out += pending
        pending = []
        out.append(_item(item))
    return out + pending if open_end else out

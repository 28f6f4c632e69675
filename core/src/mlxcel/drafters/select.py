"""Which registered drafter the speculative flags pick.

* ``-md`` / ``--model-draft`` with a checkpoint whose ``config.json`` ``model_type`` a
  drafter lists (``Drafter.model_types``: Gemma 4's ``gemma4_assistant``) picks that
  drafter; a type only a distribution that is not installed serves (``DRAFTER_HINTS``)
  refuses to start, naming it.
* ``--draft-kind`` (``mtp``, ``dflash``) or ``--spec-type`` (``draft-mtp``,
  ``draft-dflash``) says what that checkpoint must be: a checkpoint no drafter of that
  kind serves refuses to start, and so does the kind without ``-md`` (MTP heads inside
  the target and DFlash are not served yet).
* Otherwise ``-md`` is a draft model: core's ``draft-model`` drafter.

``--spec-type none`` is no drafter from a checkpoint (``-md`` is then refused as a
contradiction); prompt lookup follows ``--prompt-lookup`` in every case without ``-md``.
"""

from __future__ import annotations

import json
from typing import Any

from mlxcel.drafters.api import Drafter
from mlxcel.errors import StartupError

# draft checkpoints' model_type -> the distribution whose drafter serves it
DRAFTER_HINTS = {"gemma4_assistant": "mlxcel-family-gemma4[mtp]"}
SPEC_KINDS = {"draft-mtp": "mtp", "draft-dflash": "dflash"}


def wanted_kind(settings: Any) -> str | None:
    """The drafter kind ``--draft-kind`` or ``--spec-type`` asks for (None: any)."""
    kind = getattr(settings, "draft_kind", None)
    spec = SPEC_KINDS.get(getattr(settings, "spec_type", None) or "")
    if kind and spec and kind != spec:
        raise StartupError(f"--draft-kind {kind} and --spec-type {settings.spec_type} "
                           "ask for different drafters")
    return kind or spec


def draft_model_type(model: str) -> str | None:
    """The draft checkpoint's ``model_type`` (None where its config has none)."""
    from mlxcel.model.loader import resolve_model_path

    try:
        config = json.loads((resolve_model_path(model) / "config.json").read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise StartupError(f"--model-draft {model}: cannot read its config.json "
                           f"({type(exc).__name__})") from exc
    value = config.get("model_type") if isinstance(config, dict) else None
    return value if isinstance(value, str) else None


def choose(settings: Any, drafters: Any) -> Drafter | None:
    """The drafter ``settings``' ``-md`` / ``--draft-kind`` / ``--spec-type`` pick from
    the registry ``drafters``; None when they pick none (prompt lookup decides)."""
    kind = wanted_kind(settings)
    model = getattr(settings, "model_draft", None)
    if getattr(settings, "spec_type", None) == "none":
        if model:
            raise StartupError("--spec-type none and -md / --model-draft contradict")
        return None
    if not model:
        if kind is None:
            return None
        what = "MTP heads inside the target" if kind == "mtp" else "DFlash drafters"
        raise StartupError(f"the {kind} drafter needs its checkpoint: -md / --model-draft "
                           f"({what} without one are not served yet)")
    model_type = draft_model_type(model)
    found = [drafters.get(name) for name in drafters
             if model_type in drafters.get(name).model_types]
    if found:
        drafter = found[0]
        if kind is not None and drafter.kind != kind:
            raise StartupError(f"--model-draft {model}: a {model_type} checkpoint drafts "
                               f"as {drafter.kind}, not {kind}")
        return drafter
    if model_type in DRAFTER_HINTS:
        raise StartupError(f"--model-draft {model}: no installed drafter serves "
                           f"{model_type} checkpoints: pip install "
                           f"'{DRAFTER_HINTS[model_type]}'")
    if kind is not None:
        raise StartupError(f"--model-draft {model}: no installed {kind} drafter serves "
                           f"model_type {model_type!r}")
    if "draft-model" not in drafters:
        raise StartupError("-md / --model-draft: the draft-model drafter is not "
                           "registered (is the drafter-builtin plugin disabled?)")
    return drafters.get("draft-model")

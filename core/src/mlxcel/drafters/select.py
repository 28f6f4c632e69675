"""Which registered drafter the speculative flags pick.

* ``-md`` / ``--model-draft`` with a checkpoint whose ``config.json`` ``model_type`` a
  drafter lists (``Drafter.model_types``: Gemma 4's ``gemma4_assistant``) picks that
  drafter; a type only a distribution that is not installed serves (``DRAFTER_HINTS``)
  refuses to start, naming it.
* ``--draft-kind`` (``mtp``, ``dflash``) or ``--spec-type`` (``draft-mtp``,
  ``draft-dflash``) says what that checkpoint must be: a checkpoint no drafter of that
  kind serves refuses to start.
* The kind without ``-md`` picks a drafter that needs no checkpoint of its own
  (``needs_model`` false: MTP heads inside the target, Qwen3.5's ``mtp.*``) whose
  ``model_types`` hold the target's ``model_type``; a target type only a distribution
  that is not installed serves (``TARGET_HINTS``) refuses, naming it, and so does any
  other target.
* Otherwise ``-md`` is a draft model: core's ``draft-model`` drafter.

``model_types`` thus name draft checkpoints for a drafter that needs a model, and targets
for one that does not; each lookup reads only its own sort, so a Qwen3.5 checkpoint given
to ``-md`` is a draft model, never the MTP heads.

A DFlash checkpoint's ``config.json`` gives the ``model_type`` of its layers (``qwen3``)
and a ``dflash_config`` beside it; its type here is ``<model_type>_dflash``, as mlx-vlm
names it (``qwen3_dflash``), so it is never taken for a draft model of that type.

``--spec-type none`` is no drafter from a checkpoint (``-md`` is then refused as a
contradiction); prompt lookup follows ``--prompt-lookup`` in every case without ``-md``.
"""

from __future__ import annotations

import json
from typing import Any

from mlxcel.drafters.api import Drafter
from mlxcel.errors import StartupError

# draft checkpoints' model_type -> the distribution whose drafter serves it
DRAFTER_HINTS = {"gemma4_assistant": "mlxcel-family-gemma4[mtp]",
                 "qwen3_dflash": "mlxcel-drafter-mtp", "gemma4_dflash": "mlxcel-drafter-mtp"}
# targets' model_type -> the distribution whose drafter reads the heads inside them
TARGET_HINTS = {t: "mlxcel-drafter-mtp" for t in ("qwen3_5", "qwen3_5_moe", "qwen3_5_text",
                                                  "qwen3_5_moe_text")}
SPEC_KINDS = {"draft-mtp": "mtp", "draft-dflash": "dflash"}


def wanted_kind(settings: Any) -> str | None:
    """The drafter kind ``--draft-kind`` or ``--spec-type`` asks for (None: any)."""
    kind = getattr(settings, "draft_kind", None)
    spec = SPEC_KINDS.get(getattr(settings, "spec_type", None) or "")
    if kind and spec and kind != spec:
        raise StartupError(f"--draft-kind {kind} and --spec-type {settings.spec_type} "
                           "ask for different drafters")
    return kind or spec


def draft_model_type(model: str, flag: str = "--model-draft") -> str | None:
    """The checkpoint's ``model_type`` (None where its config has none; a DFlash
    checkpoint's is ``<model_type>_dflash``); ``flag`` names the checkpoint in the
    refusal."""
    from mlxcel.model.loader import resolve_model_path

    try:
        config = json.loads((resolve_model_path(model) / "config.json").read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise StartupError(f"{flag} {model}: cannot read its config.json "
                           f"({type(exc).__name__})") from exc
    value = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(value, str):
        return None
    return f"{value}_dflash" if isinstance(config.get("dflash_config"), dict) else value


def in_target(settings: Any, drafters: Any, kind: str) -> Drafter:
    """The ``kind`` drafter that reads the heads inside the target (no ``-md``)."""
    target = getattr(settings, "model", None)
    model_type = draft_model_type(target, "--model") if target else None
    for name in drafters:
        drafter = drafters.get(name)
        if not drafter.needs_model and drafter.kind == kind and \
                model_type in drafter.model_types:
            return drafter
    if kind == "mtp" and model_type in TARGET_HINTS:
        raise StartupError(f"the mtp drafter: no installed drafter reads the MTP heads "
                           f"inside {model_type} targets: pip install "
                           f"'{TARGET_HINTS[model_type]}'")
    heads = "MTP" if kind == "mtp" else kind
    raise StartupError(f"the {kind} drafter needs its checkpoint: -md / --model-draft "
                       f"(no installed drafter reads {heads} heads inside the target"
                       f"{', a ' + model_type if model_type else ''})")


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
        return None if kind is None else in_target(settings, drafters, kind)
    model_type = draft_model_type(model)
    found = [drafters.get(name) for name in drafters
             if drafters.get(name).needs_model and model_type in drafters.get(name).model_types]
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

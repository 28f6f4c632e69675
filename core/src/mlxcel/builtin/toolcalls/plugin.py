"""Builtin plugin: core's own tool-call formats, registered through the same entry point
(``toolcall-builtin``) as a third party's, so ``--plugins`` and ``--disable-plugins`` treat
them alike.

This module is imported at every start-up: it and the two format tables import only
mlxcel's contract, and every parser is a ``"module:attr"`` string, imported on first use.
"""

from __future__ import annotations

from mlxcel import hookimpl
from mlxcel.builtin.toolcalls import json_formats, markup_formats


@hookimpl
def mlxcel_register_tool_formats(registry) -> None:
    for fmt in (*json_formats.FORMATS, *markup_formats.FORMATS):
        registry.add(fmt)

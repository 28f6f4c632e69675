"""Prompt rules shared by every dialect that renders a chat template."""

from __future__ import annotations

from typing import Any

from mlxcel.errors import InvalidRequest
from mlxcel.options import RESERVED_TEMPLATE_KEYS


def template_kwargs(request: dict[str, Any], server: dict[str, Any] | None) -> dict[str, Any]:
    """A request's template variables over the server's (``--chat-template-kwargs``): a
    request's key wins, a server key the request leaves out stays. Unknown keys pass to
    the template as they are, so a template that understands a new variable can use it;
    the keys the server sets for every render are refused (400)."""
    for key in sorted(RESERVED_TEMPLATE_KEYS & request.keys()):
        raise InvalidRequest(f"chat_template_kwargs.{key} is set by the server and cannot be "
                             "overridden", param=f"chat_template_kwargs.{key}")
    return {**(server or {}), **request}

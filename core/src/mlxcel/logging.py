"""structlog configuration: one JSON or console line per event, secrets redacted."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterable
from typing import Any

import structlog

REDACTED = "[redacted]"
SECRET_KEYS = frozenset({"authorization", "api_key", "x-api-key", "api-key", "apikey"})
# ``authorization: Bearer x``, ``'api_key': 'x'``, ``x-api-key=x`` ... inside free text
_SECRET_IN_TEXT = re.compile(
    r"""(?i)(\b(?:authorization|x-api-key|api[_-]?key)\b['"]?\s*[:=,]\s*\(?(?-i:b)?['"]?)"""
    r"""((?:bearer\s+)?)[^\s'",)}\][]+""")
_BEARER = re.compile(r"""(?i)(\bbearer\s+)[^\s'",)}\][]+""")


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is now (it may be swapped, e.g. by pytest)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


class Redactor:
    """A structlog processor: values under secret-named keys, the configured secrets and
    ``Bearer``/``api_key=`` tokens in any text become ``[redacted]``, so a log line (and
    the traceback text in it) never carries a credential."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def __call__(self, logger: Any, name: str, event_dict: dict) -> dict:
        return {k: self._value(k, v) for k, v in event_dict.items()}

    def _value(self, key: Any, value: Any) -> Any:
        if isinstance(key, (str, bytes)) and _is_secret_key(key):
            return REDACTED
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, bytes):
            return self.text(value.decode("latin-1"))
        if isinstance(value, dict):
            return {k: self._value(k, v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            if len(value) == 2 and isinstance(value[0], (str, bytes)) \
                    and _is_secret_key(value[0]):  # an ASGI header pair
                return (value[0], REDACTED)
            return [self._value(None, v) for v in value]
        return value

    def text(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        text = _SECRET_IN_TEXT.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
        return _BEARER.sub(lambda m: m.group(1) + REDACTED, text)


def _is_secret_key(key: str | bytes) -> bool:
    name = key.decode("latin-1") if isinstance(key, bytes) else key
    return name.lower() in SECRET_KEYS


def configure(fmt: str = "console", level: int = logging.INFO,
              secrets: Iterable[str | None] = ()) -> None:
    """Tracebacks become plain text in an ``exception`` field (no frame locals, cheap to
    render), then every field is redacted, then rendered as JSON or a console line.
    ``secrets`` (the API key) are removed wherever they appear."""
    renderer: Any = (structlog.processors.JSONRenderer() if fmt == "json"
                     else structlog.dev.ConsoleRenderer(
                         colors=sys.stderr.isatty(),
                         exception_formatter=structlog.dev.plain_traceback))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            Redactor(secrets),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,  # a later configure() (worker, tests) takes effect
    )

"""Tool-format registry and the selection rule: flag > family default > unique detect()."""

from __future__ import annotations

from mlxcel.errors import StartupError
from mlxcel.registry import Registry
from mlxcel.toolcalls.api import ToolFormat


class ToolFormatRegistry(Registry[ToolFormat]):
    def __init__(self) -> None:
        super().__init__("tool format")

    def select(self, template: str | None, *, flag: str | None = None,
               family_default: str | None = None) -> ToolFormat | None:
        if flag:
            try:
                return self.get(flag)
            except KeyError as exc:
                raise StartupError(str(exc.args[0])) from None
        if family_default and family_default in self:
            return self.get(family_default)
        if not template:
            return None
        matches = [fmt for _, fmt in self.items() if fmt.detect(template)]
        if len(matches) > 1:
            names = ", ".join(m.name for m in matches)
            raise StartupError(
                f"the chat template matches several tool-call formats ({names}); "
                "choose one explicitly"
            )
        return matches[0] if matches else None

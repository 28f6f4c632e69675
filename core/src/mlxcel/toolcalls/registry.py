"""Tool-format registry and the selection rule: flag > family default > most specific
detect()."""

from __future__ import annotations

from mlxcel.errors import StartupError
from mlxcel.registry import Registry
from mlxcel.toolcalls.api import ToolFormat


class ToolFormatRegistry(Registry[ToolFormat]):
    def __init__(self) -> None:
        super().__init__("tool format")

    def select(self, template: str | None, *, flag: str | None = None,
               family_default: str | None = None) -> ToolFormat | None:
        return self.choose(template, flag=flag, family_default=family_default)[0]

    def choose(self, template: str | None, *, flag: str | None = None,
               family_default: str | None = None) -> tuple[ToolFormat | None, str]:
        """The format and why it was picked (``mlxcel-server plugins`` shows both)."""
        if flag:
            try:
                return self.get(flag), "--tool-call-format"
            except KeyError as exc:
                raise StartupError(str(exc.args[0])) from None
        if family_default and family_default in self:
            return self.get(family_default), "the model family's default"
        if not template:
            return None, "no chat template"
        matches = sorted((fmt for _, fmt in self.items() if fmt.detect(template)),
                         key=lambda f: -f.specificity)
        if not matches:
            return None, "no installed format matches the chat template"
        if len(matches) > 1 and matches[1].specificity == matches[0].specificity:
            raise StartupError(
                f"the chat template matches the tool-call formats {matches[0].name!r} and "
                f"{matches[1].name!r} equally; choose one with --tool-call-format")
        return matches[0], "detected in the chat template"

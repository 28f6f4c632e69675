"""Family registry: by name, and which family owns a checkpoint for a task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlxcel.errors import PluginError, StartupError, UnknownModelType
from mlxcel.families.api import TASKS, Family
from mlxcel.lazy import resolve
from mlxcel.registry import Registry

# which distribution adds a task, named when no installed family serves it
TASK_DISTRIBUTIONS = {"embed": "mlxcel-family-embeddings",
                      "rerank": "mlxcel-family-embeddings",
                      "transcribe": "mlxcel-family-whisper", "speak": "mlxcel-family-kokoro"}


class FamilyRegistry(Registry[Family]):
    def __init__(self) -> None:
        super().__init__("model family")

    def add(self, item: Family) -> None:  # type: ignore[override]
        """Refuse unknown tasks, a family with no ``load`` or no task, and a model_type
        listed by two families that serve a task in common (neither would be more
        specific than the other)."""
        owner = self.current_owner
        if not item.tasks:
            raise PluginError(f"{owner}: family '{item.name}' declares no tasks")
        unknown = sorted(set(item.tasks) - set(TASKS))
        if unknown:
            raise PluginError(f"{owner}: family '{item.name}' has unknown tasks {unknown} "
                              f"(known: {', '.join(TASKS)})")
        for key, other in self.items():
            shared = set(item.model_types) & set(other.model_types)
            if shared and set(item.tasks) & set(other.tasks):
                mt = sorted(shared)[0]
                raise PluginError(
                    f"duplicate model_type '{mt}': claimed by family '{key}' "
                    f"(from '{self.owner(key)}') and by '{item.name}' (from '{owner}')")
        super().add(item)

    def serving(self, task: str) -> list[Family]:
        return [family for _, family in self.items() if task in family.tasks]

    def tasks_of(self, family: Family, path: Path, config: dict) -> tuple[str, ...]:
        """The tasks ``family`` serves for this checkpoint, in its own order."""
        if family.tasks_of is None:
            return tuple(family.tasks)
        return tuple(resolve(family.tasks_of)(path, config))

    def select(self, path: Path, config: dict, task: str | None = None) -> Family:
        """The family that owns the checkpoint ``path`` for ``task`` (``Family``'s rule).
        ``task`` None (``-m``): a family that generates claims it first, so a chat
        checkpoint is served as one; else any family that claims it."""
        if task is None:
            claimed = self._claim(path, config, self.serving("generate"))
            if claimed is not None:
                return claimed
            others = [f for _, f in self.items() if "generate" not in f.tasks]
            claimed = self._claim(path, config, others)
        else:
            claimed = self._claim(path, config, self.serving(task))
        if claimed is not None:
            return claimed
        raise UnknownModelType(self._nobody(path, config, task))

    def for_model_type(self, model_type: str, config: dict | None = None,
                       task: str = "generate") -> Family | None:
        """The family that serves ``task`` for a ``model_type`` alone (no checkpoint
        directory to look at), or None."""
        try:
            return self.select(Path("."), {**(config or {}), "model_type": model_type}, task)
        except UnknownModelType:
            return None

    def _claim(self, path: Path, config: dict, families: list[Family]) -> Family | None:
        model_type = config.get("model_type")
        listed = [f for f in families if model_type in f.model_types]
        passing = [f for f in listed if _verdict(f, path, config) is True]
        if not passing:
            passing = [f for f in families if not f.model_types and f.check is not None
                       and _verdict(f, path, config) is True]
        if len(passing) > 1:
            owners = " and ".join(f"'{f.name}' (from '{self.owner(f.name)}')" for f in passing)
            raise StartupError(f"the checkpoint {path} (model_type '{model_type}') is claimed "
                               f"by families {owners}; disable one of their plugins with "
                               "--disable-plugins")
        return passing[0] if passing else None

    def _nobody(self, path: Path, config: dict, task: str | None) -> str:
        """Why no family owns the checkpoint, with each asked family's reason."""
        model_type = config.get("model_type")
        asked = self.serving(task) if task else [f for _, f in self.items()]
        reasons = [f"{f.name}: {why}" for f in asked
                   if isinstance(why := _verdict(f, path, config), str)]
        text = f"no installed model family handles model_type '{model_type}' ({path})"
        if task and task != "generate":
            text += f" for the {task} task"
        if task in TASK_DISTRIBUTIONS and not asked:
            text += f"; install {TASK_DISTRIBUTIONS[task]} (pip install " \
                    f"{TASK_DISTRIBUTIONS[task]})"
        else:
            text += "; install the family plugin for it (mlxcel-server plugins lists what " \
                    "is installed)"
        return text + (f" [{'; '.join(reasons)}]" if reasons else "")


def _verdict(family: Family, path: Path, config: dict) -> Any:
    """``family.check``'s answer: True, or a reason (str) or False why not; no check: True
    for a type the family lists, a reason otherwise."""
    if family.check is None:
        return True if config.get("model_type") in family.model_types else \
            f"does not list model_type '{config.get('model_type')}'"
    answer = resolve(family.check)(path, config)
    return True if answer is True else (answer or "declined")

"""Build the plugin manager: block/allow -> load entry points -> check -> fill registries."""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import EntryPoint, entry_points

import msgspec
import pluggy
import structlog

from mlxcel import hookspecs
from mlxcel.dialects.registry import DialectRegistry
from mlxcel.drafters.registry import DrafterRegistry
from mlxcel.errors import PluginError, StartupError
from mlxcel.families.registry import FamilyRegistry
from mlxcel.media.registry import MediaDecoderRegistry
from mlxcel.toolcalls.registry import ToolFormatRegistry

ENTRY_POINT_GROUP = "mlxcel"
log = structlog.get_logger("mlxcel.plugins")


class PluginInfo(msgspec.Struct, kw_only=True):
    name: str
    distribution: str
    version: str
    module: str
    registers: dict[str, list[str]] = {}
    status: str = "loaded"  # loaded | disabled | failed
    error: str | None = None


class Plugins:
    """The loaded plugin set and the registries it filled."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.families = FamilyRegistry()
        self.tool_formats = ToolFormatRegistry()
        self.media_decoders = MediaDecoderRegistry()
        self.dialects = DialectRegistry()
        self.drafters = DrafterRegistry()
        self.infos: list[PluginInfo] = []


def _dist(ep: EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    return (dist.metadata["Name"], dist.version) if dist else ("?", "?")


def _split(value: str | list[str] | None) -> list[str] | None:
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else value
    return [i.strip() for i in items if i.strip()]


def load_plugins(allow: str | list[str] | None = None,
                 deny: str | list[str] | None = None) -> Plugins:
    """Load every ``mlxcel`` entry point, honouring the allow-list and deny-list."""
    allow_l, deny_l = _split(allow), _split(deny) or []
    plugins = Plugins()
    eps = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
    known = {ep.name for ep in eps}
    missing = [n for n in (allow_l or []) if n not in known]
    if missing:
        raise StartupError(
            f"--plugins names plugins that are not installed: {', '.join(missing)} "
            f"(installed: {', '.join(sorted(known)) or 'none'})"
        )
    for ep in eps:
        dist, version = _dist(ep)
        info = PluginInfo(name=ep.name, distribution=dist, version=version, module=ep.value)
        plugins.infos.append(info)
        if ep.name in deny_l or (allow_l is not None and ep.name not in allow_l):
            plugins.pm.set_blocked(ep.name)
            info.status = "disabled"
            continue
        try:
            module = importlib.import_module(ep.value.partition(":")[0])
            obj = ep.load() if ":" in ep.value else module
            plugins.pm.register(obj, name=ep.name)
        except Exception as exc:  # a broken third-party plugin must not take the server down
            info.status, info.error = "failed", f"{type(exc).__name__}: {exc}"
            if allow_l is not None:
                raise StartupError(
                    f"plugin '{ep.name}' from {dist} failed to load ({info.error}); "
                    f"reinstall it with: pip install --force-reinstall {dist}"
                ) from exc
            log.warning("plugin_failed", plugin=ep.name, distribution=dist, error=info.error)
    try:
        plugins.pm.check_pending()
    except pluggy.PluginValidationError as exc:
        name = plugins.pm.get_name(exc.plugin) or repr(exc.plugin)
        raise PluginError(f"plugin '{name}' implements an unknown hook: {exc}") from exc
    _fill_registries(plugins)
    return plugins


def _fill_registries(plugins: Plugins) -> None:
    by_name = {i.name: i for i in plugins.infos}
    for hook_name, (attr, label) in hookspecs.REGISTRY_HOOKS.items():
        registry = getattr(plugins, attr)
        for impl in getattr(plugins.pm.hook, hook_name).get_hookimpls():
            registry.current_owner = impl.plugin_name
            try:
                impl.function(registry=registry)
            except PluginError:
                raise
            except Exception as exc:
                raise PluginError(f"plugin '{impl.plugin_name}' failed in {hook_name}: {exc}") from exc
            info = by_name.get(impl.plugin_name)
            keys = registry.keys_of(impl.plugin_name)
            if info is not None and keys:
                info.registers[label] = keys


def heavy_modules_loaded() -> list[str]:
    """Heavy modules that must not be imported by entry points (used by tests)."""
    return [m for m in ("mlx", "mlx_lm", "mlx_vlm", "PIL") if m in sys.modules]

"""mlxcel-server: flags with llama-server env twins; starts Granian (one worker)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import msgspec

from mlxcel.errors import PluginError, StartupError, UnknownModelType
from mlxcel.options import OPTIONS, build_parser  # noqa: F401  (OPTIONS re-exported)
from mlxcel.settings import SETTINGS_ENV, Settings


def _fail(message: str) -> int:
    print(f"mlxcel-server: error: {message}", file=sys.stderr)
    return 2


def list_plugins(argv: Sequence[str]) -> int:
    from mlxcel.plugins import load_plugins

    parser = argparse.ArgumentParser(prog="mlxcel-server plugins")
    parser.add_argument("--plugins", default=os.environ.get("MLXCEL_PLUGINS") or None)
    parser.add_argument("--disable-plugins",
                        default=os.environ.get("MLXCEL_DISABLE_PLUGINS") or None)
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    from mlxcel.logging import configure

    configure()  # warnings go to stderr, so --json output stays pure JSON
    plugins = load_plugins(args.plugins, args.disable_plugins)
    if args.json:
        print(msgspec.json.encode(plugins.infos).decode())
        return 0
    for info in plugins.infos:
        regs = "; ".join(f"{k}: {', '.join(v)}" for k, v in info.registers.items()) or "-"
        status = "" if info.status == "loaded" else f" [{info.status}]"
        print(f"{info.name}{status}  {info.distribution} {info.version}  {regs}")
        if info.error:
            print(f"    error: {info.error}")
    return 0


def _prepare_model(settings: Settings) -> Settings:
    """Resolve --demo / --model to a local directory and check it before serving."""
    from mlxcel.engine.loader import check_checkpoint, resolve_model_path
    from mlxcel.plugins import load_plugins

    plugins = load_plugins(settings.plugins, settings.disable_plugins)
    if settings.demo and not settings.model:
        from mlxcel.testing.checkpoint import demo_checkpoint

        print("mlxcel-server: DEMO MODE - serving a tiny checkpoint with RANDOM weights; "
              "its output is random text. Pass --model to serve a real model.",
              file=sys.stderr)
        path = demo_checkpoint()
        return msgspec.structs.replace(settings, model=str(path),
                                       alias=settings.alias or "mlxcel-demo")
    if not settings.model:
        raise StartupError("no model given: pass --model PATH_OR_HF_ID (or --demo)")
    path = resolve_model_path(settings.model)
    try:
        check_checkpoint(path, plugins.families, settings.chat_template_file)
    except UnknownModelType as exc:  # perhaps the family that handles it failed to import
        failed = [f"{i.name} ({i.distribution}: {i.error}; reinstall it with "
                  f"pip install --force-reinstall {i.distribution})"
                  for i in plugins.infos if i.status == "failed"]
        if failed:
            raise StartupError(f"{exc}; plugins that failed to load: {'; '.join(failed)}") from exc
        raise
    alias = settings.alias or settings.model.rstrip("/").split("/")[-1]
    return msgspec.structs.replace(settings, model=str(path), alias=alias)


def serve(settings: Settings) -> int:
    from granian import Granian
    from granian.constants import Interfaces

    os.environ[SETTINGS_ENV] = settings.to_env()
    Granian("mlxcel.app:app_from_env", address=settings.host, port=settings.port,
            interface=Interfaces.ASGI, workers=1, factory=True, log_access=False,
            log_level="warning").serve()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["plugins"]:
            return list_plugins(argv[1:])
        args = build_parser().parse_args(argv)
        settings = Settings(**vars(args))
        for name in ("parallel", "prefill_chunk_size", "max_queue_depth"):
            if getattr(settings, name) < 1:
                raise StartupError(f"--{name.replace('_', '-')} must be >= 1")
        from mlxcel.logging import configure

        configure(settings.log_format)
        return serve(_prepare_model(settings))
    except (StartupError, PluginError) as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

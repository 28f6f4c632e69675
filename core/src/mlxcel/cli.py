"""mlxcel-server: flags with llama-server env twins; starts Granian (one worker)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import msgspec

from mlxcel import __version__
from mlxcel.errors import PluginError, StartupError, UnknownModelType
from mlxcel.settings import SETTINGS_ENV, Settings

# (flags, dest, type, default, env twin, help)
OPTIONS: list[tuple[tuple[str, ...], str, Any, Any, str, str]] = [
    (("-m", "--model"), "model", str, None, "LLAMA_ARG_MODEL",
     "model directory or Hugging Face id (org/name)"),
    (("-a", "--alias"), "alias", str, None, "LLAMA_ARG_ALIAS",
     "model name reported by the API (default: the model's folder name)"),
    (("--host",), "host", str, "127.0.0.1", "LLAMA_ARG_HOST", "address to listen on"),
    (("--port",), "port", int, 8080, "LLAMA_ARG_PORT", "port to listen on"),
    (("--api-key",), "api_key", str, None, "LLAMA_API_KEY",
     "require this key (Authorization: Bearer <key>) on every route but /health and /"),
    (("-c", "--ctx-size"), "ctx_size", int, 0, "LLAMA_ARG_CTX_SIZE",
     "context size in tokens, split over the slots; 0 = the model's own"),
    (("-np", "--parallel"), "parallel", int, 4, "LLAMA_ARG_N_PARALLEL",
     "number of sequences generated at once (slots)"),
    (("-n", "--n-predict"), "n_predict", int, -1, "LLAMA_ARG_N_PREDICT",
     "default max tokens when a request sets none; -1 = until the context is full"),
    (("--chat-template-file",), "chat_template_file", str, None,
     "LLAMA_ARG_CHAT_TEMPLATE_FILE", "Jinja chat template to use instead of the model's"),
    (("--log-format",), "log_format", str, "console", "MLXCEL_LOG_FORMAT",
     "log line format: json or console"),
    (("--plugins",), "plugins", str, None, "MLXCEL_PLUGINS",
     "comma-separated allow-list of plugin names to load (default: all installed)"),
    (("--disable-plugins",), "disable_plugins", str, None, "MLXCEL_DISABLE_PLUGINS",
     "comma-separated plugin names not to load"),
]
TRUE = {"1", "true", "yes", "on"}


def _env_default(env: str, type_: Any, default: Any) -> Any:
    raw = os.environ.get(env)
    if raw is None or raw == "":
        return default
    try:
        return type_(raw)
    except ValueError:
        raise StartupError(
            f"environment variable {env}={raw!r} is not a valid {type_.__name__}") from None


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every default, except a secret taken from the environment."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.dest == "api_key":
            return f"{action.help} (default: none)"
        return super()._get_help_string(action) or ""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlxcel-server",
        description="LLM inference server on MLX. `mlxcel-server plugins` lists plugins.",
        formatter_class=_HelpFormatter)
    for flags, dest, type_, default, env, help_ in OPTIONS:
        kwargs: dict[str, Any] = {"dest": dest, "type": type_,
                                  "default": _env_default(env, type_, default),
                                  "help": f"{help_} [env: {env}]"}
        if dest == "log_format":
            kwargs["choices"] = ["json", "console"]
        parser.add_argument(*flags, **kwargs)
    parser.add_argument("--demo", action="store_true",
                        default=os.environ.get("MLXCEL_DEMO", "").lower() in TRUE,
                        help="serve a tiny random-weight checkpoint built offline; its output "
                             "is random text [env: MLXCEL_DEMO]")
    parser.add_argument("--version", action="version", version=f"mlxcel {__version__}")
    return parser


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
        if settings.parallel < 1:
            raise StartupError("--parallel must be >= 1")
        from mlxcel.logging import configure

        configure(settings.log_format)
        return serve(_prepare_model(settings))
    except (StartupError, PluginError) as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""mlxcel-server: flags with llama-server env twins; starts Granian (one worker).

``mlxcel-server plugins`` lists plugins; ``mlxcel-server launch ... -- <server args>`` starts
the ranks of a ``--distributed`` server with MLX's launcher (``mlxcel.engine.distributed``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import msgspec
import structlog

from mlxcel.errors import PluginError, StartupError, UnknownModelType
from mlxcel.options import (  # noqa: F401 (OPTIONS re-exported)
    OPTIONS,
    build_parser,
    env_default,
    ignored_notes,
)
from mlxcel.settings import SIDE_FLAGS, Settings


def _fail(message: str) -> int:
    print(f"mlxcel-server: error: {message}", file=sys.stderr)
    return 2


def list_plugins(argv: Sequence[str]) -> int:
    """``mlxcel-server plugins``: every plugin, then the tool formats by specificity, and
    with ``--model`` the format that model would get and why (what the server logs as
    ``tool_format_selected``) and its chat template's capabilities
    (``chat_template_caps``), so both can be checked before serving."""
    from mlxcel.plugins import load_plugins

    parser = argparse.ArgumentParser(prog="mlxcel-server plugins")
    parser.add_argument("--plugins", default=env_default("plugins"))
    parser.add_argument("--disable-plugins", default=env_default("disable_plugins"))
    parser.add_argument("-m", "--model", help="show the tool format this model would get")
    parser.add_argument("--chat-template-file", default=env_default("chat_template_file"))
    parser.add_argument("--chat-template", default=env_default("chat_template"))
    parser.add_argument("--tool-call-format", default=env_default("tool_call_format"))
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    from mlxcel.logging import configure

    configure()  # warnings go to stderr, so --json output stays pure JSON
    plugins = load_plugins(args.plugins, args.disable_plugins)
    if args.json:
        print(msgspec.json.encode(plugins.infos).decode())
        return 0
    formats = _tool_format_lines(plugins, args)  # before any output: it may fail
    for info in plugins.infos:
        regs = "; ".join(f"{k}: {', '.join(v)}" for k, v in info.registers.items()) or "-"
        status = "" if info.status == "loaded" else f" [{info.status}]"
        print(f"{info.name}{status}  {info.distribution} {info.version}  {regs}")
        if info.error:
            print(f"    error: {info.error}")
    for line in formats:
        print(line)
    return 0


def _tool_format_lines(plugins: Any, args: argparse.Namespace) -> list[str]:
    """The installed tool formats, most specific first; with ``--model``, its pick."""
    from mlxcel.model.loader import (
        check_checkpoint,
        check_task_model,
        resolve_model_path,
        served_task,
    )

    formats = sorted((fmt for _, fmt in plugins.tool_formats.items()),
                     key=lambda f: (-f.specificity, f.name))
    lines = [f"  {f.name}  specificity {f.specificity}  from "
             f"{plugins.tool_formats.owner(f.name)}" for f in formats]
    lines = ["tool formats, most specific first:", *lines] if lines \
        else ["tool formats: none installed"]
    if args.model:
        task = served_task(str(resolve_model_path(args.model)), plugins.families)
        if task != "generate":  # a side model: no template, no tool format
            family, _ = check_task_model(str(resolve_model_path(args.model)),
                                         plugins.families, task)
            lines.append(f"{args.model}: task {task} (family {family.name})")
            return lines
        family, picked, why, template = check_checkpoint(
            resolve_model_path(args.model), plugins.families, args.chat_template_file,
            tool_formats=plugins.tool_formats, tool_call_format=args.tool_call_format,
            chat_template=args.chat_template)
        lines.append(f"tool format for {args.model}: {picked.name if picked else 'none'} "
                     f"({why}; family {family.name})")
        caps = " ".join(f"{k}={v}" for k, v in template.caps.summary().items())
        lines.append(f"chat template caps for {args.model} ({template.origin}): {caps}")
    return lines


def _build_demo_checkpoint() -> str:
    """Build (or reuse) the demo checkpoint in a child process: this process must not
    initialise MLX (on CUDA, a device initialised before Granian forks is unusable)."""
    import subprocess

    code = "from mlxcel.testing.checkpoint import demo_checkpoint; print(demo_checkpoint())"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["unknown error"])[-1]
        raise StartupError(f"could not build the demo checkpoint: {tail}")
    return proc.stdout.strip().splitlines()[-1]


def _prepare_model(settings: Settings) -> Settings:
    """Resolve --demo / --model and the side models to local directories and check them
    before serving (the chat model's tool format too, so an unknown --tool-call-format or a
    tie is one line, pre-fork)."""
    from mlxcel.plugins import load_plugins

    plugins = load_plugins(settings.plugins, settings.disable_plugins)
    settings = _prepare_sides(settings, plugins)
    if settings.demo and not settings.model:
        print("mlxcel-server: DEMO MODE - serving a tiny checkpoint with RANDOM weights; "
              "its output is random text. Pass --model to serve a real model.",
              file=sys.stderr)
        path = _build_demo_checkpoint()
        return msgspec.structs.replace(settings, model=str(path),
                                       alias=settings.alias or "mlxcel-demo")
    if not settings.model:
        if any(getattr(settings, field) for _, field in SIDE_FLAGS):
            return settings
        raise StartupError("no model given: pass --model PATH_OR_HF_ID (or --demo, "
                           "--embedding-model, --reranker-model, --stt-model, --tts-model)")
    path = _check_main_model(settings, plugins)
    alias = settings.alias or settings.model.rstrip("/").split("/")[-1]
    return msgspec.structs.replace(settings, model=str(path), alias=alias)


def _check_main_model(settings: Settings, plugins: Any) -> Any:
    """``-m``'s directory, checked for the task it will serve: a chat checkpoint with its
    template and tool format, or a side model (an embedder) for its family."""
    from mlxcel.model.loader import (
        check_checkpoint,
        check_task_model,
        resolve_model_path,
        served_task,
    )
    from mlxcel.settings import MODES

    path = resolve_model_path(settings.model)
    modes = [task for task, toggle in MODES.items() if getattr(settings, toggle)]
    try:
        task = modes[0] if modes else served_task(str(path), plugins.families)
        if task != "generate":
            check_task_model(str(path), plugins.families, task)
            return path
        check_checkpoint(path, plugins.families, settings.chat_template_file,
                         tool_formats=plugins.tool_formats,
                         tool_call_format=settings.tool_call_format,
                         chat_template=settings.chat_template, jinja=settings.jinja)
    except UnknownModelType as exc:  # perhaps the family that handles it failed to import
        failed = [f"{i.name} ({i.distribution}: {i.error}; reinstall it with "
                  f"pip install --force-reinstall {i.distribution})"
                  for i in plugins.infos if i.status == "failed"]
        if failed:
            raise StartupError(f"{exc}; plugins that failed to load: {'; '.join(failed)}") from exc
        raise
    return path


def _prepare_sides(settings: Settings, plugins: Any) -> Settings:
    """The side models' flags (``engines.SIDE_FLAGS``) resolved to local directories and
    checked for their task (one line naming the model and the distribution to install)."""
    from mlxcel.model.loader import check_task_model, resolve_model_path

    changes = {}
    for task, field in SIDE_FLAGS:
        model = getattr(settings, field)
        if model:
            path = str(resolve_model_path(model))
            check_task_model(path, plugins.families, task)
            changes[field] = path
    return msgspec.structs.replace(settings, **changes) if changes else settings


POSITIVE = ("parallel", "prefill_chunk_size", "max_queue_depth", "max_connections",
            "idle_timeout", "body_timeout", "timeout", "shutdown_timeout",
            "grammar_compile_timeout", "distributed_timeout", "embedding_batch_size",
            "embedding_queue_depth", "embedding_request_timeout_secs", "rerank_batch_size",
            "audio_queue_depth", "audio_request_timeout_secs")


def check_limits(settings: Settings) -> None:
    """Counts and timeouts must be positive and ports valid: a zero timeout would close
    every connection (or none), so it refuses to start instead."""
    for name in POSITIVE:
        if not getattr(settings, name) > 0:
            raise StartupError(f"--{name.replace('_', '-')} must be > 0")
    if not 1 <= settings.port <= 65535:
        raise StartupError(f"--port must be between 1 and 65535, not {settings.port}")
    if not 0 <= settings.metrics_port <= 65535:
        raise StartupError(f"--metrics-port must be between 0 and 65535, not "
                           f"{settings.metrics_port}")
    if settings.batch_size is not None and settings.batch_size <= 0:
        raise StartupError("--batch-size must be > 0")
    for name in ("cache_checkpoint_interval", "ctx_checkpoints"):
        if getattr(settings, name) < 0:
            raise StartupError(f"--{name.replace('_', '-')} must be >= 0")
    if settings.threads_http == 0 or settings.threads_http < -1:
        raise StartupError("--threads-http must be > 0, or -1 for one thread")
    if settings.image_model:
        raise StartupError("--image-model (MLXCEL_IMAGE_MODEL): the images API is not built "
                           "yet; start without it (/v1/images/* answer 501)")


def read_api_key(settings: Settings) -> Settings:
    """--api-key-file: one key per line, as llama-server reads it (stripped; blank lines
    and lines starting with # skipped); it may not be combined with --api-key
    (LLAMA_API_KEY), since one of them would be silently ignored. A key option given
    with no key in it (``""``, ``","``) is refused: it would turn auth off silently."""
    if settings.api_key_file == "":
        raise StartupError("--api-key-file names no file")
    if settings.api_key_file is None:
        if settings.api_key is not None and not settings.api_keys():
            raise StartupError("--api-key (LLAMA_API_KEY) holds no key; leave it unset "
                               "to serve without auth")
        return settings
    if settings.api_key is not None:
        raise StartupError("give either --api-key (LLAMA_API_KEY) or --api-key-file "
                           "(LLAMA_ARG_API_KEY_FILE), not both")
    try:
        with open(settings.api_key_file, encoding="utf-8-sig") as fh:  # BOM: not key
            lines = [line.strip() for line in fh]
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise StartupError(f"cannot read --api-key-file {settings.api_key_file}: "
                           f"{reason}") from None
    keys = [line for line in lines if line and not line.startswith("#")]
    if not keys or any("," in key for key in keys):
        raise StartupError(f"--api-key-file {settings.api_key_file}: "
                           + ("a key may not hold a comma" if keys else "it holds no key"))
    return msgspec.structs.replace(settings, api_key=",".join(keys))


def _follower_rank() -> bool:
    """Whether the launcher made this process a rank other than 0 (it serves no HTTP)."""
    from mlxcel.engine.distributed.launcher import launcher_rank

    return launcher_rank() != 0


def check_launched_args(server_args: list[str]) -> None:
    """The ranks must be told to split the model: ``--distributed`` (or its env twin)."""
    if build_parser().parse_args(server_args).distributed == "off":
        raise StartupError("mlxcel-server launch: the server's arguments (after --) must set "
                           "--distributed tensor or --distributed pipeline")


def follow(settings: Settings) -> int:
    """A follower rank's process (the launcher's rank is not 0): load this rank's shard,
    agree with rank 0, then replay its messages until it stops. It serves no HTTP."""
    from mlxcel.engine.config import EngineConfig
    from mlxcel.engine.distributed.watchdog import exit_follower
    from mlxcel.engine.worker import EngineWorker
    from mlxcel.model.loader import checkpoint_loader
    from mlxcel.plugins import load_plugins

    settings = msgspec.structs.replace(settings, engine_trace=None)  # rank 0's file
    plugins = load_plugins(settings.plugins, settings.disable_plugins)
    worker = EngineWorker(checkpoint_loader(settings, plugins), settings.parallel,
                          settings.prefill_chunk(), config=EngineConfig.from_settings(settings))
    if not worker.setup():
        raise StartupError(f"the model failed to load: {worker.error}")
    try:
        return worker.dist.serve()
    except Exception as exc:
        exit_follower(f"{type(exc).__name__}: {exc}")
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """The ``mlxcel-server`` entry point; ``argv`` given = called in-process (no re-exec)."""
    as_program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["plugins"]:
            return list_plugins(argv[1:])
        if argv[:1] == ["launch"]:
            from mlxcel.engine.distributed.launcher import launch

            return launch(argv[1:], check_launched_args)
        args = build_parser().parse_args(argv)
        settings = read_api_key(Settings(**vars(args)))
        check_limits(settings)
        from mlxcel.backend import keep_kernel_cache, maybe_reexec
        from mlxcel.chat.request import check_server_settings

        check_server_settings(settings)  # the sampling flags follow the request rules
        if as_program:  # on Linux CPU, restart once with OpenBLAS preloaded (mlxcel.backend)
            maybe_reexec(argv, no_fast_blas=settings.no_fast_blas)
            keep_kernel_cache()  # CUDA: compiled kernels outlive a reboot
        from mlxcel.logging import configure
        from mlxcel.serving import check_fd_hard_limit, check_listens, serve

        configure(settings.log_format, secrets=[settings.api_key, *settings.api_keys()])
        if notes := ignored_notes(settings):  # one line for every llama-server flag ignored
            structlog.get_logger("mlxcel.cli").warning("flags_ignored", flags=notes)
        check_fd_hard_limit()
        if settings.distributed != "off" and _follower_rank():  # no HTTP: a follower
            return follow(_prepare_model(settings))
        address = check_listens(settings.hosts(), settings.port)
        settings = msgspec.structs.replace(settings, host=address)
        return serve(_prepare_model(settings))
    except (StartupError, PluginError) as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""Find a checkpoint (local dir or Hugging Face id) and load model, tokenizer, template."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import structlog

from mlxcel import backend
from mlxcel.errors import StartupError
from mlxcel.families.api import Family, Loaded, LoadOptions, ReasoningSpec
from mlxcel.families.registry import FamilyRegistry
from mlxcel.families.tasks import TaskOptions
from mlxcel.lazy import resolve
from mlxcel.model import reasoning
from mlxcel.model.chat_template import ChatTemplate, load_chat_template
from mlxcel.model.tokenizer import Tokenizer
from mlxcel.toolcalls.api import ToolFormat
from mlxcel.toolcalls.registry import ToolFormatRegistry

log = structlog.get_logger("mlxcel.loader")
# weights.npz: older MLX speech repos (mlx-community/whisper-*) have only that
ALLOW_PATTERNS = ["*.json", "*.safetensors", "weights.npz", "*.jinja", "tokenizer.model",
                  "*.txt", "*.py"]
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p")
# model_type -> the distribution whose family adds its tool format and reasoning; named in
# the log when a family that only accepts the type (core's generic one) serves it instead.
FAMILY_HINTS = {"gemma4": "mlxcel-family-gemma4", "gemma4_text": "mlxcel-family-gemma4"}


class GenerationDefaults(msgspec.Struct, frozen=True, kw_only=True):
    """Defaults from the checkpoint's generation_config.json (None = not set there)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    eos_token_ids: tuple[int, ...] = ()


class LoadedCheckpoint(msgspec.Struct, kw_only=True):
    path: Path
    family: Family
    model: Any
    config: dict
    tokenizer: Tokenizer
    template: ChatTemplate
    defaults: GenerationDefaults
    context_length: int
    dtype: str = "unknown"  # floating dtype the model computes in (after --dtype)
    device: str = "cpu"  # MLX's default device: cpu or gpu
    blas: str = "none"  # BLAS behind MLX's CPU matmuls (see mlxcel.backend.blas_in_use)
    processor: Any = None  # the family's (a vision-language model's image processor, ...)
    tool_format: ToolFormat | None = None  # what parses answers' tool calls (None: nothing)
    tool_format_reason: str = "no tool formats given"  # why that one (select_tool_format)
    reasoning: ReasoningSpec | None = None  # how answers mark reasoning (chat.reasoning)
    reasoning_reason: str = "no reasoning markers in the chat template"
    reasoning_format: str = "auto"  # --reasoning-format


def _looks_like_hf_id(model: str) -> bool:
    parts = model.split("/")
    return len(parts) == 2 and all(parts) and not model.startswith((".", "~", "/"))


def resolve_model_path(model: str) -> Path:
    """A local directory as is; otherwise a Hugging Face id, downloaded into the HF cache."""
    local = Path(model).expanduser()
    if local.exists():
        if not (local / "config.json").is_file():
            raise StartupError(f"{local} is not a model directory (no config.json)")
        return local
    if not _looks_like_hf_id(model):
        raise StartupError(f"model not found: '{model}' is neither a directory nor a "
                           "Hugging Face id (org/name)")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(model, allow_patterns=ALLOW_PATTERNS))
    except Exception as exc:  # offline, no such repo, gated, network down ...
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        from huggingface_hub import constants

        offline = bool(constants.HF_HUB_OFFLINE)
        hint = "HF_HUB_OFFLINE is set and it is not in the local cache" if offline else reason
        raise StartupError(f"cannot get model '{model}' from Hugging Face: {hint[:300]}") from exc


def _read_json(path: Path) -> dict:
    """A checkpoint's JSON file as a dict ({} when absent); anything else is a StartupError,
    so a malformed checkpoint is one line at startup rather than a traceback."""
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except (OSError, ValueError) as exc:
        raise StartupError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise StartupError(f"{path} is not a JSON object (found a {type(data).__name__})")
    return data


def _ids(value: Any) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,)
    return tuple(v for v in value if isinstance(v, int)) if isinstance(value, list) else ()


def generation_defaults(path: Path, config: dict) -> GenerationDefaults:
    gen = _read_json(path / "generation_config.json")
    eos = _ids(gen.get("eos_token_id")) or _ids(config.get("eos_token_id"))
    values = {k: gen[k] for k in SAMPLING_KEYS if isinstance(gen.get(k), (int, float))}
    if "top_k" in values:
        values["top_k"] = int(values["top_k"])
    return GenerationDefaults(eos_token_ids=eos, **values)


def select_family(families: FamilyRegistry, config: dict, path: Path,
                  task: str | None = "generate") -> Family:
    """The family that owns the checkpoint for ``task`` (``FamilyRegistry.select``)."""
    return families.select(path, config, task)


VISION_HINT = "mlxcel-family-vlm"


def vision_hint(config: dict, family: Family) -> str | None:
    """The distribution to install when a checkpoint with a vision tower (``vision_config``)
    is served by a family that does not name its type: it then loads as text only."""
    model_type = config.get("model_type")
    if "vision_config" not in config or model_type in family.model_types:
        return None
    return FAMILY_HINTS.get(model_type, VISION_HINT)


def family_hint(model_type: Any, family: Family) -> str | None:
    """The distribution to install for ``model_type`` (``FAMILY_HINTS``) when ``family``
    does not name the type, so a user whose checkpoint loads without its tool format or
    reasoning learns what adds them; None when the family names it or no hint exists."""
    if not isinstance(model_type, str) or model_type in family.model_types:
        return None
    return FAMILY_HINTS.get(model_type)


GENERIC = "generic_json"  # the builtin format of llama-server's generic JSON calls


def select_tool_format(formats: ToolFormatRegistry, family: Family, template: ChatTemplate,
                       flag: str | None = None) -> tuple[ToolFormat | None, str]:
    """The tool format of a checkpoint and why: ``--tool-call-format``, else the family's
    default, else the most specific format its chat template shows (a tie or an unknown
    name is a ``StartupError``), else, for a template that renders no tool calls, generic
    JSON: the chat layer shows such a model its calls in llama-server's generic shape
    (``mlxcel.chat.adapt``), which that format reads back. Chosen once per model, so
    every answer parses alike."""
    try:
        picked = formats.choose(template.source, flag=flag,
                                family_default=family.default_tool_format)
    except StartupError as exc:
        raise StartupError(f"--tool-call-format {flag}: {exc}" if flag else str(exc)) from None
    if picked[0] is None and GENERIC in formats and not template.caps.tool_calls:
        return formats.get(GENERIC), "the chat template renders no tool calls: generic JSON"
    return picked


def load_checkpoint(model: str, families: FamilyRegistry, *,
                    chat_template_file: str | None = None, dtype: str | None = None,
                    tool_formats: ToolFormatRegistry | None = None,
                    tool_call_format: str | None = None, chat_template: str | None = None,
                    jinja: bool = True, reasoning_format: str = "auto",
                    distributed: str = "off", distributed_backend: str = "any",
                    ) -> LoadedCheckpoint:
    """Load ``model``; ``dtype`` is --dtype (None: auto); ``tool_formats`` (the installed
    ones) and ``tool_call_format`` (the flag) select its tool format; ``chat_template`` and
    ``jinja`` are --chat-template and --jinja (``mlxcel.model.chat_template``), and
    ``reasoning_format`` (--reasoning-format) says whether its reasoning is split off;
    ``distributed`` (--distributed tensor|pipeline) loads it lazily and shards it over
    the launcher's ranks (``mlxcel.engine.distributed``)."""
    started = time.perf_counter()
    requested = dtype or "auto"
    device = backend.mlx_device()
    blas = backend.blas_in_use()
    path = resolve_model_path(model)
    config = _read_json(path / "config.json")
    family = select_family(families, config, path)
    defaults = generation_defaults(path, config)
    tokenizer = Tokenizer.from_dir(path, set(defaults.eos_token_ids))
    _ = tokenizer.max_token_bytes  # decodes the whole vocabulary once: here, not on a request
    template = load_chat_template(
        path, tokenizer.config, override=Path(chat_template_file) if chat_template_file else None,
        bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token, template=chat_template,
        jinja=jinja)
    tool_format, why = (select_tool_format(tool_formats, family, template, tool_call_format)
                        if tool_formats is not None else (None, "no tool formats given"))
    spec, spec_why = reasoning.select(family.reasoning, template.source,
                                      tokenizer.hf.get_vocab(with_added_tokens=True))
    quantized = "quantization" in config
    cast = backend.resolve_dtype(requested, device, fast_blas=backend.is_fast_blas(blas),
                                 quantized=quantized)
    lazy = distributed != "off"
    brought = resolve(family.load)(path, LoadOptions(dtype=cast or "auto", lazy=lazy,
                                                     task="generate",
                                                     read_threads=backend.weight_read_threads()))
    loaded = resolve(family.tasks["generate"])(brought)
    tokenizer = brought.tokenizer or tokenizer
    template = brought.template or template
    if lazy:
        from mlxcel.engine.distributed import load_shard

        load_shard(loaded, config, distributed, distributed_backend)
    actual = backend.model_dtype(getattr(loaded, "model", loaded))
    ctx = int(config.get("max_position_embeddings")
              or (config.get("text_config") or {}).get("max_position_embeddings")
              or tokenizer.config.get("model_max_length") or 4096)
    log.info("model_loaded", path=str(path), family=family.name,
             model_type=config.get("model_type"), quantized=quantized,
             chat_template=template.origin, seconds=round(time.perf_counter() - started, 2))
    log.info("backend", device=device, dtype=actual, requested_dtype=requested, blas=blas,
             checkpoint_dtype=config.get("torch_dtype"), quantized=quantized)
    log.info("tool_format_selected", name=tool_format and tool_format.name, why=why)
    log.info("chat_template_caps", origin=template.origin, **template.caps.summary())
    log.info("reasoning_selected", markers=spec and (spec.open, spec.close), why=spec_why,
             reasoning_format=reasoning_format)
    if hint := vision_hint(config, family):
        log.info("family_hint", model_type=config.get("model_type"), family=family.name,
                 install=hint, adds="image input (without it the checkpoint serves text only)")
    elif hint := family_hint(config.get("model_type"), family):
        log.info("family_hint", model_type=config.get("model_type"), family=family.name,
                 install=hint, adds="its tool format and reasoning")
    if cast and actual not in (cast, "unknown"):
        log.warning("dtype_not_applied", requested=cast, dtype=actual, family=family.name,
                    reason="the family's loader kept its own dtype")
    return LoadedCheckpoint(path=path, family=family, model=loaded,
                            config=brought.config or config,
                            tokenizer=tokenizer, template=template, defaults=defaults,
                            processor=brought.processor,
                            context_length=min(ctx, 1 << 20), dtype=actual, device=device,
                            blas=blas, tool_format=tool_format, tool_format_reason=why,
                            reasoning=spec, reasoning_reason=spec_why,
                            reasoning_format=reasoning_format)


def checkpoint_loader(settings: Any, plugins: Any) -> Callable[[], LoadedCheckpoint]:
    """What the engine calls to load the served model: ``load_checkpoint`` with the
    server's settings (``mlxcel.settings.Settings``) and ``plugins``' registries."""
    s = settings
    return lambda: load_checkpoint(
        s.model, plugins.families, dtype=s.dtype, chat_template_file=s.chat_template_file,
        chat_template=s.chat_template, jinja=s.jinja, tool_formats=plugins.tool_formats,
        tool_call_format=s.tool_call_format, reasoning_format=s.reasoning_format,
        distributed=s.distributed, distributed_backend=s.distributed_backend)


def check_checkpoint(path: Path, families: FamilyRegistry,
                     chat_template_file: str | None = None, *,
                     tool_formats: ToolFormatRegistry | None = None,
                     tool_call_format: str | None = None, chat_template: str | None = None,
                     jinja: bool = True
                     ) -> tuple[Family, ToolFormat | None, str, ChatTemplate]:
    """Cheap checks (no MLX) so a bad --model fails before the server starts; its family,
    the tool format ``load_checkpoint`` will select and why, and its chat template."""
    config = _read_json(path / "config.json")
    family = select_family(families, config, path)
    if not any(path.glob("*.safetensors")):
        raise StartupError(f"{path} has no *.safetensors weights")
    tokenizer = Tokenizer.from_dir(path)
    template = load_chat_template(
        path, tokenizer.config, override=Path(chat_template_file) if chat_template_file else None,
        bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token, template=chat_template,
        jinja=jinja)
    if tool_formats is None:
        return family, None, "no tool formats given", template
    return (family, *select_tool_format(tool_formats, family, template, tool_call_format),
            template)


def served_task(model: str, families: FamilyRegistry) -> str:
    """The task ``-m model`` serves: ``generate`` for a checkpoint a generating family
    owns, else the first task of the family that owns it (an embedder's ``embed``).
    Cheap: reads the config, imports no MLX."""
    path = resolve_model_path(model)
    config = _read_json(path / "config.json")
    family = families.select(path, config, None)
    if "generate" in family.tasks:
        return "generate"
    return (families.tasks_of(family, path, config) or tuple(family.tasks))[0]


def check_task_model(model: str, families: FamilyRegistry, task: str) -> tuple[Family, str]:
    """Cheap checks (no MLX) that ``model`` can serve ``task``: a family owns it for
    that task, it has weights, and it serves the task (``tasks_of``); one line if not."""
    path = resolve_model_path(model)
    config = _read_json(path / "config.json")
    family = families.select(path, config, task)
    if not any(path.glob("*.safetensors")) and not (path / "weights.npz").is_file():
        raise StartupError(f"{path} has no *.safetensors (or MLX weights.npz) weights")
    served = families.tasks_of(family, path, config)
    if task not in served:
        raise StartupError(f"{path} is served by family '{family.name}' for "
                           f"{', '.join(served) or 'no task'}, not {task}")
    return family, task


def load_task_model(model: str, families: FamilyRegistry, task: str, *,
                    dtype: str | None = None, options: TaskOptions | None = None
                    ) -> tuple[Family, Loaded, Any]:
    """Load ``model`` for a side task (engine thread): its family, what ``load``
    brought, and the task's runner (``mlxcel.families.tasks``)."""
    started = time.perf_counter()
    path = resolve_model_path(model)
    config = _read_json(path / "config.json")
    family = families.select(path, config, task)
    cast = backend.resolve_dtype(dtype or "auto", backend.mlx_device(),
                                 fast_blas=backend.is_fast_blas(backend.blas_in_use()),
                                 quantized="quantization" in config)
    loaded = resolve(family.load)(path, LoadOptions(dtype=cast or "auto", task=task,
                                                     read_threads=backend.weight_read_threads()))
    runner = resolve(family.tasks[task])(loaded, options or TaskOptions())
    log.info("side_model_loaded", task=task, path=str(path), family=family.name,
             model_type=config.get("model_type"),
             seconds=round(time.perf_counter() - started, 2))
    return family, loaded, runner

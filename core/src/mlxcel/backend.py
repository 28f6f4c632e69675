"""Where MLX runs and how fast: device, compute dtype, and a fast BLAS on Linux CPU.

MLX's Linux CPU wheel bundles the netlib *reference* BLAS (a few GFLOP/s for float32
GEMM) and has no BLAS path for bfloat16 at all. With an optimized BLAS preloaded
(``LD_PRELOAD``; MLX calls ``cblas_sgemm``, which then binds to the preloaded library)
float32 GEMM is ~20x faster. So on Linux CPU the server computes in float32 by default
and re-executes itself once with OpenBLAS preloaded when it is installed (without an
optimized BLAS, ``auto`` computes in float32 only for quantized models).

Everything here but :func:`model_dtype` and :func:`blas_in_use` (after MLX is loaded)
is cheap and imports no MLX on a CPU-only build, so :func:`maybe_reexec` can run
before the heavy imports.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import struct
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from mlxcel.errors import StartupError

DTYPES = ("float32", "float16", "bfloat16")
REEXEC_MARKER = "MLXCEL_FAST_BLAS_REEXEC"  # set in the re-executed server; never loops
REFERENCE_BLAS = "reference (netlib)"
# Debian/Ubuntu's OpenBLAS builds of libblas.so.3 (full BLAS + CBLAS), first found wins.
_FAST_BLAS_DIRS = ("openblas-pthread", "openblas-openmp", "openblas-serial")
_TRIPLETS = {"x86_64": "x86_64-linux-gnu", "amd64": "x86_64-linux-gnu",
             "aarch64": "aarch64-linux-gnu", "arm64": "aarch64-linux-gnu"}
_GPU_LIBS = ("libcuda", "libcudart", "libcublas", "libnvrtc", "libcudnn")
_BLAS_HINTS = ("blas", "mkl", "blis", "accelerate")


# ---------------------------------------------------------------- discovery (no MLX import)

def library_env() -> MutableMapping[str, str]:
    """The process environment, for the variables that belong to other programs.

    These are not settings of mlxcel's: ``LD_PRELOAD`` is the dynamic loader's (the
    OpenBLAS re-exec in ``mlxcel.backend`` prepends to it), and ``OPENBLAS_NUM_THREADS`` /
    ``OMP_NUM_THREADS`` are OpenBLAS's own, which ``mlxcel.engine.accel.cpu_blas`` leaves alone
    when a user set them, ``HF_HUB_OFFLINE`` is huggingface_hub's, and
    ``MLX_PTX_CACHE_DIR`` is MLX's (``keep_kernel_cache`` gives it a default). They are read
    where those libraries read them, so they come from here rather than from the options
    table.
    """
    return os.environ


def kernel_cache_dir(env: Mapping[str, str], mlx_version: str) -> Path:
    """Where MLX's CUDA backend keeps the kernels it compiled: the user's cache folder
    (``$XDG_CACHE_HOME``, else ``~/.cache``), per MLX version."""
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "mlxcel" / f"mlx-{mlx_version}" / "ptx"


def keep_kernel_cache(env: MutableMapping[str, str] | None = None) -> str | None:
    """On a CUDA build of MLX, point ``MLX_PTX_CACHE_DIR`` at ``kernel_cache_dir`` unless it
    is set; the folder set, or None. MLX compiles each kernel the first time a process
    needs it and keeps the result in that folder; its default is under the temp folder,
    which a reboot or a fresh container empties, and then the first start compiles
    everything again (the warm-up's batch life, most of a cold start). Called before MLX
    compiles anything: MLX reads the variable once."""
    env = library_env() if env is None else env
    if env.get("MLX_PTX_CACHE_DIR") or not on_cuda():
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        mlx_version = version("mlx")
    except PackageNotFoundError:
        return None
    folder = kernel_cache_dir(env, mlx_version)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only home: MLX's default stays
        return None
    env["MLX_PTX_CACHE_DIR"] = str(folder)
    return str(folder)


def fast_blas_candidates(machine: str | None = None, root: str = "/") -> list[str]:
    """Paths where an optimized ``libblas.so.3`` may be installed, in preference order."""
    triplet = _TRIPLETS.get((machine or platform.machine()).lower())
    if triplet is None:
        return []
    return [os.path.join(root, "usr", "lib", triplet, d, "libblas.so.3") for d in _FAST_BLAS_DIRS]


def find_fast_blas(candidates: Sequence[str] | None = None) -> str | None:
    """The first installed optimized BLAS, or None."""
    for path in fast_blas_candidates() if candidates is None else candidates:
        if os.path.isfile(path):
            return path
    return None


def mlx_library() -> Path | None:
    """MLX's shared library (``mlx/lib/libmlx.so``), found without importing ``mlx.core``."""
    try:
        spec = importlib.util.find_spec("mlx")
    except (ImportError, ValueError):
        return None
    for base in (spec.submodule_search_locations or []) if spec else []:
        for name in ("libmlx.so", "libmlx.dylib"):
            lib = Path(base) / "lib" / name
            if lib.is_file():
                return lib
    return None


def elf_needed(path: str | os.PathLike) -> list[str]:
    """DT_NEEDED entries of an ELF shared object; [] when it is not ELF or unreadable."""
    try:
        with open(path, "rb") as f:
            ident = f.read(16)
            if ident[:4] != b"\x7fELF":
                return []
            is64, end = ident[4] == 2, "<" if ident[5] == 1 else ">"
            f.seek(0)
            header = f.read(64 if is64 else 52)
            if is64:
                shoff, = struct.unpack_from(end + "Q", header, 0x28)
                shentsize, shnum = struct.unpack_from(end + "HH", header, 0x3A)
            else:
                shoff, = struct.unpack_from(end + "I", header, 0x20)
                shentsize, shnum = struct.unpack_from(end + "HH", header, 0x2E)
            f.seek(shoff)
            table = f.read(shentsize * shnum)
            sections = []
            for i in range(shnum):
                off = i * shentsize
                if is64:
                    _, type_, _, _, offset, size, link = struct.unpack_from(
                        end + "IIQQQQI", table, off)
                else:
                    _, type_, _, _, offset, size, link = struct.unpack_from(
                        end + "IIIIIII", table, off)
                sections.append((type_, offset, size, link))
            needed: list[str] = []
            for type_, offset, size, link in sections:
                if type_ != 6:  # SHT_DYNAMIC
                    continue
                f.seek(offset)
                dyn = f.read(size)
                _, str_off, str_size, _ = sections[link]
                f.seek(str_off)
                strtab = f.read(str_size)
                fmt, step = (end + "qQ", 16) if is64 else (end + "iI", 8)
                for pos in range(0, len(dyn) - step + 1, step):
                    tag, val = struct.unpack_from(fmt, dyn, pos)
                    if tag == 0:
                        break
                    if tag == 1:  # DT_NEEDED
                        needed.append(strtab[val:strtab.index(b"\0", val)].decode())
            return needed
    except (OSError, struct.error, IndexError, ValueError):
        return []


def links_blas(needed: Sequence[str]) -> bool:
    """Does a library with these DT_NEEDED entries take BLAS from a ``libblas``?"""
    return any(n.startswith(("libblas", "libcblas", "libopenblas")) for n in needed)


def has_gpu_backend(needed: Sequence[str]) -> bool:
    return any(n.startswith(_GPU_LIBS) for n in needed)


def mlx_device(needed: Sequence[str] | None = None) -> str:
    """``"cpu"`` or ``"gpu"``: MLX's default device.

    On Linux the answer comes from the libraries MLX links, without importing MLX: a
    CUDA build is taken to run on the GPU. Importing MLX here would initialise CUDA in
    the process that then forks Granian's worker, where CUDA can no longer start.
    Elsewhere MLX is asked (``mx.default_device()``).
    """
    if needed is None:
        lib = mlx_library()
        needed = elf_needed(lib) if lib else None
    if sys.platform.startswith("linux") and needed:
        return "gpu" if has_gpu_backend(needed) else "cpu"
    import mlx.core as mx

    return "gpu" if mx.default_device().type == mx.gpu else "cpu"


# ---------------------------------------------------------------- the re-exec decision

def preloaded(env: Mapping[str, str]) -> list[str]:
    """Entries of ``LD_PRELOAD`` (colon- or space-separated)."""
    return env.get("LD_PRELOAD", "").replace(":", " ").split()


def preload_decision(*, platform: str, device: str, no_fast_blas: bool,
                     env: Mapping[str, str], blas_path: str | None,
                     mlx_links_blas: bool) -> tuple[bool, str]:
    """Whether to re-execute with ``blas_path`` preloaded, and why (pure)."""
    if not platform.startswith("linux"):
        return False, f"not Linux ({platform})"
    if env.get(REEXEC_MARKER):
        return False, "already re-executed"
    if no_fast_blas:
        return False, "disabled (--no-fast-blas)"
    if device != "cpu":
        return False, f"MLX runs on the {device}"
    if not mlx_links_blas:
        return False, "MLX is not linked against libblas"
    if blas_path is None:
        return False, "no optimized BLAS installed"
    entries = preloaded(env)
    real = os.path.realpath(blas_path)
    if any(e == blas_path or os.path.realpath(e) == real for e in entries):
        return False, "already preloaded"
    if any(_looks_like_blas(e) for e in entries):
        return False, "another BLAS is already preloaded"
    return True, f"preloading {blas_path}"


# glibc's allocator for the re-executed CPU server (read from the environment at start).
# MLX's CPU allocator hands freed buffers past its cache limit back to malloc, whose
# defaults map, unmap and fault in a forward's large temporaries every step: one arena,
# mmap only past MLX's cache limit and no trimming keep them in the heap. User values win.
CPU_MALLOC_ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
                  "MALLOC_TRIM_THRESHOLD_": str(16 << 30)}


def preload_env(env: Mapping[str, str], blas_path: str) -> dict[str, str]:
    """``env`` with ``blas_path`` prepended to ``LD_PRELOAD``, glibc's allocator settings
    (``CPU_MALLOC_ENV``) where unset, and the loop marker set."""
    out = {**CPU_MALLOC_ENV, **env}
    out["LD_PRELOAD"] = ":".join([blas_path, *preloaded(env)])
    out[REEXEC_MARKER] = "1"
    return out


def maybe_reexec(argv: Sequence[str], *, no_fast_blas: bool) -> None:
    """Re-execute ``python -m mlxcel.cli argv`` with OpenBLAS preloaded, when it helps.

    Returns (doing nothing) when the decision is no; otherwise does not return.
    """
    env = library_env()
    if not sys.platform.startswith("linux") or env.get(REEXEC_MARKER) or no_fast_blas:
        return  # the cheap no's: skip the library look-ups
    lib = mlx_library()
    needed = elf_needed(lib) if lib else []
    blas = find_fast_blas()
    if blas is None or not links_blas(needed):
        return  # decided before asking for the device (which may import MLX)
    yes, _ = preload_decision(
        platform=sys.platform, device=mlx_device(needed), no_fast_blas=no_fast_blas,
        env=env, blas_path=blas, mlx_links_blas=True)
    if not yes:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "mlxcel.cli", *argv],
              preload_env(env, blas))


# ---------------------------------------------------------------- reporting

def _looks_like_blas(path: str) -> bool:
    name = os.path.basename(path).lower()
    return any(h in name for h in _BLAS_HINTS) or "openblas" in path.lower()


def _mapped_files(maps_path: str) -> set[str]:
    try:
        with open(maps_path, encoding="utf-8", errors="replace") as f:
            return {line.split(None, 5)[5].strip() for line in f
                    if len(line.split(None, 5)) == 6 and "/" in line}
    except OSError:
        return set()


def blas_in_use(env: Mapping[str, str] | None = None, maps_path: str = "/proc/self/maps",
                needed: Sequence[str] | None = None) -> str:
    """Which BLAS MLX's matmuls run on: a library path, ``reference (netlib)`` or ``none``.

    A BLAS in ``LD_PRELOAD`` that is mapped into this process comes first in symbol
    lookup, so it wins; otherwise MLX's own ``libblas`` (the wheel bundles netlib's).
    Other BLAS copies in the process (numpy's prefixed OpenBLAS) do not count.
    """
    env = library_env() if env is None else env
    if sys.platform == "darwin":
        return "accelerate"
    mapped = _mapped_files(maps_path)
    for entry in preloaded(env):
        real = os.path.realpath(entry)
        if _looks_like_blas(entry) and (entry in mapped or real in mapped):
            return real
    if needed is None:
        lib = mlx_library()
        needed = elf_needed(lib) if lib else []
    blas_names = [n for n in needed if links_blas([n])]
    if not blas_names:
        return "none"
    for path in mapped:  # a source build may link the system libblas.so.3 (an alternative)
        if os.path.basename(path) in blas_names and "openblas" in path.lower():
            return path
    return REFERENCE_BLAS


# ---------------------------------------------------------------- dtype

def resolve_dtype(requested: str, device: str, *, fast_blas: bool = True,
                  quantized: bool = False) -> str | None:
    """The dtype to cast the model to; None = keep the checkpoint's own.

    ``auto`` on a GPU keeps the checkpoint's dtype. On the CPU it is float32 when that
    is faster, which is measured (bench/results/blas_check.md) to be: an optimized BLAS
    is in use (float32 is MLX's only CPU matmul on BLAS; bfloat16/float16 have none:
    ~8x batched decode), or the model is quantized (MLX's CPU quantized matmul is ~6x
    faster with float32 scales than bfloat16 ones, BLAS or not). With only the
    reference BLAS a plain bfloat16 model stays bfloat16 (float32 would halve batched
    decode there).
    """
    requested = (requested or "auto").strip().lower()
    if requested == "auto":
        return "float32" if device == "cpu" and (fast_blas or quantized) else None
    if requested not in DTYPES:
        raise StartupError(f"unknown dtype {requested!r}; expected auto or one of "
                           f"{', '.join(DTYPES)}")
    return requested


def is_fast_blas(blas: str) -> bool:
    """Is a :func:`blas_in_use` answer an optimized BLAS (not netlib's, not none)?"""
    return blas not in (REFERENCE_BLAS, "none")


def model_dtype(module: Any) -> str:
    """The floating dtype holding most of a model's parameters (``unknown`` if none)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    sizes: dict[str, int] = {}
    try:
        params = tree_flatten(module.parameters())
    except AttributeError:
        return "unknown"
    for _, value in params:
        if isinstance(value, mx.array) and mx.issubdtype(value.dtype, mx.floating):
            name = str(value.dtype).rsplit(".", 1)[-1]
            sizes[name] = sizes.get(name, 0) + value.size
    return max(sizes, key=lambda k: sizes[k]) if sizes else "unknown"


def on_cuda() -> bool:
    """MLX runs on an NVIDIA GPU: the GPU device anywhere but macOS (whose GPU is Metal)."""
    return sys.platform != "darwin" and mlx_device() == "gpu"


# Threads that read safetensors files on CUDA (``mlxcel.model.safetensors_reads``: a
# checkpoint's weights, the prompt cache's disk tier). MLX's
# CUDA load reads each tensor into pageable memory on the evaluating thread and copies it
# from there, one after another; side by side, the reads and copies overlap. Metal reads
# straight into unified memory and the CPU has no copy, so both keep MLX's own load.
CUDA_READ_THREADS = 8


def weight_read_threads() -> int:
    """How many threads the loaders may read weights with: ``CUDA_READ_THREADS`` on CUDA,
    else 1 (MLX's own load)."""
    return CUDA_READ_THREADS if on_cuda() else 1


# ``sys.setswitchinterval`` on CUDA unless --switch-interval sets one. The engine thread
# spends most of a decode step in MLX calls that release the GIL; when it needs the GIL back
# while the event loop runs Python (SSE frames of many streams), it waits until the loop's
# thread is made to drop it, after at most this interval. On a GPU a short one keeps the
# device fed; on a small CPU machine the extra switches cost more than they save
# (bench/results/serving_gpu.md), so elsewhere Python's own interval stays.
CUDA_SWITCH_INTERVAL = 0.0005


# ---------------------------------------------------------------- the process environment

def _main() -> int:
    """``python -m mlxcel.backend``: the BLAS the server would preload, or nothing (off
    with ``MLXCEL_NO_FAST_BLAS``, read through the options table like the server does)."""
    from mlxcel.options import env_default

    try:
        off = env_default("no_fast_blas")
    except StartupError as exc:
        print(f"mlxcel.backend: error: {exc}", file=sys.stderr)
        return 2
    print("" if off or not sys.platform.startswith("linux") else find_fast_blas() or "")
    return 0


if __name__ == "__main__":
    sys.exit(_main())

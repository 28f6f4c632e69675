"""mlxcel.backend: device, --dtype resolution, BLAS discovery, the re-exec decision; and
that float32 + OpenBLAS computes the same logits as the reference BLAS and as bfloat16."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlxcel import backend
from mlxcel.errors import StartupError
from mlxcel.model.loader import load_checkpoint
from mlxcel.plugins import load_plugins
from mlxcel.testing.checkpoint import cached_checkpoint
from mlxcel.testing.imports import imported_by

PROMPT = [3, 17, 42, 99, 7, 250, 11, 64, 128, 5, 300, 21]


@pytest.fixture(scope="module")
def families():
    return load_plugins().families


# ---------------------------------------------------------------- dtype


@pytest.mark.parametrize(("requested", "device", "expected"), [
    ("auto", "cpu", "float32"),
    ("auto", "gpu", None),  # keep the checkpoint's own
    ("", "cpu", "float32"),
    ("float32", "gpu", "float32"),
    ("bfloat16", "cpu", "bfloat16"),
    ("Float16", "cpu", "float16"),
])
def test_resolve_dtype(requested, device, expected):
    assert backend.resolve_dtype(requested, device) == expected


def test_auto_without_a_fast_blas_is_float32_only_for_quantized_models():
    assert backend.resolve_dtype("auto", "cpu", fast_blas=False) is None
    assert backend.resolve_dtype("auto", "cpu", fast_blas=False, quantized=True) == "float32"
    assert backend.resolve_dtype("auto", "gpu", fast_blas=False, quantized=True) is None
    assert backend.resolve_dtype("bfloat16", "cpu", fast_blas=True) == "bfloat16"
    assert backend.is_fast_blas(OPENBLAS)
    assert not backend.is_fast_blas(backend.REFERENCE_BLAS) and not backend.is_fast_blas("none")


def test_resolve_dtype_refuses_unknown():
    with pytest.raises(StartupError, match="unknown dtype 'float64'"):
        backend.resolve_dtype("float64", "cpu")


def test_model_dtype_counts_elements_and_ignores_packed_weights():
    model = nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64))
    model.set_dtype(mx.bfloat16)
    model.layers[1].set_dtype(mx.float32)  # 128 float32 elements vs 4160 bfloat16
    assert backend.model_dtype(model) == "bfloat16"
    q = nn.QuantizedLinear(64, 64, group_size=32, bits=4)
    q.set_dtype(mx.float16)
    assert backend.model_dtype(q) == "float16"  # scales/biases; uint32 weights don't count
    assert backend.model_dtype(object()) == "unknown"


# ---------------------------------------------------------------- discovery


def test_candidates_per_architecture(tmp_path):
    x86 = backend.fast_blas_candidates("x86_64", root=str(tmp_path))
    arm = backend.fast_blas_candidates("aarch64", root=str(tmp_path))
    assert x86[0] == str(tmp_path / "usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3")
    assert arm[0] == str(tmp_path / "usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3")
    assert any("openblas-openmp" in p for p in x86)
    assert backend.fast_blas_candidates("riscv64", root=str(tmp_path)) == []


def test_find_fast_blas_first_installed_wins(tmp_path):
    cands = backend.fast_blas_candidates("x86_64", root=str(tmp_path))
    assert backend.find_fast_blas(cands) is None
    for path in cands[1:]:
        os.makedirs(os.path.dirname(path))
        open(path, "w").close()
    assert backend.find_fast_blas(cands) == cands[1]  # openmp, pthread absent
    os.makedirs(os.path.dirname(cands[0]))
    open(cands[0], "w").close()
    assert backend.find_fast_blas(cands) == cands[0]


def test_elf_needed_reads_mlx_library_without_importing_it(tmp_path):
    lib = backend.mlx_library()
    if sys.platform.startswith("linux"):
        assert lib is not None and lib.name == "libmlx.so"
        needed = backend.elf_needed(lib)
        assert any(n.startswith("libc.so") for n in needed)
        assert backend.links_blas(needed)  # the mlx[cpu] wheel bundles netlib BLAS
        assert not backend.has_gpu_backend(needed)
        assert backend.mlx_device(needed) == "cpu"
    not_elf = tmp_path / "x.so"
    not_elf.write_bytes(b"not an ELF file at all")
    assert backend.elf_needed(not_elf) == [] and backend.elf_needed(tmp_path / "nope") == []


def test_mlx_library_lookup_does_not_import_mlx_core():
    imported = imported_by(
        "from mlxcel import backend; lib = backend.mlx_library(); "
        "n = backend.elf_needed(lib) if lib else []; backend.mlx_device(n) if n else None",
        ("mlx.core",))
    assert imported == [] or not sys.platform.startswith("linux")


def test_startup_checks_do_not_import_mlx_core():
    """The CLI checks its settings before Granian forks its worker; MLX imported there
    would initialise CUDA in the parent and the forked worker's cudaSetDevice fails. A bad
    MLXCEL_DTYPE is refused by the options table, before any of them."""
    code = ("import sys; from mlxcel.cli import main; rc = main(['--model', 'x']); "
            "print(rc, 'mlx.core' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "MLXCEL_DTYPE": "bogus"})
    assert out.stdout.strip().splitlines()[-1] == "2 False"


def test_links_blas_and_gpu_libraries():
    assert backend.links_blas(["libblas-bd8a282c.so.3.10.0", "libc.so.6"])
    assert backend.links_blas(["libopenblas.so.0"])
    assert not backend.links_blas(["libc.so.6", "liblapack.so.3"])
    assert backend.has_gpu_backend(["libcudart.so.12", "libblas.so.3"])
    assert not backend.has_gpu_backend(["libblas.so.3"])


# ---------------------------------------------------------------- the re-exec decision

OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"
YES = {"platform": "linux", "device": "cpu", "no_fast_blas": False, "env": {},
       "blas_path": OPENBLAS, "mlx_links_blas": True}


@pytest.mark.parametrize(("change", "reason"), [
    ({}, "preloading"),
    ({"platform": "darwin"}, "not Linux"),
    ({"device": "gpu"}, "runs on the gpu"),
    ({"no_fast_blas": True}, "--no-fast-blas"),
    ({"mlx_links_blas": False}, "not linked against libblas"),
    ({"blas_path": None}, "no optimized BLAS"),
    ({"env": {backend.REEXEC_MARKER: "1"}}, "already re-executed"),
    ({"env": {"LD_PRELOAD": OPENBLAS}}, "already preloaded"),
    ({"env": {"LD_PRELOAD": "/opt/x/libjemalloc.so " + OPENBLAS}}, "already preloaded"),
    ({"env": {"LD_PRELOAD": "/opt/intel/libmkl_rt.so"}}, "another BLAS"),
    ({"env": {"LD_PRELOAD": "/opt/x/libjemalloc.so"}}, "preloading"),
])
def test_preload_decision(change, reason):
    yes, why = backend.preload_decision(**{**YES, **change})
    assert yes == (reason == "preloading") and reason in why


def test_preload_env_prepends_and_marks():
    env = backend.preload_env({"LD_PRELOAD": "/opt/x/libjemalloc.so", "A": "b"}, OPENBLAS)
    assert env["LD_PRELOAD"] == f"{OPENBLAS}:/opt/x/libjemalloc.so" and env["A"] == "b"
    assert env[backend.REEXEC_MARKER] == "1"
    assert backend.preload_env({}, OPENBLAS)["LD_PRELOAD"] == OPENBLAS


def test_preload_env_sets_the_allocator_unless_the_user_did():
    env = backend.preload_env({}, OPENBLAS)
    assert {k: env[k] for k in backend.CPU_MALLOC_ENV} == backend.CPU_MALLOC_ENV
    assert env["MALLOC_ARENA_MAX"] == "1"
    mine = backend.preload_env({"MALLOC_ARENA_MAX": "4"}, OPENBLAS)
    assert mine["MALLOC_ARENA_MAX"] == "4"  # the user's value wins
    assert mine["MALLOC_MMAP_THRESHOLD_"] == str(32 << 20)


@pytest.fixture
def fake_machine(monkeypatch, tmp_path):
    """A Linux CPU machine with OpenBLAS installed at a tmp path; execve is recorded."""
    blas = tmp_path / "libblas.so.3"
    blas.write_bytes(b"")
    calls = []
    monkeypatch.setattr(backend.sys, "platform", "linux")
    monkeypatch.setattr(backend, "find_fast_blas", lambda: str(blas))
    monkeypatch.setattr(backend, "mlx_library", lambda: tmp_path / "libmlx.so")
    monkeypatch.setattr(backend, "elf_needed", lambda _: ["libblas.so.3", "libc.so.6"])
    monkeypatch.setattr(backend.os, "execve", lambda *a: calls.append(a))
    for name in ("LD_PRELOAD", backend.REEXEC_MARKER):
        monkeypatch.delenv(name, raising=False)
    return str(blas), calls


def test_maybe_reexec_execs_the_cli_module_with_the_preload(fake_machine):
    blas, calls = fake_machine
    backend.maybe_reexec(["--demo", "--port", "9"], no_fast_blas=False)
    (exe, args, env), = calls
    assert exe == sys.executable and args == [sys.executable, "-m", "mlxcel.cli", "--demo",
                                              "--port", "9"]
    assert env["LD_PRELOAD"] == blas and env[backend.REEXEC_MARKER] == "1"


def test_maybe_reexec_does_nothing_when_opted_out_or_already_done(fake_machine, monkeypatch):
    blas, calls = fake_machine
    backend.maybe_reexec([], no_fast_blas=True)
    monkeypatch.setenv(backend.REEXEC_MARKER, "1")
    backend.maybe_reexec([], no_fast_blas=False)
    monkeypatch.delenv(backend.REEXEC_MARKER)
    monkeypatch.setenv("LD_PRELOAD", blas)
    backend.maybe_reexec([], no_fast_blas=False)
    monkeypatch.delenv("LD_PRELOAD")
    monkeypatch.setattr(backend, "find_fast_blas", lambda: None)
    backend.maybe_reexec([], no_fast_blas=False)
    assert calls == []


# ---------------------------------------------------------------- which BLAS is in use


def _maps(tmp_path, *paths):
    f = tmp_path / "maps"
    f.write_text("".join(f"7f00{i:04x}000-7f00{i:04x}fff r-xp 00000000 08:01 {i} {p}\n"
                         for i, p in enumerate(paths)) + "7ffd0000-7ffd1000 rw-p 0 0:0 0 [stack]\n")
    return str(f)


def test_blas_in_use(tmp_path):
    wheel = "/venv/site-packages/mlx_cpu.libs/libblas-bd8a282c.so.3.10.0"
    numpy_blas = "/venv/site-packages/numpy.libs/libscipy_openblas64_-32a4b2a6.so"
    needed = ["libblas-bd8a282c.so.3.10.0", "libc.so.6"]
    preload = {"LD_PRELOAD": OPENBLAS}
    # the wheel's netlib BLAS; numpy's (symbol-prefixed) OpenBLAS does not count
    maps = _maps(tmp_path, wheel, numpy_blas)
    assert backend.blas_in_use({}, maps, needed) == backend.REFERENCE_BLAS
    # preloaded and mapped: it wins even though the wheel's copy is mapped too
    maps = _maps(tmp_path, wheel, OPENBLAS, "/usr/lib/x/libopenblasp-r0.3.21.so")
    assert backend.blas_in_use(preload, maps, needed) == OPENBLAS
    # in LD_PRELOAD but not loaded (ld.so ignored it)
    assert backend.blas_in_use(preload, _maps(tmp_path, wheel), needed) == backend.REFERENCE_BLAS
    # a source build linking the system libblas.so.3, which the alternatives point at OpenBLAS
    maps = _maps(tmp_path, "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3")
    assert backend.blas_in_use({}, maps, ["libblas.so.3"]) == OPENBLAS
    assert backend.blas_in_use({}, maps, ["libc.so.6"]) == "none"


def test_blas_in_use_in_this_process():
    mx.eval(mx.ones((4, 4)) @ mx.ones((4, 4)))
    blas = backend.blas_in_use()
    preloaded = [p for p in backend.preloaded(os.environ) if "blas" in p]
    if preloaded and sys.platform.startswith("linux"):
        assert blas == os.path.realpath(preloaded[0])  # e.g. under `make test`
    elif sys.platform.startswith("linux"):
        assert blas == backend.REFERENCE_BLAS


# ---------------------------------------------------------------- loading with --dtype


def test_auto_dtype(tiny_checkpoint, mlxcel_checkpoint_cache, families):
    ckpt = load_checkpoint(str(tiny_checkpoint), families, dtype="auto")  # a bfloat16 one
    assert ckpt.device == ("gpu" if mx.default_device().type == mx.gpu else "cpu")
    assert ckpt.blas == backend.blas_in_use()
    fast_cpu = ckpt.device == "cpu" and backend.is_fast_blas(ckpt.blas)
    assert ckpt.dtype == ("float32" if fast_cpu else "bfloat16")
    quantized = cached_checkpoint("qwen3", mlxcel_checkpoint_cache, quantize_bits=4)
    ckpt = load_checkpoint(str(quantized), families, dtype="auto")
    assert ckpt.dtype == ("float32" if ckpt.device == "cpu" else "bfloat16")


def test_explicit_dtype_is_what_the_model_computes_in(tiny_checkpoint, families, monkeypatch):
    assert load_checkpoint(str(tiny_checkpoint), families, dtype="bfloat16").dtype == "bfloat16"
    assert load_checkpoint(str(tiny_checkpoint), families, dtype="float16").dtype == "float16"
    monkeypatch.setenv("MLXCEL_DTYPE", "float16")  # the env twin is the options layer's
    assert load_checkpoint(str(tiny_checkpoint), families, dtype="bfloat16").dtype == "bfloat16"


def _greedy(ckpt, steps=12):
    model = ckpt.model
    cache = model.make_cache()
    logits = model(mx.array([PROMPT]), cache)[:, -1].astype(mx.float32)
    first = np.array(logits[0])
    tokens = []
    for _ in range(steps):
        tok = mx.argmax(logits, axis=-1)
        tokens.append(tok.item())
        logits = model(tok[:, None], cache)[:, -1].astype(mx.float32)
    return first, tokens


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_checkpoint_generates_in_float32(mlxcel_checkpoint_cache, families, bits):
    path = cached_checkpoint("qwen3", mlxcel_checkpoint_cache, quantize_bits=bits,
                             suppress_eos=True)
    f32 = load_checkpoint(str(path), families, dtype="float32")
    own = load_checkpoint(str(path), families, dtype="bfloat16")
    assert (f32.dtype, own.dtype) == ("float32", "bfloat16")
    assert isinstance(f32.model.model.model.layers[0].mlp.gate_proj, nn.QuantizedLinear)
    a, toks_a = _greedy(f32)
    b, toks_b = _greedy(own)
    assert np.isfinite(a).all() and len(toks_a) == 12
    assert np.abs(a - b).max() < 0.05 * np.abs(b).max() + 0.05


def test_float32_and_bfloat16_logits_agree(mlxcel_checkpoint_cache, families):
    path = cached_checkpoint("qwen3", mlxcel_checkpoint_cache, hidden_size=128, num_layers=4,
                             vocab_size=1024, suppress_eos=True)
    a, toks_a = _greedy(load_checkpoint(str(path), families, dtype="float32"), steps=16)
    b, toks_b = _greedy(load_checkpoint(str(path), families, dtype="bfloat16"), steps=16)
    scale = np.abs(a).max()
    assert np.abs(a - b).max() < 0.05 * scale, (np.abs(a - b).max(), scale)
    assert np.corrcoef(a, b)[0, 1] > 0.999
    # greedy paths agree at first; bf16 rounding may flip a near-tie later on
    assert toks_a[:4] == toks_b[:4]
    assert sum(x == y for x, y in zip(toks_a, toks_b, strict=True)) >= 12


# ---------------------------------------------------------------- OpenBLAS vs reference

_LOGITS = """
import json, pathlib, sys
import mlx.core as mx, numpy as np
from mlx_lm.utils import load_model
from mlxcel import backend
model, _ = load_model(pathlib.Path(sys.argv[1]))
model.set_dtype(mx.float32)
logits = model(mx.array([json.loads(sys.argv[2])]))
np.save(sys.argv[3], np.array(logits.astype(mx.float32)))
print(json.dumps({"blas": backend.blas_in_use()}))
"""


def _logits_in_subprocess(path, out, preload):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", backend.REEXEC_MARKER)}
    if preload:
        env["LD_PRELOAD"] = preload
    proc = subprocess.run([sys.executable, "-c", _LOGITS, str(path), json.dumps(PROMPT),
                           str(out)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])["blas"], np.load(out)


def test_openblas_preload_gives_the_same_float32_logits(mlxcel_checkpoint_cache, tmp_path):
    blas = backend.find_fast_blas()
    lib = backend.mlx_library()
    links = bool(lib) and backend.links_blas(backend.elf_needed(lib))
    if blas is None or not sys.platform.startswith("linux") or not links:
        # nothing to preload: discovery says so and the server would not re-exec
        yes, why = backend.preload_decision(
            platform=sys.platform, device="cpu", no_fast_blas=False, env={},
            blas_path=blas, mlx_links_blas=links)
        assert not yes and why
        return
    path = cached_checkpoint("qwen3", mlxcel_checkpoint_cache, hidden_size=128, num_layers=4,
                             vocab_size=1024)
    ref_blas, ref = _logits_in_subprocess(path, tmp_path / "ref.npy", None)
    fast_blas, fast = _logits_in_subprocess(path, tmp_path / "fast.npy", blas)
    assert ref_blas == backend.REFERENCE_BLAS
    assert fast_blas == os.path.realpath(blas)
    assert ref.shape == (1, len(PROMPT), 1024)
    assert np.abs(ref - fast).max() < 1e-4


def test_kernel_cache_goes_to_the_users_cache_folder_per_mlx_version(tmp_path):
    from mlxcel.backend import kernel_cache_dir

    assert kernel_cache_dir({"HOME": "/home/u"}, "0.32.4") == \
        Path("/home/u/.cache/mlxcel/mlx-0.32.4/ptx")
    assert kernel_cache_dir({"HOME": "/home/u", "XDG_CACHE_HOME": str(tmp_path)}, "1.0") == \
        tmp_path / "mlxcel" / "mlx-1.0" / "ptx"


def test_kernel_cache_is_set_on_cuda_builds_only_and_never_over_the_users(tmp_path,
                                                                          monkeypatch):
    from mlxcel import backend

    env = {"XDG_CACHE_HOME": str(tmp_path)}
    monkeypatch.setattr(backend, "elf_needed", lambda lib: ["libmlx.so", "libc.so.6"])
    assert backend.keep_kernel_cache(env) is None and "MLX_PTX_CACHE_DIR" not in env  # CPU
    monkeypatch.setattr(backend, "elf_needed", lambda lib: ["libcudart.so.13", "libc.so.6"])
    monkeypatch.setattr(backend, "mlx_library", lambda: tmp_path / "libmlx.so")
    folder = backend.keep_kernel_cache(env)
    assert folder == env["MLX_PTX_CACHE_DIR"] and Path(folder).is_dir()
    assert folder.startswith(str(tmp_path / "mlxcel" / "mlx-"))
    mine = {"MLX_PTX_CACHE_DIR": "/srv/ptx", "XDG_CACHE_HOME": str(tmp_path)}
    assert backend.keep_kernel_cache(mine) is None and mine["MLX_PTX_CACHE_DIR"] == "/srv/ptx"

"""One OpenBLAS thread for small models on the CPU (``mlxcel.engine.accel.cpu_blas``)."""

from __future__ import annotations

from mlxcel.engine.accel import cpu_blas

TINY = {"hidden_size": 64, "intermediate_size": 192}
SMALL = {"hidden_size": 512, "intermediate_size": 1536}


def test_small_models_get_one_thread_and_larger_ones_keep_theirs():
    calls = []
    assert cpu_blas.limit_threads(TINY, 512, env={}, setter=calls.append) == 1
    assert calls == [1]
    assert cpu_blas.limit_threads(SMALL, 512, env={}, setter=calls.append) is None
    assert cpu_blas.limit_threads({"text_config": TINY}, 512, env={},
                                  setter=calls.append) == 1
    assert calls == [1, 1]


def test_a_thread_count_the_user_set_or_an_unknown_shape_is_left_alone():
    calls = []
    for env in ({"OPENBLAS_NUM_THREADS": "2"}, {"OMP_NUM_THREADS": "4"}):
        assert cpu_blas.limit_threads(TINY, 512, env=env, setter=calls.append) is None
    assert cpu_blas.limit_threads({"hidden_size": 64}, 512, env={}, setter=calls.append) is None
    assert calls == []


def test_the_threshold_sits_between_the_benchmark_models():
    assert cpu_blas.chunk_gemm_flops(TINY, 512) < cpu_blas.SMALL_GEMM_FLOPS
    assert cpu_blas.chunk_gemm_flops(SMALL, 512) > cpu_blas.SMALL_GEMM_FLOPS


def test_openblas_is_found_exactly_when_it_is_loaded():
    """``make test`` preloads Debian's OpenBLAS (as the server does on Linux CPU); without
    it there is nothing to set."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            loaded = "libopenblas" in f.read()
    except FileNotFoundError:  # macOS: no OpenBLAS preload
        loaded = False
    assert (cpu_blas._openblas() is not None) == loaded

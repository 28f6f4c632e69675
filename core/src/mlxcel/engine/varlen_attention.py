"""One-kernel decode attention for left-padded rows on CUDA (``mx.fast.cuda_kernel``).

A decode step of a batch whose rows start at different slots needs a mask, and MLX 0.32's
fused CUDA SDPA takes none: every masked step falls back to several kernels per layer. Here
one kernel per layer reads each row's keys from its first valid slot (``starts[b]``): a
block per (row, query head), 32 warps taking every 32nd key with an online softmax, one
lane holding ``D / 32`` elements of the query, of the running output and of each key and
value, then a reduction of the 32 warps' partial results in shared memory. Keys and values
are read in place through their strides (the cache hands out slices of a larger buffer).

``available()`` compiles the kernel and checks it against the composed reference
(``reference``) once per process; the engine uses it only where that check passed.
"""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx

HEAD_DIMS = (64, 96, 128, 256)

_HEADER = """
#include <cuda_fp16.h>
#include <cuda_bf16.h>
__device__ __forceinline__ float mlxcel_f32(float x) { return x; }
__device__ __forceinline__ float mlxcel_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float mlxcel_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void mlxcel_store(float* p, float x) { *p = x; }
__device__ __forceinline__ void mlxcel_store(__half* p, float x) { *p = __float2half(x); }
__device__ __forceinline__ void mlxcel_store(__nv_bfloat16* p, float x) {
  *p = __float2bfloat16(x);
}
"""

# Template arguments: T (dtype), D (head dim, a multiple of 32), G (query heads per KV head).
# Launch: grid (Hq * 32, 32, B), threadgroup (32, 32, 1) -> one block per (query head, row).
_SOURCE = """
  constexpr int W = 32;          // warps per block; warp w takes keys w, w + 32, ...
  constexpr int P = D / 32;      // elements of a head vector per lane
  __shared__ float part_max[W];
  __shared__ float part_sum[W];
  __shared__ float part_out[W][D];

  const int lane = threadIdx.x;
  const int warp = threadIdx.y;
  const int head = blockIdx.x;
  const int hq = gridDim.x;
  const int b = blockIdx.z;
  const int kvh = head / G;
  const int length = k_shape[2];
  const float log2e = 1.44269504089f;

  const T* qp = q + b * q_strides[0] + head * q_strides[1] + lane * P * q_strides[3];
  float qv[P];
  const float qscale = scale[0] * log2e;
  #pragma unroll
  for (int i = 0; i < P; ++i) qv[i] = mlxcel_f32(qp[i * q_strides[3]]) * qscale;

  const T* kp = k + b * k_strides[0] + kvh * k_strides[1] + lane * P * k_strides[3];
  const T* vp = v + b * v_strides[0] + kvh * v_strides[1] + lane * P * v_strides[3];
  float run_max = -inf;
  float run_sum = 0.f;
  float acc[P];
  #pragma unroll
  for (int i = 0; i < P; ++i) acc[i] = 0.f;

  for (int j = starts[b] + warp; j < length; j += W) {
    const T* kj = kp + j * k_strides[2];
    float dot = 0.f;
    #pragma unroll
    for (int i = 0; i < P; ++i) dot += qv[i] * mlxcel_f32(kj[i * k_strides[3]]);
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffff, dot, off);
    const float new_max = fmaxf(run_max, dot);
    const float keep = exp2f(run_max - new_max);
    const float weight = exp2f(dot - new_max);
    run_sum = run_sum * keep + weight;
    const T* vj = vp + j * v_strides[2];
    #pragma unroll
    for (int i = 0; i < P; ++i) acc[i] = acc[i] * keep + weight * mlxcel_f32(vj[i * v_strides[3]]);
    run_max = new_max;
  }

  if (lane == 0) {
    part_max[warp] = run_max;
    part_sum[warp] = run_sum;
  }
  __syncthreads();
  float top = -inf;
  for (int w = 0; w < W; ++w) top = fmaxf(top, part_max[w]);
  float total = 0.f;
  for (int w = 0; w < W; ++w) {
    if (part_max[w] > -inf) total += part_sum[w] * exp2f(part_max[w] - top);
  }
  const float mine = run_max > -inf ? exp2f(run_max - top) : 0.f;
  #pragma unroll
  for (int i = 0; i < P; ++i) part_out[warp][lane * P + i] = acc[i] * mine;
  __syncthreads();
  const float inv = total > 0.f ? 1.f / total : 0.f;
  T* op = out + (static_cast<long>(b) * hq + head) * D;
  for (int e = warp * 32 + lane; e < D; e += W * 32) {
    float sum = 0.f;
    for (int w = 0; w < W; ++w) sum += part_out[w][e];
    mlxcel_store(op + e, sum * inv);
  }
"""


@functools.cache
def _kernel() -> Any:
    return mx.fast.cuda_kernel(name="mlxcel_varlen_decode_attention",
                               input_names=["q", "k", "v", "starts", "scale"],
                               output_names=["out"], source=_SOURCE, header=_HEADER,
                               ensure_row_contiguous=False)


@functools.cache
def _scale_array(scale: float) -> mx.array:
    return mx.array([scale], dtype=mx.float32)


def supports(queries: mx.array, keys: mx.array, values: mx.array) -> bool:
    """Shapes this kernel computes: one query per row, equal K/V head dims it knows."""
    d = queries.shape[-1]
    return (queries.shape[2] == 1 and d in HEAD_DIMS and keys.shape[-1] == d
            and values.shape[-1] == d and queries.shape[1] % keys.shape[1] == 0
            and queries.dtype in (mx.float32, mx.float16, mx.bfloat16))


def varlen_decode_attention(queries: mx.array, keys: mx.array, values: mx.array,
                            scale: float, starts: mx.array) -> mx.array:
    """``queries`` [B, Hq, 1, D], ``keys``/``values`` [B, Hkv, L, D], ``starts`` [B] int32:
    row b attends to its slots ``starts[b]..L`` -> [B, Hq, 1, D]."""
    b, hq, _, d = queries.shape
    out = _kernel()(inputs=[queries, keys, values, starts, _scale_array(float(scale))],
                    template=[("T", queries.dtype), ("D", d), ("G", hq // keys.shape[1])],
                    grid=(hq * 32, 32, b), threadgroup=(32, 32, 1),
                    output_shapes=[(b, hq, 1, d)], output_dtypes=[queries.dtype])
    return out[0]


def reference(queries: mx.array, keys: mx.array, values: mx.array, scale: float,
              starts: mx.array) -> mx.array:
    """What ``varlen_decode_attention`` computes, composed from MLX ops."""
    mask = mx.arange(keys.shape[2])[None, :] >= starts[:, None]
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale,
                                                mask=mask[:, None, None, :])


@functools.cache
def available() -> bool:
    """True when the kernel compiles here and matches ``reference`` (checked once)."""
    from mlxcel.backend import on_cuda

    if not on_cuda():
        return False
    try:
        return _self_check()
    except Exception:  # no compiler, unsupported device, ...: callers fall back
        return False


def _self_check() -> bool:
    mx.random.seed(0)
    for dtype, d, (b, hq, hkv, cap, length) in ((mx.float32, 128, (3, 8, 2, 80, 70)),
                                                (mx.bfloat16, 64, (5, 4, 4, 40, 33)),
                                                (mx.float16, 128, (2, 8, 1, 300, 290))):
        q = mx.random.normal((b, 1, hq, d)).astype(dtype).transpose(0, 2, 1, 3)
        k = mx.random.normal((b, hkv, cap, d)).astype(dtype)[..., :length, :]
        v = mx.random.normal((b, hkv, cap, d)).astype(dtype)[..., :length, :]
        starts = mx.array([(7 * i) % (length - 1) for i in range(b)], dtype=mx.int32)
        got = varlen_decode_attention(q, k, v, d ** -0.5, starts).astype(mx.float32)
        want = reference(q, k, v, d ** -0.5, starts).astype(mx.float32)
        tol = 1e-4 if dtype == mx.float32 else 2e-2
        if not mx.allclose(got, want, atol=tol, rtol=tol).item():
            return False
    return True

"""One-kernel decode attention for left-padded rows on CUDA (``mx.fast.cuda_kernel``).

A decode step of a batch whose rows start at different slots needs a mask, and MLX 0.32's
fused CUDA SDPA takes none: every masked step falls back to several kernels per layer. Here
one kernel per layer reads each row's keys from its first valid slot (``starts[b]``): a
block per (row, KV head, up to 8 of its query heads), 8 warps taking every 8th key with an
online softmax per query head, one lane holding ``D / 32`` elements of each query, running
output, key and value (a key and value are read once for all the block's query heads),
then a reduction of the 8 warps' partial results in shared memory. Keys and values
are read in place through their strides (the cache hands out slices of a larger buffer).

``available()`` says whether the kernel can be built here; each instantiation is compiled
and checked against the composed reference (``reference``) once per process, when a shape
first needs it (``supports``), and used only where that check passed.
"""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx

HEAD_DIMS = (64, 96, 128, 256)
LONG_CONTEXT = 2048  # keys per row past which the kernel needs MANY_BLOCKS blocks
MANY_BLOCKS = 256
PREFILL_WORK = 128 * 1024  # queries x keys per row up to which a prefill chunk uses it

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

# Template arguments: T (dtype), D (head dim, a multiple of 32), G (query heads per KV
# head), GT (query heads per block, divides G, GT * D <= 1024). Launch: grid
# (Hkv * G / GT * 32, NW, B * C), threadgroup (32, NW, 1): a block per (row, query position,
# KV head, GT of its query heads); warp w takes keys w, w + NW, ...; the key and value of a
# slot are read once for the GT query heads. Query t of C attends to slots
# starts[b] .. L - C + t (causal, the queries being the last C slots).
NW = 8
_SOURCE = """
  constexpr int NW = @NW@;
  constexpr int P = D / 32;
  constexpr int SPLIT = G / GT;
  __shared__ float part_max[NW][GT];
  __shared__ float part_sum[NW][GT];
  __shared__ float part_out[NW][GT * D];

  const int lane = threadIdx.x;
  const int warp = threadIdx.y;
  const int kvh = blockIdx.x / SPLIT;
  const int h0 = kvh * G + (blockIdx.x % SPLIT) * GT;
  const int hq = gridDim.x / SPLIT * G;
  const int queries = q_shape[2];          // C: queries per row (1 when decoding)
  const int b = blockIdx.z / queries;
  const int t = blockIdx.z % queries;      // query t sits at slot L - C + t (causal)
  const int length = k_shape[2] - queries + t + 1;
  const float neg_inf = -__int_as_float(0x7f800000);
  const float qscale = scale[0] * 1.44269504089f;

  float qv[GT][P];
  #pragma unroll
  for (int g = 0; g < GT; ++g) {
    const T* qp = q + b * q_strides[0] + (h0 + g) * q_strides[1] + t * q_strides[2]
                  + lane * P * q_strides[3];
    #pragma unroll
    for (int i = 0; i < P; ++i) qv[g][i] = mlxcel_f32(qp[i * q_strides[3]]) * qscale;
  }
  const T* kp = k + b * k_strides[0] + kvh * k_strides[1] + lane * P * k_strides[3];
  const T* vp = v + b * v_strides[0] + kvh * v_strides[1] + lane * P * v_strides[3];
  float run_max[GT], run_sum[GT], acc[GT][P];
  #pragma unroll
  for (int g = 0; g < GT; ++g) {
    run_max[g] = neg_inf;
    run_sum[g] = 0.f;
    #pragma unroll
    for (int i = 0; i < P; ++i) acc[g][i] = 0.f;
  }

  for (int j = starts[b] + warp; j < length; j += NW) {
    const T* kj = kp + j * k_strides[2];
    const T* vj = vp + j * v_strides[2];
    float kf[P], vf[P], dot[GT];
    #pragma unroll
    for (int i = 0; i < P; ++i) kf[i] = mlxcel_f32(kj[i * k_strides[3]]);
    #pragma unroll
    for (int i = 0; i < P; ++i) vf[i] = mlxcel_f32(vj[i * v_strides[3]]);
    #pragma unroll
    for (int g = 0; g < GT; ++g) {
      dot[g] = 0.f;
      #pragma unroll
      for (int i = 0; i < P; ++i) dot[g] += qv[g][i] * kf[i];
    }
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      #pragma unroll
      for (int g = 0; g < GT; ++g) dot[g] += __shfl_xor_sync(0xffffffff, dot[g], off);
    }
    #pragma unroll
    for (int g = 0; g < GT; ++g) {
      const float new_max = fmaxf(run_max[g], dot[g]);
      const float keep = exp2f(run_max[g] - new_max);
      const float weight = exp2f(dot[g] - new_max);
      run_sum[g] = run_sum[g] * keep + weight;
      #pragma unroll
      for (int i = 0; i < P; ++i) acc[g][i] = acc[g][i] * keep + weight * vf[i];
      run_max[g] = new_max;
    }
  }

  if (lane == 0) {
    #pragma unroll
    for (int g = 0; g < GT; ++g) {
      part_max[warp][g] = run_max[g];
      part_sum[warp][g] = run_sum[g];
    }
  }
  #pragma unroll
  for (int g = 0; g < GT; ++g) {
    #pragma unroll
    for (int i = 0; i < P; ++i) part_out[warp][g * D + lane * P + i] = acc[g][i];
  }
  __syncthreads();
  for (int e = warp * 32 + lane; e < GT * D; e += NW * 32) {
    const int g = e / D;
    float top = neg_inf;
    for (int w = 0; w < NW; ++w) top = fmaxf(top, part_max[w][g]);
    float total = 0.f, sum = 0.f;
    for (int w = 0; w < NW; ++w) {
      if (part_max[w][g] > neg_inf) {
        const float f = exp2f(part_max[w][g] - top);
        total += part_sum[w][g] * f;
        sum += part_out[w][e] * f;
      }
    }
    mlxcel_store(out + ((static_cast<long>(b) * hq + h0 + g) * queries + t) * D + (e - g * D),
                 total > 0.f ? sum / total : 0.f);
  }
""".replace("@NW@", str(NW))


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
    """Shapes this kernel computes (head dims it knows, K/V alike) and computes well.

    Each block reads its row's keys once per query, so the work grows with queries x keys:
    fine for decoding and for short prefill chunks (where it also spares CUDA a per-shape
    cuDNN plan), not for long prompts. A long context spread over few blocks is slow too.
    On CUDA, also only where the shape's instantiation passed its check (``available``)."""
    return _supports(queries.shape, keys.shape, values.shape[-1], queries.dtype)


@functools.lru_cache(maxsize=64)  # asked per layer per step with the same shapes
def _supports(q_shape: tuple[int, ...], k_shape: tuple[int, ...], dv: int,
              dtype: mx.Dtype) -> bool:
    b, hq, n, d = q_shape
    hkv, length = k_shape[1], k_shape[2]
    if not (d in HEAD_DIMS and k_shape[-1] == d and dv == d and hq % hkv == 0
            and length >= n and dtype in (mx.float32, mx.float16, mx.bfloat16)):
        return False
    if n > 1:
        fits = n * length <= PREFILL_WORK
    else:
        blocks = b * hq // _heads_per_block(hq // hkv, d)
        fits = length <= LONG_CONTEXT or blocks >= MANY_BLOCKS
    return fits and (not available() or _checked(dtype, d, hq // hkv))


@functools.cache
def _heads_per_block(group: int, d: int) -> int:
    """The largest divisor of ``group`` with at most 8 heads and 1024 values per block."""
    return max(t for t in range(1, min(group, 8, 1024 // d) + 1) if group % t == 0)


def varlen_decode_attention(queries: mx.array, keys: mx.array, values: mx.array,
                            scale: float, starts: mx.array) -> mx.array:
    """``queries`` [B, Hq, C, D] (the last C slots), ``keys``/``values`` [B, Hkv, L, D],
    ``starts`` [B] int32: query t of row b attends to slots ``starts[b] .. L - C + t``
    -> [B, Hq, C, D]."""
    b, hq, c, d = queries.shape
    hkv = keys.shape[1]
    group = hq // hkv
    per_block = _heads_per_block(group, d)
    out = _kernel()(inputs=[queries, keys, values, starts, _scale_array(float(scale))],
                    template=[("T", queries.dtype), ("D", d), ("G", group), ("GT", per_block)],
                    grid=(hkv * group // per_block * 32, NW, b * c), threadgroup=(32, NW, 1),
                    output_shapes=[(b, hq, c, d)], output_dtypes=[queries.dtype])
    return out[0]


def reference(queries: mx.array, keys: mx.array, values: mx.array, scale: float,
              starts: mx.array) -> mx.array:
    """What ``varlen_decode_attention`` computes, composed from MLX ops."""
    c, length = queries.shape[2], keys.shape[2]
    slot = mx.arange(length)[None, None, :]
    query_slot = (length - c + mx.arange(c))[None, :, None]
    mask = (slot >= starts[:, None, None]) & (slot <= query_slot)  # [B, C, L]
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale,
                                                mask=mask[:, None])


@functools.cache
def available() -> bool:
    """True where the kernel can be built: CUDA, with MLX's custom kernels. Each of its
    instantiations (dtype, head dim, query heads per KV head) is compiled and checked
    against ``reference`` the first time a shape needs it (``supports``): compiling every
    instantiation a model could use would cost seconds of startup for kernels it never
    runs."""
    from mlxcel.backend import on_cuda

    return on_cuda() and hasattr(mx.fast, "cuda_kernel")


@functools.cache
def _checked(dtype: mx.Dtype, d: int, group: int) -> bool:
    """Whether this instantiation compiles here and matches ``reference``, for a decode
    step and a short prefill chunk over strided keys (a cache's slice of its buffer)."""
    try:
        b, hkv, cap, length = 3, 2, 80, 70
        for c in (1, 9):  # own keys: the global seed is the requests' business
            kq, kk, kv = mx.random.split(mx.random.key(d * 31 + group * 7 + c), 3)
            q = mx.random.normal((b, c, hkv * group, d), key=kq).astype(dtype)
            q = q.transpose(0, 2, 1, 3)
            k = mx.random.normal((b, hkv, cap, d), key=kk).astype(dtype)[..., :length, :]
            v = mx.random.normal((b, hkv, cap, d), key=kv).astype(dtype)[..., :length, :]
            starts = mx.array([(7 * i) % (length - c) for i in range(b)], dtype=mx.int32)
            got = varlen_decode_attention(q, k, v, d ** -0.5, starts).astype(mx.float32)
            want = reference(q, k, v, d ** -0.5, starts).astype(mx.float32)
            tol = 1e-4 if dtype == mx.float32 else 2e-2
            if not mx.allclose(got, want, atol=tol, rtol=tol).item():
                return False
        return True
    except Exception:  # no compiler, an unsupported device, ...: callers fall back
        return False

"""Where does BatchKVCache lose to KVCache at large batch? Raw decode loop variants.

Same loop as raw_loop.py on one checkpoint: plain KVCache; BatchKVCache as mlx-lm ships it;
BatchKVCache whose decode mask is dropped (valid here: no row is padded); and BatchKVCache
with a scalar RoPE offset (also valid without padding). Each variant isolates one cost.

    python bench/gpu/cache_probe.py --model CKPT --batch 64 --steps 128
"""

from __future__ import annotations

import argparse
import json
import sys

from raw_loop import measure


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--only-attention", action="store_true")
    args = ap.parse_args()
    from mlx_lm import load
    from mlx_lm.models.cache import BatchKVCache

    model, _ = load(args.model)
    stock_mask = BatchKVCache.make_mask
    stock_update = BatchKVCache.update_and_fetch

    def no_mask(self, N, return_array=False, **kw):
        return None if N == 1 else stock_mask(self, N, return_array=return_array, **kw)

    def scalar_offset(self, keys, values):
        out = stock_update(self, keys, values)
        self.offset = self._idx  # python int: RoPE takes the scalar path
        return out

    import mlx.core as mx
    import mlx_lm.models.llama as llama

    stock_sdpa = llama.scaled_dot_product_attention

    def contiguous_q(queries, keys, values, cache, scale, mask, **kw):
        return stock_sdpa(mx.contiguous(queries), keys, values, cache, scale, mask, **kw)

    def additive_mask(queries, keys, values, cache, scale, mask, **kw):
        if isinstance(mask, mx.array) and mask.dtype == mx.bool_:
            mask = mx.where(mask, mx.array(0, queries.dtype), mx.array(-1e9, queries.dtype))
        return stock_sdpa(queries, keys, values, cache, scale, mask, **kw)

    results = {}
    variants = [("KVCache", "KVCache", None), ("BatchKVCache", "BatchKVCache", None),
                ("BatchKVCache-no-mask", "BatchKVCache", ("make_mask", no_mask)),
                ("BatchKVCache-scalar-offset", "BatchKVCache",
                 ("update_and_fetch", scalar_offset)),
                ("BatchKVCache-both", "BatchKVCache", "both"),
                ("BatchKVCache-contiguous-q", "BatchKVCache", ("sdpa", contiguous_q)),
                ("BatchKVCache-additive-mask", "BatchKVCache", ("sdpa", additive_mask))]
    if args.only_attention:
        variants = [variants[0], variants[1], *variants[-2:]]
    for name, kind, patch in variants:
        if patch == "both":
            BatchKVCache.make_mask, BatchKVCache.update_and_fetch = no_mask, scalar_offset
        elif patch and patch[0] == "sdpa":
            llama.scaled_dot_product_attention = patch[1]
        elif patch:
            setattr(BatchKVCache, *patch)
        r = measure(model, kind, args.batch, 48, args.steps, 8)
        BatchKVCache.make_mask, BatchKVCache.update_and_fetch = stock_mask, stock_update
        llama.scaled_dot_product_attention = stock_sdpa
        results[name] = round(r["ms_per_step"], 2)
        print(f"{name:28s} {r['ms_per_step']:7.2f} ms/step  {r['tok_s']:8.1f} tok/s", flush=True)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

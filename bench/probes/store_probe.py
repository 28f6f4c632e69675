"""Why are the engine's prompt-cache store and batch joins slow to queue on CUDA?

On a Llama-3-8B-shaped layer stack of ``BatchCache`` (bf16, 32 layers, 8 KV heads, D 128,
B rows of ~``--length`` tokens, capacity rounded up to 256), times each alone, as the engine
runs them (graph built, then ``mx.async_eval`` = encode, then wait):

* gathering R finished rows from a slice of the buffer (older code) or from the whole buffer;
* the store (``SharedOps.snapshots``): per-row concatenation of per-layer slices (the code
  before ``kvcache.stored_rows``) against ``stored_rows`` (one gather per layer, one stack);
* a prefill group of R prompt-cache hits set up from their stored rows, per layer (the code
  before the stacked ``BatchCache.from_prefixes``) against ``from_prefixes``;
* ``extend``: a group of G rows joining the batch (one new buffer per layer and side);
* a plain allocation of the joined size (``mx.zeros``), new and repeated.

Each case runs on fresh sizes three times in a row, so first-time costs show.

    python bench/probes/store_probe.py [--batch 64] [--rows 8] [--length 336]
"""

from __future__ import annotations

import argparse
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--length", type=int, default=336)
    args = ap.parse_args()
    import mlx.core as mx
    import mlx.nn as nn
    from mlxcel.engine.cache.kvcache import BatchCache, stored_rows

    rope = nn.RoPE(128, base=500000.0)
    layers, b, n = 32, args.batch, args.length

    def batch(rows: int, length: int) -> list[BatchCache]:
        caches = []
        for _ in range(layers):
            c = BatchCache([i % 16 for i in range(rows)], rope)
            k = mx.random.normal((rows, 8, length, 128)).astype(mx.bfloat16)
            c.update_and_fetch(k, k)
            caches.append(c)
        mx.eval([c.state for c in caches])
        return caches

    def timed(label: str, build) -> None:
        t0 = time.perf_counter()
        out = build()
        t1 = time.perf_counter()
        mx.async_eval(out)
        t2 = time.perf_counter()
        mx.eval(out)
        t3 = time.perf_counter()
        print(f"{label:46s} build {1e3 * (t1 - t0):7.2f}  queue {1e3 * (t2 - t1):7.2f}  "
              f"wait {1e3 * (t3 - t2):7.2f} ms", flush=True)

    idx = list(range(0, b, b // args.rows))[: args.rows]
    for trial in range(3):
        length = n + 7 * trial
        caches = batch(b, length)
        lengths = [length - 20] * len(idx)

        def sliced_gather(caches=caches) -> list:
            take = mx.array(idx)
            return [c.keys[..., :c._idx, :][take] for c in caches] + \
                [c.values[..., :c._idx, :][take] for c in caches]

        timed(f"[{trial}] gather from a slice (old)", sliced_gather)
        timed(f"[{trial}] gather from the buffer", lambda caches=caches: [
            c.keys[mx.array(idx)] for c in caches] + [c.values[mx.array(idx)] for c in caches])
        def per_row(caches=caches, lengths=lengths) -> list:
            # the store before stored_rows: per layer a gather and rotation, per row and
            # layer a slice, per row one concatenation of all layers
            from mlxcel.engine.cache.kvcache import rotate

            take = mx.array(idx)
            out = []
            for c in caches:
                k, v = c.keys[take], c.values[take]
                k = rotate(c.rope, k, [-(c.pads[i] + c.base) for i in idx])
                out.append([(k[j:j + 1, :, c.pads[i]:c.pads[i] + n],
                             v[j:j + 1, :, c.pads[i]:c.pads[i] + n])
                            for j, (i, n) in enumerate(zip(idx, lengths, strict=True))])
            return [mx.concatenate([layer[j][s] for layer in out])
                    for j in range(len(idx)) for s in (0, 1)]

        timed(f"[{trial}] store, per-row concatenation (old)", per_row)
        timed(f"[{trial}] store, stored_rows", lambda caches=caches, lengths=lengths: [
            a for r in stored_rows(caches, idx, lengths) for a in (r.keys, r.values)])
        hits = stored_rows(caches, idx, lengths)
        mx.eval([a for r in hits for a in (r.keys, r.values)])
        start = 32
        pads = [0] * len(hits)

        def hits_per_layer(hits=hits, start=start, pads=pads) -> list:
            # the prefill of a group of prompt-cache hits before the stacked from_prefixes:
            # per layer and row a slice and a pad, per layer a concatenation and a rotation
            from mlxcel.engine.cache.kvcache import rotate

            out = []
            for layer in range(layers):
                k = mx.concatenate([h.keys[layer][..., :start, :] for h in hits])
                v = mx.concatenate([h.values[layer][..., :start, :] for h in hits])
                out += [rotate(rope, k, pads), v]
            return out

        timed(f"[{trial}] {len(hits)} hits into a group, per layer (old)", hits_per_layer)
        timed(f"[{trial}] {len(hits)} hits into a group, from_prefixes",
              lambda hits=hits, start=start, pads=pads: [a for c in BatchCache.from_prefixes(
                  [(h.keys, h.values) for h in hits], pads, start, rope)
                  for a in (c.keys, c.values)])
        group = batch(8, 64 + trial)

        def join(caches=caches, group=group) -> list:
            for mine, theirs in zip(caches, group, strict=True):
                mine.extend(theirs)
            return [a for c in caches for a in c.state]

        timed(f"[{trial}] extend by 8 rows", join)
        size = (b + 8, 8, length + 256 + trial, 128)
        timed(f"[{trial}] zeros of the joined size x 64", lambda size=size: [
            mx.zeros(size, mx.bfloat16) for _ in range(64)])
        del caches, group
    return 0


if __name__ == "__main__":
    sys.exit(main())

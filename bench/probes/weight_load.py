"""How fast do a checkpoint's weights reach the device, and does another way of reading them
beat mlx-lm's? (issue #33: time-to-ready is mostly the weight load on some hosts.)

On CUDA, MLX's ``Load`` primitive reads each tensor on the evaluating thread into freshly
``malloc``ed host memory and copies it to the device from that pageable buffer, one tensor
after another. Each variant runs in its own process, after the files were read once
(warm page cache, so the disk is not what is timed), and reports seconds and GB/s:

- ``mlx_lm``: ``mlx_lm.utils.load_model`` as the server calls it (model built, weights
  evaluated);
- ``files``: ``mx.load`` of each file, evaluated file by file (the load alone);
- ``threads``: ``--threads`` threads, the tensors dealt out among them by size, each
  thread loading on its own new device stream and evaluating there (MLX releases the GIL
  in ``eval``, and each ``Load`` reads on the evaluating thread);
- ``numpy``: each file's tensors read through a NumPy memmap of the safetensors layout and
  turned into arrays with ``mx.array``, evaluated file by file;
- ``mlxcel``: the server's text loader (``mlxcel.builtin.text_loader.load``) with
  ``read_threads`` = ``--threads``: mlx-lm builds the model lazily and
  ``mlxcel.builtin.weight_reads`` reads the files in threads (``PYTHONPATH`` must reach
  ``core/src``).

``touch_s`` is the first device use of every tensor after the load (a sum of each): where
an array landed in host or managed memory, its move to the device is paid there.

Every variant's bytes are checked against ``files`` (one checksum per tensor), so a faster
variant that loaded something else is reported as wrong.

    python bench/probes/weight_load.py --checkpoint /tmp/bench-ckpts/llama-... \\
        --variants mlx_lm,files,threads,numpy --repeats 2 --out /tmp/weight_load.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time

CHILD = r"""
import json, pathlib, struct, sys, threading, time
import numpy as np
import mlx.core as mx
variant, path, THREADS = sys.argv[1], pathlib.Path(sys.argv[2]), int(sys.argv[3])
files = sorted(path.glob("model*.safetensors"))
DTYPES = {"BF16": (np.uint16, mx.bfloat16), "F16": (np.float16, None),
          "F32": (np.float32, None), "U32": (np.uint32, None), "I32": (np.int32, None)}

def numpy_file(f):
    raw = np.memmap(f, dtype=np.uint8, mode="r")
    n = struct.unpack("<Q", bytes(raw[:8]))[0]
    header = json.loads(bytes(raw[8:8 + n]))
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        npt, view = DTYPES[meta["dtype"]]
        arr = mx.array(raw[8 + n + start:8 + n + end].view(npt).reshape(meta["shape"]))
        out[name] = arr.view(view) if view is not None else arr
    return out

t0 = time.perf_counter()
if variant in ("mlx_lm", "mlxcel"):  # their imports (transformers) are not the load
    from mlx_lm.utils import load_model
    from mlx.utils import tree_flatten
if variant == "mlxcel":
    from mlxcel.builtin.text_loader import load as text_load
    from mlxcel.families.api import LoadOptions
imports = time.perf_counter() - t0
t0 = time.perf_counter()
weights = {}
if variant == "mlx_lm":
    model, _ = load_model(path)
    weights = dict(tree_flatten(model.parameters()))
elif variant == "mlxcel":
    loaded = text_load(path, LoadOptions(read_threads=THREADS))
    weights = dict(tree_flatten(loaded.model.model.parameters()))
elif variant == "files":
    for f in files:
        part = mx.load(str(f)); mx.eval(part); weights.update(part)
elif variant == "threads":  # THREADS threads, tensors dealt out by size, each its stream
    sizes = {(f, k): v.nbytes for f in files for k, v in mx.load(str(f)).items()}
    groups = [[] for _ in range(THREADS)]
    for i, key in enumerate(sorted(sizes, key=sizes.get, reverse=True)):
        groups[i % THREADS].append(key)
    parts = [None] * THREADS
    def one(i):
        s = mx.new_stream(mx.default_device())
        loaded = {f: mx.load(str(f), stream=s) for f in files}
        part = {k: loaded[f][k] for f, k in groups[i]}
        mx.eval(part); parts[i] = part
    threads = [threading.Thread(target=one, args=(i,)) for i in range(THREADS)]
    for t in threads: t.start()
    for t in threads: t.join()
    mx.synchronize()
    for p in parts: weights.update(p)
elif variant == "numpy":
    for f in files:
        part = numpy_file(f); mx.eval(part); weights.update(part)
mx.synchronize()
seconds = time.perf_counter() - t0
t0 = time.perf_counter()
mx.eval([mx.sum(v) for v in weights.values()])
touch = time.perf_counter() - t0
nbytes = sum(a.nbytes for a in weights.values())
sums = {k: float(mx.sum(v.astype(mx.float32)).item()) for k, v in sorted(weights.items())[:64]}
print(json.dumps({"variant": variant, "seconds": seconds, "touch_s": touch, "imports_s": imports, "bytes": nbytes,
                  "gb_s": nbytes / seconds / 1e9, "tensors": len(weights), "sums": sums}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--variants", default="mlx_lm,files,threads,numpy,mlxcel")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    path = pathlib.Path(args.checkpoint)
    files = sorted(path.glob("model*.safetensors"))
    t0 = time.perf_counter()
    nbytes = 0
    for f in files:  # the page cache, warmed: the disk is not what is timed
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 26):
                nbytes += len(chunk)
    report = {"checkpoint": str(path), "files": len(files), "bytes": nbytes,
              "page_cache_read_s": round(time.perf_counter() - t0, 2), "runs": []}
    for _ in range(args.repeats):
        for variant in args.variants.split(","):
            run = subprocess.run([sys.executable, "-c", CHILD, variant, str(path),
                                  str(args.threads)],
                                 capture_output=True, text=True)
            if run.returncode != 0:
                report["runs"].append({"variant": variant, "error": run.stderr[-1500:]})
            else:
                report["runs"].append(json.loads(run.stdout.strip().splitlines()[-1]))
            last = report["runs"][-1]
            print(variant, round(last.get("seconds", 0), 2), "s touch",
                  round(last.get("touch_s", 0), 2), "s",
                  round(last.get("gb_s", 0), 2), "GB/s", last.get("error", "")[-300:],
                  flush=True)
    ref = next((r["sums"] for r in report["runs"] if r.get("variant") == "files"), None)
    for r in report["runs"]:
        if ref is not None and "sums" in r:
            common = set(r["sums"]) & set(ref)
            r["same_bytes"] = bool(common) and all(
                abs(r["sums"][k] - ref[k]) <= 1e-3 * max(1.0, abs(ref[k])) for k in common)
        r.pop("sums", None)
    pathlib.Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

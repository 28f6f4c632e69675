"""Probe: does Qwen2.5-VL's vision tower run on MLX's CUDA backend, as mlx-vlm loads it and
as mlxcel's family loads it (``mlxcel_family_vlm.towers``)?

A tiny random-weight Qwen2.5-VL (``mlxcel.testing.vlm_checkpoints``) and one 56x56 image,
whose window grid is padded with windows of padding alone. Each loader runs in its own
child process, since the failure this asks about (a floating-point exception in
zero-length attention) ends the process; the answer is each child's exit status and, where
both finish, whether their features agree.

    PYTHONPATH=core/src:families/vlm/src python3 bench/probes/empty_windows.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

CHILD = r"""
import sys, numpy as np, mlx.core as mx
path, which = sys.argv[1], sys.argv[2]
if which == "mlx-vlm":
    from mlx_vlm.utils import load
    model, _ = load(path)
else:
    from mlxcel.families.api import LoadOptions
    from mlxcel_family_vlm.load import load
    model = load(__import__("pathlib").Path(path), LoadOptions()).model
grid = mx.array([[1, 4, 4]])
pixels = mx.array(np.random.default_rng(0).normal(size=(16, 1176)), dtype=mx.float32)
out = model.vision_tower(pixels, grid)
out = out[0] if isinstance(out, tuple) else out
mx.eval(out)
np.save(sys.argv[3], np.array(out.astype(mx.float32)))
print(mx.default_device(), tuple(out.shape))
"""


def main() -> None:
    from mlxcel.testing.vlm_checkpoints import cached_vlm_checkpoint

    root = tempfile.mkdtemp(prefix="empty-windows-")
    path = str(cached_vlm_checkpoint("qwen2_5_vl", cache_dir=root))
    result = {}
    for which in ("mlx-vlm", "mlxcel"):
        out = f"{root}/{which}.npy"
        done = subprocess.run([sys.executable, "-c", CHILD, path, which, out],
                              capture_output=True, text=True, timeout=300)
        result[which] = {"returncode": done.returncode,
                         "tail": (done.stdout + done.stderr).strip()[-300:]}
    if all(r["returncode"] == 0 for r in result.values()):
        import numpy as np

        a, b = (np.load(f"{root}/{w}.npy") for w in ("mlx-vlm", "mlxcel"))
        result["max_abs_difference"] = float(np.abs(a - b).max())
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

"""Probe: does Qwen2.5-VL's vision tower run on MLX's CUDA backend, as mlx-vlm builds it
and with the family's repair (``mlxcel_family_vlm.towers``), and do the two agree?

Two towers, each on one 448x448 image (a 32x32 patch grid): ``tiny``, the test recipe's
(``mlxcel.testing.vlm_checkpoints``, float32, loaded by each loader), and ``7b``,
mlx-vlm's default ``VisionConfig`` (Qwen2.5-VL-7B's tower: depth 32, width 1280, 16
heads of 80, windows of 112 px) in bfloat16 with random weights. mlx-vlm's windows at
this size repeat some boundaries (windows of padding alone). Each run is a child process,
since the failure this asks about (a crash in zero-length attention) ends the process;
the answer is each child's exit status, the boundaries it split at, and whether the
features agree.

    PYTHONPATH=core/src:families/vlm/src python3 bench/probes/empty_windows.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

CHILD = r"""
import pathlib, sys, numpy as np, mlx.core as mx
shape, which, path, out = sys.argv[1:5]
if shape == "tiny":
    if which == "mlx-vlm":
        from mlx_vlm.utils import load
        tower = load(path)[0].vision_tower
    else:
        from mlxcel.families.api import LoadOptions
        from mlxcel_family_vlm.load import load
        tower = load(pathlib.Path(path), LoadOptions()).model.vision_tower
    dtype, width = mx.float32, 1176
else:
    from mlx_vlm.models.qwen2_5_vl.config import VisionConfig
    from mlx_vlm.models.qwen2_5_vl.vision import VisionModel
    mx.random.seed(0)
    tower = VisionModel(VisionConfig(out_hidden_size=3584))
    tower.set_dtype(mx.bfloat16)
    if which == "mlxcel":
        from mlxcel_family_vlm.towers import repair
        repair(type("M", (), {"vision_tower": tower})())
    dtype, width = mx.bfloat16, 1176
grid = mx.array([[1, 32, 32]])
_, bounds = tower.get_window_index(grid)
pixels = mx.array(np.random.default_rng(0).normal(size=(1024, width)), dtype=dtype)
got = tower(pixels, grid)
got = got[0] if isinstance(got, tuple) else got
mx.eval(got)
np.save(out, np.array(got.astype(mx.float32)))
print(mx.default_device(), "bounds", bounds.size, "distinct", len(set(bounds.tolist())),
      "features", tuple(got.shape))
"""


def main() -> None:
    import numpy as np
    from mlxcel.testing.vlm_checkpoints import cached_vlm_checkpoint

    root = tempfile.mkdtemp(prefix="empty-windows-")
    path = str(cached_vlm_checkpoint("qwen2_5_vl", cache_dir=root))
    result: dict = {}
    for shape in ("tiny", "7b"):
        runs = result[shape] = {}
        for which in ("mlx-vlm", "mlxcel"):
            out = f"{root}/{shape}-{which}.npy"
            done = subprocess.run([sys.executable, "-c", CHILD, shape, which, path, out],
                                  capture_output=True, text=True, timeout=600)
            runs[which] = {"returncode": done.returncode,
                           "tail": (done.stdout + done.stderr).strip()[-300:]}
        if all(r["returncode"] == 0 for r in runs.values()):
            a, b = (np.load(f"{root}/{shape}-{w}.npy") for w in ("mlx-vlm", "mlxcel"))
            runs["max_abs_difference"] = float(np.abs(a - b).max())
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

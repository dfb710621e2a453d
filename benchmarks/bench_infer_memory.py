"""Peak memory of ``anysr infer --tile`` on big images (3000² and 6000² inputs, x2).

A random EDSR x2 (16 features, 1 block: the network's own memory is negligible, the image buffers are what is
measured) upscales a random 8-bit image with ``--tile 256``; the peak resident memory of the ``anysr`` process
(``ru_maxrss`` of the child) is reported with bytes per output pixel. ``--repo`` points at another checkout to
measure an older version the same way.

    PYTHONPATH=. python benchmarks/bench_infer_memory.py [--sizes 3000 6000] [--repo PATH]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[3000, 6000])
    ap.add_argument("--tile", type=int, default=256)
    ap.add_argument("--repo", default=str(ROOT), help="the checkout whose anysr is measured")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch

    from anysr.archs import build_network
    from anysr.engine.checkpoint import save_weights

    arch = {"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 16, "num_block": 1, "upscale": 2}
    print("| input | output | tile | peak RSS (MiB) | bytes per output pixel | seconds |")
    print("|---|---|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        weights = Path(tmp) / "edsr.safetensors"
        save_weights(weights, {"params": build_network(arch).state_dict()}, {"network_g": arch, "scale": 2})
        rng = np.random.default_rng(0)
        for size in args.sizes:
            img = Path(tmp) / f"in_{size}.png"
            pixels_in = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            cv2.imwrite(str(img), pixels_in, [cv2.IMWRITE_PNG_COMPRESSION, 1])
            out = Path(tmp) / f"out_{size}"
            cmd = [sys.executable, "-m", "anysr", "infer", "--weights", str(weights), "--arch", "EDSR",
                   "--arch-opt", "num_in_ch=3", "num_out_ch=3", "num_feat=16", "num_block=1", "upscale=2",
                   "-i", str(img), "-o", str(out),
                   "--tile", str(args.tile), "--precision", "fp32"]
            t0 = time.perf_counter()
            before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            proc = subprocess.run(cmd, cwd=args.repo, env={**os.environ, "PYTHONPATH": args.repo},
                                  capture_output=True, text=True)
            seconds = time.perf_counter() - t0
            peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            if proc.returncode != 0:
                print(f"| {size}² | failed: {proc.stderr.strip().splitlines()[-1]} |")
                continue
            if peak_kib <= before:
                print(f"| {size}² | (peak not above an earlier run's; run each size alone) |")
                continue
            pixels = (2 * size) ** 2
            print(f"| {size}² | {2 * size}² | {args.tile} | {peak_kib / 1024:.0f} | {peak_kib * 1024 / pixels:.1f} | "
                  f"{seconds:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Peak memory and time of ``anysr infer`` with a recurrent video network over long videos, whole vs in chunks.

A random BasicVSR x4 (16 features, 2 blocks, SPyNet inside) upscales a folder of random 8-bit frames into a
folder of frames, once with ``--chunk 0`` (the whole video in one pass) and once in temporal chunks
(``--chunk C --chunk-pad P``); the peak resident memory of the ``anysr`` process (``ru_maxrss`` of the child) and
the wall time (process start included) are reported. With chunks the peak should not grow with the number of frames.

    PYTHONPATH=. python benchmarks/bench_video_chunks.py [--frames 24 96] [--size 64] [--chunk 8] [--pad 2]
        [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def peak_run(cmd: list[str], threads: int) -> tuple[float, float]:
    """Run ``cmd`` in a fresh child (through a wrapper so each run has its own ``ru_maxrss``): MiB, seconds."""
    wrapper = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
               "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}, cwd=ROOT)
    kib, seconds = out.stdout.split()[-2:]
    return int(kib) / 1024, float(seconds)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, nargs="+", default=[24, 96])
    ap.add_argument("--size", type=int, default=64, help="frame side in LR pixels")
    ap.add_argument("--chunk", type=int, default=8)
    ap.add_argument("--pad", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads of the measured process (OMP_NUM_THREADS)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch

    from anysr.archs import build_network
    from anysr.engine.checkpoint import save_weights

    arch = {"type": "BasicVSR", "num_feat": 16, "num_block": 2}
    print(f"| frames ({args.size}x{args.size} -> x4) | chunk / pad | peak RSS (MiB) | seconds | frames/s |")
    print("|---:|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        weights = Path(tmp) / "basicvsr.safetensors"
        save_weights(weights, {"params": build_network(arch).state_dict()}, {"network_g": arch, "scale": 4})
        rng = np.random.default_rng(0)
        for n in args.frames:
            folder = Path(tmp) / f"in_{n}"
            folder.mkdir()
            for i in range(n):
                cv2.imwrite(str(folder / f"{i:08d}.png"), rng.integers(0, 256, (args.size, args.size, 3), np.uint8))
            for chunk, pad in ((0, 0), (args.chunk, args.pad)):
                out = Path(tmp) / f"out_{n}_{chunk}"
                cmd = [sys.executable, "-m", "anysr", "infer", "--weights", str(weights), "--arch", "BasicVSR",
                       "--arch-opt", "num_feat=16", "num_block=2", "-i", str(folder), "-o", str(out),
                       "--chunk", str(chunk), "--chunk-pad", str(pad), "--precision", "fp32", "--accelerator", "cpu"]
                mib, seconds = peak_run(cmd, args.threads)
                assert len(list(out.rglob("*.png"))) == n, out
                label = "whole video" if chunk == 0 else f"{chunk} / {pad}"
                print(f"| {n} | {label} | {mib:.0f} | {seconds:.1f} | {n / seconds:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

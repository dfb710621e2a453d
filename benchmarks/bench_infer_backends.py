"""Time per image of ``anysr infer``'s image path (read, forward, rounding; no file writing) for each ``--backend``.

Run from the repo root:
    PYTHONPATH=$PWD python benchmarks/bench_infer_backends.py [--image datasets/Set5/HR/bird.png] [--runs 3]

The network is SRVGGNetCompact x4 in its published realesr-general-x4v3 size (num_feat 64, num_conv 32, PReLU;
seeded random weights: the speed does not depend on the values). torch runs in fp32 NCHW (what the other backends
run), so the comparison is of the runtimes, not of precisions. The first (untimed) run of each backend includes
its session set-up; the export is made once before timing.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from anysr.accelerators import create_accelerator, resolve_plan
from anysr.archs import build_network
from anysr.engine.inference import backends
from anysr.engine.inference.images import InferSettings, process_image

OPT = {"type": "SRVGGNetCompact", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 64, "num_conv": 32, "upscale": 4,
       "act_type": "prelu"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default="datasets/Set5/HR/bird.png")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tile", type=int, default=0)
    args = ap.parse_args()
    os.environ.setdefault("ANYSR_CACHE_DIR", tempfile.mkdtemp(prefix="anysr_bench_"))
    torch.manual_seed(0)
    net = build_network(OPT).eval()
    acc = create_accelerator(resolve_plan("cpu", 1, precision="fp32", channels_last=False))
    acc.setup()
    model, how = backends.exported_model(net, OPT, 4)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {how}")
    runners = {"torch": net}
    for name in backends.RUNTIMES:
        if backends.missing_package(name) is None and model is not None:
            runners[name] = backends.RuntimeNetwork(name, model, in_channels=3, multiple=1)
    settings = InferSettings(scale=4, tile=args.tile or None, tile_pad=10)
    path = Path(args.image)
    for name, module in runners.items():
        process_image(module, path, acc, settings, 3)  # warm-up (session set-up)
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            process_image(module, path, acc, settings, 3)
            times.append(time.perf_counter() - t0)
        print(f"{name:12s} best {min(times):.2f} s  median {sorted(times)[len(times) // 2]:.2f} s per image "
              f"({args.runs} runs)")


if __name__ == "__main__":
    main()

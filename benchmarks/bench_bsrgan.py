"""Cost of BSRGAN's degradation models per sample in a loader process (anysr's pipeline on the CPU).

    PYTHONPATH=. python benchmarks/bench_bsrgan.py [--seeds 20] [--threads 1] [--size 320] [--gt 256]

KAIR's x4 setting: an HR square of ``--size`` (H_size 320) degraded, a ``--gt`` pair cropped (lq_patchsize 64).
Each seed draws another recipe (order, resize scales, kernels), so the spread is the real variation between
samples; prints best / median / worst ms of the recipe draw and of the whole pipeline, for bsrgan and bsrgan_plus.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import cv2
import torch

from anysr.data.degradation.bsrgan import BSRGAN, BSRGANPlus, BSRGANSettings, draw_rng
from anysr.data.transforms import img2tensor


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--size", type=int, default=320)
    ap.add_argument("--gt", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    img = cv2.imread("datasets/Set14/HR/baboon.png")
    img = cv2.copyMakeBorder(img, 0, max(0, args.size - img.shape[0]), 0, max(0, args.size - img.shape[1]),
                             cv2.BORDER_REFLECT_101)[: args.size, : args.size]
    hr = img2tensor(img)
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {args.threads} thread(s), "
          f"HR {args.size}x{args.size} -> GT {args.gt}, {args.seeds} seeds\n")
    print("| model | recipe draw ms (median) | pipeline ms best | median | worst |")
    print("|---|---:|---:|---:|---:|")
    for cls, extra in ((BSRGAN, {}), (BSRGANPlus, {"shuffle_prob": 0.1})):
        pipe = cls(BSRGANSettings(4, args.gt, degrade_size=args.size, **extra))
        pipe(hr, 10_000)  # warm-up
        draw_ms, run_ms = [], []
        for seed in range(args.seeds):
            t0 = time.perf_counter()
            pipe.draw(draw_rng(seed), (args.size, args.size))
            t1 = time.perf_counter()
            out = pipe(hr, seed)
            t2 = time.perf_counter()
            assert out["lq"].shape[-1] == args.gt // 4
            draw_ms.append((t1 - t0) * 1e3)
            run_ms.append((t2 - t1) * 1e3)
        print(f"| {pipe.name} | {statistics.median(draw_ms):.2f} | {min(run_ms):.1f} | "
              f"{statistics.median(run_ms):.1f} | {max(run_ms):.1f} |")


if __name__ == "__main__":
    main()

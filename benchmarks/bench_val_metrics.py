"""Cost of the validation metrics per image on the CPU: NIQE (host, numpy), LPIPS alex / vgg, DISTS, FID features.

    PYTHONPATH=. python benchmarks/bench_val_metrics.py [--side 256] [--batch 4] [--repeats 3] [--threads 2]

Random images of ``side`` x ``side``; LPIPS / DISTS / the FID Inception with their default (random) weights: the
time does not depend on the weights' values. The torch modules run on a batch of ``batch`` images under
``torch.no_grad`` (one warm-up call, then the best of ``repeats``); NIQE runs image by image as validation does
(``calculate_niqe`` with a 4-pixel border, Y channel). Prints milliseconds per image.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import torch

from anysr.metrics.backbones import FIDInceptionV3
from anysr.metrics.dists import DISTS
from anysr.metrics.lpips import LPIPS
from anysr.metrics.niqe import calculate_niqe


def best_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(args.batch, 3, args.side, args.side, generator=g)
    y = torch.rand(args.batch, 3, args.side, args.side, generator=g)
    imgs = [(t.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8) for t in x]
    rows: list[tuple[str, float]] = []
    rows.append(("NIQE (host, per image)",
                 best_ms(lambda: [calculate_niqe(im, 4) for im in imgs], args.repeats) / args.batch))
    modules: list[tuple[str, Callable[[], object]]] = []
    for net in ("alex", "vgg"):
        m = LPIPS(net=net)
        modules.append((f"LPIPS {net}", lambda m=m: m(x, y)))
    dists = DISTS()
    modules.append(("DISTS", lambda: dists(x, y)))
    inception = FIDInceptionV3()
    modules.append(("FID Inception features (one side)", lambda: inception(x)))
    with torch.no_grad():
        for name, fn in modules:
            rows.append((name, best_ms(fn, args.repeats) / args.batch))
    print(f"{args.side}x{args.side}, batch {args.batch}, {args.threads} threads, torch {torch.__version__}")
    print("| metric | ms / image |\n|---|---|")
    for name, ms in rows:
        print(f"| {name} | {ms:.1f} |")


if __name__ == "__main__":
    main()

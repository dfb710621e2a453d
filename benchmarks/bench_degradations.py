"""Cost of Real-ESRGAN's degradations: the JPEG paths, the operators and the whole second-order pipeline
(the reference one of ``tests/realesrgan_reference.py``).

    PYTHONPATH=. python benchmarks/bench_degradations.py [--accelerator cpu|cuda|mps|xla] [--iters 5] [--threads 1]

Prints a Markdown table of ms per call over ``--iters`` timed runs after one warm-up: the best (least
disturbed by other processes) and the median. Batch 12 (Real-ESRGAN x4plus's batch_size_per_gpu), GT 400x400
(its crop_pad_size), x4plus options; JPEG at 256x256 as the issue asks. The whole pipeline is timed over
``--iters`` different seeds (each draws other resize scales), so its spread is real, not noise.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from anysr.accelerators.launcher import create_accelerator, resolve_plan
from anysr.data.degradation.jpeg import jpeg_cv2
from anysr.data.degradation.realesrgan import BlurSettings, DegradeStage, sample_degradation_kernels
from anysr.ops.degradation import USMSharp, filter2d
from anysr.ops.diffjpeg import DiffJPEG
from tests.realesrgan_reference import second_order_degrade

KERNELS = ("iso", "aniso", "generalized_iso", "generalized_aniso", "plateau_iso", "plateau_aniso")
PROBS = (0.45, 0.25, 0.12, 0.03, 0.12, 0.03)
FIRST = BlurSettings(KERNELS, PROBS, (0.2, 3), (0.5, 4), (1, 2), 0.1)
SECOND = BlurSettings(KERNELS, PROBS, (0.2, 1.5), (0.5, 4), (1, 2), 0.1)
STAGE1 = DegradeStage((0.2, 0.7, 0.1), (0.15, 1.5), 0.5, (1, 30), (0.05, 3), 0.4, (30, 95))
STAGE2 = DegradeStage((0.3, 0.4, 0.3), (0.3, 1.2), 0.5, (1, 25), (0.05, 2.5), 0.4, (30, 95))


def _time(fn: Callable[[int], object], iters: int, sync: Callable[[], None]) -> list[float]:
    fn(-1)
    sync()
    times = []
    for i in range(iters):
        start = time.perf_counter()
        fn(i)
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--batch", type=int, default=12)
    parser.add_argument("--gt", type=int, default=400, help="GT size of the pipeline and the filters")
    parser.add_argument("--jpeg-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (1 is steadier on a loaded machine; default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    acc = create_accelerator(resolve_plan(args.accelerator, 1))
    acc.setup()
    dev = acc.device
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    print(f"device: {acc.describe()}; torch {torch.__version__}; threads {torch.get_num_threads()}; "
          f"{platform.processor() or platform.machine()}; load average {load:.1f}")
    print(f"batch {args.batch}; GT {args.gt}x{args.gt}; JPEG {args.jpeg_size}x{args.jpeg_size}; fp32; "
          f"{args.iters} timed runs after 1 warm-up\n")
    print("| operation | best ms | median ms |")
    print("|---|---:|---:|")

    def row(name: str, times: list[float]) -> None:
        print(f"| {name} | {min(times):.1f} | {statistics.median(times):.1f} |", flush=True)

    sync = acc.synchronize
    b, s, js = args.batch, args.gt, args.jpeg_size
    g = torch.Generator().manual_seed(0)
    imgs = [np.ascontiguousarray(np.random.default_rng(i).integers(0, 256, (js, js, 3), dtype=np.uint8))
            for i in range(b)]
    # smooth content (a real photo compresses faster than noise): upsampled random colours
    smooth = [np.ascontiguousarray(np.repeat(np.repeat(im[:: 16, :: 16], 16, 0), 16, 1)[:js, :js]) for im in imgs]
    row(f"OpenCV JPEG encode+decode, {b} uint8 images, noise content (loader, 1 process)",
        _time(lambda i: [jpeg_cv2(im, 30 + (5 * k) % 66) for k, im in enumerate(imgs)], args.iters, lambda: None))
    row(f"OpenCV JPEG encode+decode, {b} uint8 images, blocky content (loader, 1 process)",
        _time(lambda i: [jpeg_cv2(im, 30 + (5 * k) % 66) for k, im in enumerate(smooth)], args.iters, lambda: None))

    xj = torch.rand(b, 3, js, js, generator=g).to(dev)
    q = torch.linspace(30, 95, b).to(dev)
    jpeg = DiffJPEG(differentiable=False).to(dev)
    with torch.no_grad():
        row(f"DiffJPEG {b}x3x{js}x{js}, per-sample quality", _time(lambda i: jpeg(xj, q), args.iters, sync))

    x = torch.rand(b, 3, s, s, generator=g).to(dev)
    ks = [sample_degradation_kernels(np.random.default_rng([0, i]), first=FIRST, second=SECOND, final_sinc_prob=0.8,
                                     max_kernel_size=21) for i in range(b)]
    k1, k2, sinc = (torch.from_numpy(np.stack([k[n] for k in ks])).to(dev) for n in ("kernel1", "kernel2",
                                                                                    "sinc_kernel"))
    row("sample_degradation_kernels, per sample (numpy, loader)",
        [t / 50 for t in _time(lambda i: [sample_degradation_kernels(
            np.random.default_rng([1, i + 1, j]), first=FIRST, second=SECOND, final_sinc_prob=0.8, max_kernel_size=21)
            for j in range(50)], args.iters, lambda: None)])
    usm = USMSharp().to(dev)
    with torch.no_grad():
        row(f"filter2d {b}x3x{s}x{s}, per-sample 21x21", _time(lambda i: filter2d(x, k1), args.iters, sync))
        row(f"USMSharp {b}x3x{s}x{s} (two blurs)", _time(lambda i: usm(x), args.iters, sync))
        row(f"one USM blur, separable 51-tap passes, {b}x3x{s}x{s}", _time(lambda i: usm.blur(x), args.iters, sync))
        row(f"one USM blur as a 51x51 2-D filter (BasicSR's way), {b}x3x{s}x{s}",
            _time(lambda i: filter2d(x, usm.kernel), max(1, args.iters // 2), sync))

        def pipeline(i: int) -> torch.Tensor:
            gen = torch.Generator(device=dev) if dev.type in ("cpu", "cuda", "mps") else torch.Generator()
            gen.manual_seed(i + 1)
            return second_order_degrade(usm(x), k1, k2, sinc, scale=4, first=STAGE1, second=STAGE2,
                                        second_blur_prob=0.8, rng=np.random.default_rng(i + 1), generator=gen,
                                        jpeger=jpeg)

        times = _time(pipeline, args.iters, sync)
        row(f"USM + second_order_degrade, {b}x3x{s}x{s} -> x4 ({args.iters} seeds)", times)
    acc.teardown()


if __name__ == "__main__":
    main()

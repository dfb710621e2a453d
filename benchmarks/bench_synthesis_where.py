"""Where Real-ESRGAN's synthesis is cheaper on this CPU: in the training step (one batch) or in the loader (per sample).

    PYTHONPATH=. python benchmarks/bench_synthesis_where.py [--batch 12] [--gt 400] [--iters 3] [--threads 1]

Both paths run :func:`anysr.data.degradation.realesrgan.synthesise` with Real-ESRGAN x4plus's settings
(RealESRGANModel: USM first, then the second-order degradation, the 256 crop or --gt if smaller): ``degrade_in:
step`` on a batch of ``--batch`` GT images with one set of batch choices; ``degrade_in: loader`` as a DataLoader
worker does, one ``LoaderSynthesis`` call per sample. Prints ms per sample (best and median over ``--iters``
batches, each with other seeds) of process CPU time (what a core spends; on a loaded machine the wall time mostly
measures the other processes) and the median wall time. Loader workers spend it in parallel with the step, the step
spends it in series.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

from anysr.data.degradation.realesrgan import (
    BlurSettings,
    LoaderSynthesis,
    SynthesisSettings,
    draw_batch_choices,
    sample_degradation_kernels,
    step_rng,
    synthesise,
)
from anysr.ops.degradation import USMSharp
from anysr.ops.diffjpeg import DiffJPEG
from anysr.options.realesrgan import X4PLUS_MODEL

KERNELS = ("iso", "aniso", "generalized_iso", "generalized_aniso", "plateau_iso", "plateau_aniso")
PROBS = (0.45, 0.25, 0.12, 0.03, 0.12, 0.03)
FIRST = BlurSettings(KERNELS, PROBS, (0.2, 3), (0.5, 4), (1, 2), 0.1)
SECOND = BlurSettings(KERNELS, PROBS, (0.2, 1.5), (0.5, 4), (1, 2), 0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=12)
    parser.add_argument("--gt", type=int, default=400)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = SynthesisSettings.from_options({**X4PLUS_MODEL, "scale": 4, "gt_size": min(256, args.gt)})
    b, s = args.batch, args.gt
    print(f"torch {torch.__version__}; threads {torch.get_num_threads()}; load average {os.getloadavg()[0]:.1f}; "
          f"batch {b}; GT {s}x{s}; x4plus settings; {args.iters} batches after 1 warm-up\n")
    usm, jpeger = USMSharp(), DiffJPEG(differentiable=False)
    loader = LoaderSynthesis(settings, sharpen_input=True, keep_sharpened=False)

    def batch(i: int) -> tuple[torch.Tensor, list[torch.Tensor], list[int]]:
        g = torch.Generator().manual_seed(i + 10)
        gt = torch.nn.functional.interpolate(torch.rand(b, 3, s // 8, s // 8, generator=g), size=(s, s),
                                             mode="bicubic", align_corners=False).clamp(0, 1)
        ks = [sample_degradation_kernels(np.random.default_rng([i + 10, j]), first=FIRST, second=SECOND,
                                         final_sinc_prob=0.8, max_kernel_size=21) for j in range(b)]
        kernels = [torch.from_numpy(np.stack([k[n] for k in ks])) for n in ("kernel1", "kernel2", "sinc_kernel")]
        return gt, kernels, [1000 * (i + 10) + j for j in range(b)]

    def step(i: int) -> None:
        gt, kernels, seeds = batch(i)
        choices = draw_batch_choices(step_rng(0, i + 10, 0), settings, (s, s))
        synthesise(gt, kernels, settings=settings, choices=choices, seeds=seeds, gens=[torch.Generator() for _ in
                                                                                       seeds],
                   usm=usm, jpeger=jpeger, sharpen_input=True, keep_sharpened=False)

    def per_sample(i: int) -> None:
        gt, kernels, seeds = batch(i)
        for j in range(b):
            loader(gt[j], [k[j] for k in kernels], seeds[j])

    print("| where | CPU ms / sample, best | median | wall ms / sample, median |")
    print("|---|---:|---:|---:|")
    with torch.no_grad():
        for name, fn in (("step (one batch)", step), ("loader (one sample at a time)", per_sample)):
            fn(-1)
            cpu, wall = [], []
            for i in range(args.iters):
                c0, t0 = time.process_time(), time.perf_counter()
                fn(i)
                cpu.append((time.process_time() - c0) * 1e3 / b)
                wall.append((time.perf_counter() - t0) * 1e3 / b)
            print(f"| {name} | {min(cpu):.0f} | {statistics.median(cpu):.0f} | {statistics.median(wall):.0f} |",
                  flush=True)


if __name__ == "__main__":
    main()

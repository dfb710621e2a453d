"""Time one BasicSR 1.4.2 training (``benchmarks/bench_gpu.py`` starts it with BasicSR's Python).

    python benchmarks/basicsr_runner.py OPTIONS.yml ROOT

Runs BasicSR's own ``basicsr.train.train_pipeline`` on ``OPTIONS.yml`` (experiments under ``ROOT``) and records
when each ``optimize_parameters`` call starts and how long each fetch from BasicSR's prefetcher waits. Prints one
line ``BASICSR_RUNNER {json}``: the mean iteration and data wait over the second half of the run (warm-up left
out, as anysr's last log window), and the peak CUDA memory. Nothing of BasicSR is changed but one import:
torchvision >= 0.17 removed ``torchvision.transforms.functional_tensor``, which BasicSR 1.4.2 imports at start-up
for a function its training never calls; the module is aliased to ``torchvision.transforms.functional``.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    options, root = sys.argv[1], sys.argv[2]
    import torchvision.transforms.functional as tf  # noqa: PLC0415

    sys.modules.setdefault("torchvision.transforms.functional_tensor", tf)
    import torch  # noqa: PLC0415
    from basicsr.data import prefetch_dataloader  # noqa: PLC0415
    from basicsr.models.sr_model import SRModel  # noqa: PLC0415
    from basicsr.train import train_pipeline  # noqa: PLC0415

    starts: list[float] = []
    waits: list[float] = []
    optimize, fetch = SRModel.optimize_parameters, prefetch_dataloader.CPUPrefetcher.next

    def timed_optimize(self: SRModel, current_iter: int) -> None:
        starts.append(time.perf_counter())
        optimize(self, current_iter)

    def timed_next(self: prefetch_dataloader.CPUPrefetcher) -> object:
        t0 = time.perf_counter()
        try:
            return fetch(self)
        finally:
            waits.append(time.perf_counter() - t0)

    SRModel.optimize_parameters = timed_optimize  # type: ignore[method-assign]
    prefetch_dataloader.CPUPrefetcher.next = timed_next  # type: ignore[method-assign]
    sys.argv = [sys.argv[0], "-opt", options]
    train_pipeline(root)
    # from the start of the middle iteration to the start of the last: whole iterations, no final save
    half = len(starts) // 2
    n = len(starts) - 1 - half
    if n < 1:
        raise SystemExit(f"basicsr_runner: only {len(starts)} iterations ran; give train.total_iter >= 4")
    # waits[i] is the fetch before iteration i (the first one before the loop): those between the timed starts
    steady_waits = waits[half + 1:half + 1 + n]
    result = {"iterations": len(starts), "ms_per_iter": (starts[-1] - starts[half]) / n * 1e3,
              "data_ms": sum(steady_waits) / max(len(steady_waits), 1) * 1e3,
              "peak_mib": (torch.cuda.max_memory_allocated() / 2**20) if torch.cuda.is_available() else None}
    print("BASICSR_RUNNER " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

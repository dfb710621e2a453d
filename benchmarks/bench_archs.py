"""Forward speed of each architecture at its default size on a 64x64 input (inference, batch 1).

    PYTHONPATH=. python benchmarks/bench_archs.py [--accelerator cpu|cuda|mps|xla] [--iters 5] [--size 64]

Prints a Markdown table of ms per forward over ``--iters`` timed runs after ``--warmup`` runs: the best
(least disturbed by other processes, the number to compare) and the median.
The device comes from anysr.accelerators, so the same command times every backend.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from anysr.accelerators.launcher import create_accelerator, resolve_plan
from anysr.archs import build_network

# Each architecture with BasicSR's defaults (only the required channel counts given).
DEFAULTS: dict[str, dict] = {
    "MSRResNet": {"type": "MSRResNet"},
    "EDSR": {"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3},
    "RCAN": {"type": "RCAN", "num_in_ch": 3, "num_out_ch": 3},
    "RRDBNet": {"type": "RRDBNet", "num_in_ch": 3, "num_out_ch": 3},
    "SRVGGNetCompact": {"type": "SRVGGNetCompact"},
    "SwinIR": {"type": "SwinIR"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=None, help="subset of: " + ", ".join(DEFAULTS))
    args = parser.parse_args()

    acc = create_accelerator(resolve_plan(args.accelerator, 1))
    acc.setup()
    dev = acc.device
    print(f"device: {acc.describe()}; torch {torch.__version__}; threads {torch.get_num_threads()}; "
          f"{platform.processor() or platform.machine()}")
    print(f"input 1x3x{args.size}x{args.size}, fp32, no_grad; "
          f"{args.iters} timed runs after {args.warmup} warm-up\n")
    print("| arch | params (M) | output | best ms / forward | median ms |")
    print("|---|---:|---|---:|---:|")
    torch.manual_seed(0)
    for name, opt in DEFAULTS.items():
        if args.only and name not in args.only:
            continue
        net = build_network(dict(opt)).eval().to(dev)
        params = sum(p.numel() for p in net.parameters()) / 1e6
        x = torch.rand(1, 3, args.size, args.size).to(dev)
        times = []
        with torch.no_grad():
            for i in range(args.warmup + args.iters):
                acc.synchronize()
                start = time.perf_counter()
                out = net(x)
                acc.mark_step()
                acc.synchronize()
                if i >= args.warmup:
                    times.append((time.perf_counter() - start) * 1e3)
        shape = "x".join(str(s) for s in out.shape)
        print(f"| {name} | {params:.2f} | {shape} | {min(times):.1f} | {statistics.median(times):.1f} |",
              flush=True)
    acc.teardown()


if __name__ == "__main__":
    main()

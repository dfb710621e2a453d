"""Window-attention archs at published sizes on a 64x64 LR input: parameters, FLOPs, fp32 and bf16 forward time.

    PYTHONPATH=. python benchmarks/bench_attention_archs.py [--accelerator cpu|cuda|mps|xla] [--iters 3]

Prints a Markdown table: parameters, GFLOPs of one forward (``anysr.engine.bench.forward_flops``: Conv2d and
Linear only, attention matmuls not counted), and ms per forward (best / median of ``--iters`` timed runs after
``--warmup``) in fp32 and under bf16 autocast. Batch 1, ``torch.no_grad()``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from anysr.accelerators import Accelerator
from anysr.accelerators.launcher import create_accelerator, resolve_plan
from anysr.archs import build_network
from anysr.engine.bench import forward_flops

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "archs"))
from cards import PUBLISHED  # noqa: E402

# The authors' option files (x4), from the one table of networks (tests/archs/cards.py).
CONFIGS: dict[str, dict] = {name: PUBLISHED[name][0] for name in ("HAT-S", "HAT", "DAT-light", "DAT-S", "DRCT")}


def _time(net: torch.nn.Module, x: torch.Tensor, acc: Accelerator, iters: int, warmup: int,
          bf16: bool) -> list[float]:
    times = []
    ctx = torch.autocast(x.device.type, dtype=torch.bfloat16) if bf16 else torch.autocast(x.device.type,
                                                                                          enabled=False)
    with torch.no_grad(), ctx:
        for i in range(warmup + iters):
            acc.synchronize()
            start = time.perf_counter()
            net(x)
            acc.mark_step()
            acc.synchronize()
            if i >= warmup:
                times.append((time.perf_counter() - start) * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=None, help="subset of: " + ", ".join(CONFIGS))
    args = parser.parse_args()

    acc = create_accelerator(resolve_plan(args.accelerator, 1))
    acc.setup()
    dev = acc.device
    print(f"device: {acc.describe()}; torch {torch.__version__}; threads {torch.get_num_threads()}; "
          f"{platform.processor() or platform.machine()}")
    print(f"input 1x3x{args.size}x{args.size}, no_grad; {args.iters} timed runs after {args.warmup} warm-up\n")
    print("| arch | params (M) | GFLOPs | output | tile_multiple | fp32 best / median ms | bf16 best / median ms |")
    print("|---|---:|---:|---|---:|---:|---:|")
    torch.manual_seed(0)
    for name, opt in CONFIGS.items():
        if args.only and name not in args.only:
            continue
        net = build_network(dict(opt)).eval()
        params = sum(p.numel() for p in net.parameters()) / 1e6
        flops, out_shape = forward_flops(net, (1, 3, args.size, args.size))
        net = net.to(dev)
        x = torch.rand(1, 3, args.size, args.size).to(dev)
        cells = []
        for bf16 in (False, True):
            t = _time(net, x, acc, args.iters, args.warmup, bf16)
            cells.append(f"{min(t):.0f} / {statistics.median(t):.0f}")
        shape = "x".join(str(s) for s in out_shape)
        print(f"| {name} | {params:.2f} | {flops / 1e9:.1f} | {shape} | {net.tile_multiple} | {cells[0]} | "
              f"{cells[1]} |", flush=True)
    acc.teardown()


if __name__ == "__main__":
    main()

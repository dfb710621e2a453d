"""Every image architecture (and clip network, on 5-frame clips) at a published size: parameters, FLOPs, one
training step and a 256x256 inference.

    PYTHONPATH=. python benchmarks/bench_all_archs.py [--accelerator cpu|cuda|mps|xla] [--iters 3] [--only HAT DAT-S]

Prints one Markdown table row per architecture as it finishes:

- params: trainable parameters of the training form, and (where they differ: SPAN, ECBSR) those of the modules
  that one inference forward of the deployed form runs.
- GFLOPs: one forward for a 256x256 output (``anysr.engine.bench.forward_flops``: Conv2d and Linear,
  2 x multiply-adds; attention matmuls not counted).
- train ms: one step (forward, L1 loss, backward, Adam step) on batch 1 with a 128x128 GT crop (32x32 LQ at x4,
  128x128 at x1), training mode, fp32 and under bf16 autocast.
- infer ms: one forward for a 256x256 output (64x64 LQ at x4, 256x256 at x1), eval mode, ``torch.no_grad()``.

Each time is the best of ``--iters`` timed runs after ``--warmup`` (the least disturbed; the median is printed
too). The load average at each row's start is printed, so disturbed rows can be told apart.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from anysr.accelerators import Accelerator
from anysr.accelerators.launcher import create_accelerator, resolve_plan
from anysr.archs import build_network
from anysr.engine.bench import forward_flops

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "archs"))
from cards import PUBLISHED as CONFIGS  # noqa: E402 - the one table of networks (tests/archs/cards.py)
from cards import PUBLISHED_FRAMES as FRAMES  # noqa: E402

OUT_SIZE = 256
GT_CROP = 128



def _input(in_ch: int, side: int, frames: int = 0) -> tuple[int, ...]:
    """One image (1, c, side, side), or one clip (1, frames, c, side, side) for a clip network."""
    return (1, frames, in_ch, side, side) if frames else (1, in_ch, side, side)


def _precision(device: torch.device, bf16: bool) -> contextlib.AbstractContextManager:
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)


def _timed(fn: Callable[[], Any], acc: Accelerator, iters: int, warmup: int) -> list[float]:
    times = []
    for i in range(warmup + iters):
        acc.synchronize()
        start = time.perf_counter()
        fn()
        acc.mark_step()
        acc.synchronize()
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
    return times


def _train_times(net: nn.Module, acc: Accelerator, scale: int, in_ch: int, iters: int, warmup: int,
                 bf16: bool, frames: int = 0) -> list[float]:
    net.train()
    optim = torch.optim.Adam([p for p in net.parameters() if p.requires_grad], lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    lq = acc.to_device(torch.rand(_input(in_ch, GT_CROP // scale, frames), generator=gen))
    gt = acc.to_device(torch.rand(1, in_ch, GT_CROP, GT_CROP, generator=gen))

    def step() -> None:
        optim.zero_grad(set_to_none=True)
        with _precision(lq.device, bf16):
            loss = F.l1_loss(net(lq).float(), gt)
        loss.backward()
        optim.step()

    return _timed(step, acc, iters, warmup)


def _infer_times(net: nn.Module, x: torch.Tensor, acc: Accelerator, iters: int, warmup: int,
                 bf16: bool) -> list[float]:
    def forward() -> None:
        with torch.no_grad(), _precision(x.device, bf16):
            net(x)

    return _timed(forward, acc, iters, warmup)


def _deployed(net: nn.Module) -> nn.Module:
    """The inference form: ECBSR re-parameterised, SPAN in eval mode (its convs folded)."""
    net = copy.deepcopy(net).eval()
    if hasattr(net, "reparameterize"):
        net.reparameterize()
    return net


def _used_params(net: nn.Module, x: torch.Tensor) -> int:
    """Parameters of the modules one forward of ``net`` runs (SPAN's eval form skips its unfolded chains)."""
    called: set[nn.Module] = set()
    handles = [m.register_forward_hook(lambda mod, _i, _o: called.add(mod)) for m in net.modules()]
    try:
        with torch.no_grad():
            net(x)
    finally:
        for h in handles:
            h.remove()
    return sum(p.numel() for m in called for p in m.parameters(recurse=False))


def _cell(times: list[float]) -> str:
    return f"{min(times):.0f} / {statistics.median(times):.0f}" if min(times) >= 10 else \
        f"{min(times):.1f} / {statistics.median(times):.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=None, help="subset (run in this order) of: " + ", ".join(CONFIGS))
    args = parser.parse_args()

    acc = create_accelerator(resolve_plan(args.accelerator, 1))
    acc.setup()
    print(f"device: {acc.describe()}; torch {torch.__version__}; threads {torch.get_num_threads()}; "
          f"{platform.processor() or platform.machine()}; {args.iters} timed runs after {args.warmup} warm-up; "
          f"cells: best / median ms\n")
    print("| arch | scale | params (M) train / deployed | GFLOPs (256² out) | train fp32 | train bf16 | "
          "infer fp32 | infer bf16 | load |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    unknown = [n for n in args.only or [] if n not in CONFIGS]
    if unknown:
        parser.error(f"unknown --only names {unknown}; choose from: {', '.join(CONFIGS)}")
    for name in args.only or list(CONFIGS):  # in the order given
        opt, scale, in_ch = CONFIGS[name]
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        torch.manual_seed(0)
        net = build_network(dict(opt))
        params = sum(p.numel() for p in net.parameters() if p.requires_grad) / 1e6
        deployed = _deployed(net)
        in_size = OUT_SIZE // scale
        frames = FRAMES.get(name, 0)
        params_dep = _used_params(deployed, torch.rand(_input(in_ch, 64 // scale, frames))) / 1e6
        flops, _ = forward_flops(deployed, _input(in_ch, in_size, frames))
        net, deployed = net.to(acc.device), deployed.to(acc.device)
        x = acc.to_device(torch.rand(_input(in_ch, in_size, frames), generator=torch.Generator().manual_seed(1)))
        train = [_cell(_train_times(net, acc, scale, in_ch, args.iters, args.warmup, bf16, frames))
                 for bf16 in (False, True)]
        infer = [_cell(_infer_times(deployed, x, acc, args.iters, args.warmup, bf16)) for bf16 in (False, True)]
        shown = f"{params:.3f}" if abs(params - params_dep) < 5e-4 else f"{params:.3f} / {params_dep:.3f}"
        print(f"| {name} | x{scale} | {shown} | {flops / 1e9:.1f} | {train[0]} | {train[1]} | {infer[0]} | "
              f"{infer[1]} | {load:.1f} |", flush=True)
        del net, deployed
    acc.teardown()


if __name__ == "__main__":
    main()

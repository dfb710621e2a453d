"""Time and peak memory of the pure-PyTorch DCNv2 against naive variants, for an EDVR-sized layer.

    PYTHONPATH=. python benchmarks/bench_dcn.py [--batch 1 5] [--size 64] [--iters 5] [--threads 2]

Layer: 64 -> 64 channels, 3x3, padding 1, 8 deformable groups, offsets ~ N(0, 2) pixels, sigmoid mask (what
EDVR's PCD alignment runs at its finest level). Variants:

* ``pure``: ``anysr.ops.dcn.modulated_deform_conv2d(backend='pure')`` (4 gathers build the whole column matrix,
  one matmul);
* ``tap-loop``: one ``F.grid_sample`` per kernel tap, each tap's samples multiplied into the output as they
  come (the column matrix never exists);
* ``grid-sample-cols``: one ``F.grid_sample`` over all taps builds the column matrix, then one matmul (the
  unfold-like variant with PyTorch's sampler instead of gathers).

Each (variant, mode, batch) runs in a fresh subprocess: peak memory is the growth of the process's maximum
resident set during the first call (``ru_maxrss`` minus the resident set before it), time is the best and the
median of ``--iters`` calls after one warm-up. Modes: ``fwd`` (inference, no_grad) and ``fwd+bwd`` (gradients of
input, offset, mask and weight). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import torch
from torch.nn import functional as F

from anysr.ops.dcn import modulated_deform_conv2d

C, DG, K = 64, 8, 3
VARIANTS = ("pure", "tap-loop", "grid-sample-cols")
MODES = ("fwd", "fwd+bwd")


def _tap_grids(offset: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Normalised grid_sample coordinates (b * dg, kk * h, w, 2) of every tap (stride 1, padding 1)."""
    b = offset.shape[0]
    off = offset.view(b, DG, K * K, 2, h, w)
    ty = torch.arange(K).repeat_interleave(K).view(K * K, 1, 1).float() - 1
    tx = torch.arange(K).repeat(K).view(K * K, 1, 1).float() - 1
    py = off[:, :, :, 0] + ty + torch.arange(h).view(1, h, 1).float()
    px = off[:, :, :, 1] + tx + torch.arange(w).view(1, 1, w).float()
    grid = torch.stack((2 * px / (w - 1) - 1, 2 * py / (h - 1) - 1), dim=-1)  # (b, dg, kk, h, w, 2)
    return grid.view(b * DG, K * K * h, w, 2)


def tap_loop(x: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor,
             bias: torch.Tensor) -> torch.Tensor:
    b, c, h, w = x.shape
    grid = _tap_grids(offset, h, w).view(b * DG, K * K, h, w, 2)
    m = mask.view(b, DG, K * K, h, w)
    xs = x.reshape(b * DG, c // DG, h, w)
    out = bias.view(1, -1, 1, 1).expand(b, -1, h, w)
    for k in range(K * K):
        s = F.grid_sample(xs, grid[:, k], mode="bilinear", padding_mode="zeros", align_corners=True)
        s = s.view(b, DG, c // DG, h, w) * m[:, :, k].unsqueeze(2)
        out = out + torch.einsum("oc,bchw->bohw", weight[:, :, k // K, k % K], s.view(b, c, h, w))
    return out


def grid_sample_cols(x: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor) -> torch.Tensor:
    b, c, h, w = x.shape
    s = F.grid_sample(x.reshape(b * DG, c // DG, h, w), _tap_grids(offset, h, w), mode="bilinear",
                      padding_mode="zeros", align_corners=True)  # (b * dg, c / dg, kk * h, w)
    cols = s.view(b, DG, c // DG, K * K, h * w) * mask.view(b, DG, 1, K * K, h * w)
    out = torch.matmul(weight.view(weight.shape[0], c * K * K), cols.view(b, c * K * K, h * w))
    return out.view(b, -1, h, w) + bias.view(1, -1, 1, 1)


def pure(x: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor,
         bias: torch.Tensor) -> torch.Tensor:
    return modulated_deform_conv2d(x, offset, mask, weight, bias, 1, 1, 1, backend="pure")


FUNCS = {"pure": pure, "tap-loop": tap_loop, "grid-sample-cols": grid_sample_cols}


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _inputs(batch: int, size: int, grad: bool) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, C, size, size, generator=g)
    offset = torch.randn(batch, 2 * DG * K * K, size, size, generator=g) * 2
    mask = torch.sigmoid(torch.randn(batch, DG * K * K, size, size, generator=g))
    weight = torch.randn(C, C, K, K, generator=g) * 0.05
    bias = torch.randn(C, generator=g)
    ts = [x, offset, mask, weight, bias]
    return [t.requires_grad_(grad and i < 4) for i, t in enumerate(ts)]


def run_one(variant: str, mode: str, batch: int, size: int, iters: int) -> dict:
    """One measurement (runs in its own process)."""
    fn = FUNCS[variant]
    grad = mode == "fwd+bwd"
    ts = _inputs(batch, size, grad)

    def call() -> torch.Tensor:
        if not grad:
            with torch.no_grad():
                return fn(*ts)
        for t in ts:
            t.grad = None
        out = fn(*ts)
        out.square().mean().backward()
        return out

    before = _rss_kib()
    out = call()
    peak_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    ref = pure(*[t.detach() for t in ts])
    diff = (out.detach() - ref).abs().max().item()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1000)
    return {"best_ms": min(times), "median_ms": statistics.median(times), "peak_mib": peak_mib, "diff": diff}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--one", nargs=3, metavar=("VARIANT", "MODE", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.one:
        variant, mode, batch = args.one
        print(json.dumps(run_one(variant, mode, int(batch), args.size, args.iters)))
        return
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {args.threads} threads, "
          f"{C} channels, {DG} deformable groups, {args.size}x{args.size}\n")
    print("| batch | mode | variant | best ms | median ms | peak MiB | max abs diff vs pure |")
    print("|---|---|---|---|---|---|---|")
    for batch in args.batch:
        for mode in MODES:
            for variant in VARIANTS:
                cmd = [sys.executable, __file__, "--one", variant, mode, str(batch), "--size", str(args.size),
                       "--iters", str(args.iters), "--threads", str(args.threads)]
                r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
                print(f"| {batch} | {mode} | {variant} | {r['best_ms']:.1f} | {r['median_ms']:.1f} | "
                      f"{r['peak_mib']:.0f} | {r['diff']:.1e} |", flush=True)


if __name__ == "__main__":
    main()

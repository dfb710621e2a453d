"""``anysr bench``: how fast one worker trains and infers, with the real model, optimiser and loss.

The training step runs on a synthetic batch of the configured crop and batch size that stays on the device, so
the number measures compute (forward, backward, optimiser step, EMA) and not data loading. Every timed step
ends with ``mark_step`` (XLA runs its graph there) and ``synchronize`` (queued device work finishes), so the
times are honest on asynchronous devices too.

FLOPs are counted with forward hooks on ``nn.Conv2d`` and ``nn.Linear`` (2 x multiply-adds; a training step
is taken as 3 x the forward). Attention matmuls, normalisation and element-wise operations are not counted,
so for transformer archs the GFLOP/s figure is a lower bound.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from anysr.accelerators import Accelerator
from anysr.archs import build_network
from anysr.archs.arch_util import input_channels
from anysr.atomic import atomic_write_json
from anysr.data.transforms import lq_patch_size
from anysr.engine import checkpoint as ckpt
from anysr.engine.evaluation.forward import run_network
from anysr.errors import OptionError, TrainingError
from anysr.models import build_model

MAX_BESIDE = 16  # --beside: copies at most (each is a whole training process)
MAX_INFER_SIZE = 4096  # --infer-size: one untiled image; larger ones belong to `anysr infer --tile`
STOP_GRACE_S = 5.0  # --beside: seconds a copy has to end after SIGTERM before SIGKILL
FLOPS_COUNTED = ("nn.Conv2d and nn.Linear: 2 x multiply-adds per forward, x3 for a training step "
                 "(forward + backward); attention matmuls and element-wise ops are not counted")


# ---------------------------------------------------------------- FLOPs
def _layer_macs(module: nn.Module, out: torch.Tensor) -> int:
    if isinstance(module, nn.Conv2d):
        kh, kw = module.kernel_size
        return out.numel() * (module.in_channels // module.groups) * kh * kw
    if isinstance(module, nn.Linear):
        return out.numel() * module.in_features
    return 0


def _count(net: nn.Module, x: torch.Tensor) -> tuple[int, tuple[int, ...]]:
    total = [0]

    def hook(module: nn.Module, _inputs: Any, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            total[0] += _layer_macs(module, out)

    handles = [m.register_forward_hook(hook) for m in net.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    try:
        with torch.no_grad():
            y = net(x)
    finally:
        for h in handles:
            h.remove()
    return 2 * total[0], tuple(y.shape)


def forward_flops(net: nn.Module, shape: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """FLOPs of one forward of a CPU network ``net`` on an input of ``shape`` (Conv2d + Linear only) and the
    output shape. ``net`` is not changed.

    Runs on a copy on the ``meta`` device (shapes only, no arithmetic); an arch that the meta device cannot
    run is counted on a CPU copy instead.
    """
    try:
        return _count(copy.deepcopy(net).eval().to("meta"), torch.empty(shape, device="meta"))
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        return _count(copy.deepcopy(net).eval().float(), torch.zeros(shape))


# ---------------------------------------------------------------- timing
def time_steps(fn: Callable[[], Any], acc: Accelerator, iters: int, warmup: int) -> tuple[list[float], Any]:
    """Seconds of each of ``iters`` calls of ``fn`` after ``warmup`` untimed ones, and the last result.

    Each call is followed by ``mark_step`` and ``synchronize``, inside the timed span.
    """
    result = None
    for _ in range(warmup):
        result = fn()
        acc.mark_step()
    acc.synchronize()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        result = fn()
        acc.mark_step()
        acc.synchronize()
        times.append(time.perf_counter() - t0)
    return times, result


def _summary(times: list[float]) -> dict[str, float]:
    return {"median": statistics.median(times), "mean": statistics.fmean(times), "best": min(times)}


def _train_crop(opt: Any) -> tuple[int, int, int]:
    """(batch per device, GT crop, accumulate) from the options' train dataset."""
    keys = [k for k in opt.datasets if k.startswith("train")]
    if len(keys) != 1:
        raise OptionError(f"datasets: anysr bench needs exactly one train dataset (for its batch size and "
                          f"gt_size), found {keys or 'none'}")
    dopt = opt.datasets[keys[0]]
    if not dopt.gt_size:
        raise OptionError(f"datasets.{keys[0]}.gt_size: anysr bench needs the training crop size; set it, e.g. "
                          f"--force_yml datasets.{keys[0]}.gt_size=96")
    if not dopt.batch_size_per_gpu:
        raise OptionError(f"datasets.{keys[0]}.batch_size_per_gpu: anysr bench needs the batch size; set it")
    return int(dopt.batch_size_per_gpu), int(dopt.gt_size), int(opt.train.accumulate)


# ---------------------------------------------------------------- the worker
def bench_worker(acc: Accelerator, opt: dict[str, Any], iters: int, warmup: int, infer_size: int,
                 infer_iters: int) -> dict[str, Any]:
    """Time training steps and inference of the model ``opt`` describes on ``acc``; returns the results.

    ``infer_size`` 0 skips inference. Every number is per device (one worker).
    """
    if iters < 1 or warmup < 0 or infer_iters < 1 or infer_size < 0:
        raise OptionError(f"--iters ({iters}) and --infer-iters ({infer_iters}) must be >= 1, "
                          f"--warmup ({warmup}) and --infer-size ({infer_size}) >= 0")
    if infer_size > MAX_INFER_SIZE:
        raise OptionError(f"--infer-size {infer_size}: bench times one untiled image of at most {MAX_INFER_SIZE} "
                          f"pixels a side (its output and features must fit in memory at once); for larger images "
                          "time `anysr infer --tile N` instead")
    load_start = os.getloadavg() if hasattr(os, "getloadavg") else None
    batch, gt_size, accumulate = _train_crop(opt)
    batch *= acc.batch_multiplier
    scale = int(opt.scale)
    acc.manual_seed(int(opt.manual_seed))
    model = build_model(opt, acc)
    ckpt.load_model_weights(model, fresh=False, stand_ins=True)  # the VGG19 of a perceptual loss: timing only
    host_net = build_network(opt.network_g)  # a CPU twin for counting FLOPs: no device work
    in_ch = int(input_channels(host_net) or 3)
    lq_size = lq_patch_size(gt_size, scale)
    acc.calibrate(model.nets["net_g"], (batch, in_ch, lq_size, lq_size), train=True)  # as training decides
    rebalanced = acc.rebalance_threads()  # as training does before its first step
    model.setup()
    bare = model.bare("net_g")
    fwd_flops, out_shape = forward_flops(host_net, (1, in_ch, lq_size, lq_size))
    gen = torch.Generator().manual_seed(0)
    lq = torch.rand(batch, in_ch, lq_size, lq_size, generator=gen)
    gt = torch.rand(batch, *out_shape[1:], generator=gen)
    made, per_sample = model.bench_batch(lq, gt)
    micro = [acc.to_device(made) for _ in range(accumulate)]

    times, losses = time_steps(lambda: model.train_step(micro), acc, iters, warmup)
    total = sum(losses.values()) if losses else torch.zeros(())
    loss = float(acc.to_host(total))
    if not acc.is_finite(loss):
        raise TrainingError(f"the training loss became {loss} on random data; lower "
                            "train.optim_g.lr or use train.precision: fp32")
    t = _summary(times)
    images = batch * accumulate * per_sample
    step_flops = 3 * fwd_flops * images
    train = {
        "batch_size": batch, "accumulate": accumulate, "gt_size": gt_size, "lq_size": lq_size,
        "iters": iters, "warmup": warmup,
        "ms_per_iter": t["median"] * 1e3, "ms_per_iter_mean": t["mean"] * 1e3, "ms_per_iter_best": t["best"] * 1e3,
        "images_per_s": images / t["median"], "gflop_per_iter": step_flops / 1e9,
        "gflops_per_s": step_flops / 1e9 / t["median"], "loss": loss,
    }

    infer: dict[str, Any] | None = None
    if infer_size:
        net = model.inference_net().eval()
        flops, shape = forward_flops(host_net, (1, in_ch, infer_size, infer_size))
        x = acc.to_device(torch.rand(1, in_ch, infer_size, infer_size, generator=gen))
        times, _ = time_steps(lambda: run_network(net, x, acc, scale=scale, tile=None, tile_pad=0), acc,
                              infer_iters, min(warmup, 2))
        t = _summary(times)
        infer = {"size": infer_size, "output": list(shape[1:]), "iters": infer_iters,
                 "ms_per_image": t["median"] * 1e3, "ms_per_image_mean": t["mean"] * 1e3,
                 "ms_per_image_best": t["best"] * 1e3, "gflop_per_image": flops / 1e9,
                 "gflops_per_s": flops / 1e9 / t["median"],
                 "output_megapixels_per_s": shape[-1] * shape[-2] / 1e6 / t["median"]}

    return {
        "name": opt.name, "network": opt.network_g.type, "scale": scale,
        "params": sum(p.numel() for p in bare.parameters()),
        "accelerator": acc.plan.accelerator, "device": acc.describe(), "precision": acc.precision.name,
        "channels_last": acc.precision.channels_last, "compile": acc.plan.compile,
        "choices": {k: c.as_dict() for k, c in acc.precision.choices.items()}, "warnings": acc.precision.warnings(),
        "torch": torch.__version__, "threads": torch.get_num_threads(), "threads_rebalanced": rebalanced,
        "load_average": {"start": list(load_start) if load_start else None,
                         "end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None},
        "flops_counted": FLOPS_COUNTED, "train": train, "infer": infer, "stats": acc.stats(),
    }


# ---------------------------------------------------------------- output
def _shown(value: Any) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def _choices_line(choices: dict[str, dict[str, Any]]) -> str:
    """'precision fp32, channels_last on (auto: measured ...)': settings one measurement decided share its account."""
    groups: dict[tuple[str, str], list[str]] = {}
    for name, c in choices.items():
        how = "auto" if c["requested"] == "auto" else "asked for"
        groups.setdefault((how, str(c["why"])), []).append(f"{name} {_shown(c['chosen'])}")
    return "; ".join(f"{', '.join(names)} ({how}: {why})" for (how, why), names in groups.items())


def format_table(result: dict[str, Any]) -> str:
    """The results as a small text table."""
    tr = result["train"]
    lines = [
        f"anysr bench: {result['name']} ({result['network']} x{result['scale']}, "
        f"{result['params'] / 1e6:.3g} M params) on {result['device']}; torch {result['torch']}, "
        f"{result['threads']} threads",
        _choices_line(result["choices"]),
        *(f"warning: {w}" for w in result["warnings"]),
        f"{'':<10} {'input':>16} {'ms (median)':>12} {'ms (best)':>10} {'images/s':>10} {'GFLOP':>8} "
        f"{'GFLOP/s':>8}",
        f"{'train':<10} {tr['batch_size'] * tr['accumulate']:>5} x {tr['lq_size']:>3}x{tr['lq_size']:<4} "
        f"{tr['ms_per_iter']:>12.1f} {tr['ms_per_iter_best']:>10.1f} {tr['images_per_s']:>10.1f} "
        f"{tr['gflop_per_iter']:>8.2f} {tr['gflops_per_s']:>8.1f}",
    ]
    inf = result["infer"]
    if inf:
        lines.append(f"{'infer':<10} {1:>5} x {inf['size']:>3}x{inf['size']:<4} {inf['ms_per_image']:>12.1f} "
                     f"{inf['ms_per_image_best']:>10.1f} {1e3 / inf['ms_per_image']:>10.2f} "
                     f"{inf['gflop_per_image']:>8.2f} {inf['gflops_per_s']:>8.1f}")
    lines.append(f"train: {tr['iters']} timed iterations after {tr['warmup']} warm-up, synthetic batch "
                 "(no data loading); FLOPs: Conv2d + Linear only")
    load = result["load_average"]["start"]
    if load:
        lines.append(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
                     f"({os.cpu_count()} cores)")
    return "\n".join(lines)


def write_json(path: str | Path, result: dict[str, Any]) -> Path:
    """Write ``result`` as indented JSON (the folder is created)."""
    return atomic_write_json(path, result)


def beside(argv: list[str], copies: int, folder: Path) -> dict[str, Any]:
    """``anysr bench ARGV`` alone, then ``copies`` + 1 identical copies at once (each its own process, as two
    users' jobs would be): the step time of each, against alone. ``argv``: the bench command's arguments without
    ``--beside`` / ``--json``. A SIGTERM or SIGINT to this process ends every copy (SIGKILL after a grace period)
    before it returns, so none runs on or leaves files behind."""
    import signal  # noqa: PLC0415 - only this mode starts processes
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    live: list[subprocess.Popen[str]] = []

    def start(tag: str) -> tuple[subprocess.Popen[str], Path]:
        out = folder / f"{tag}.json"
        cmd = [sys.executable, "-m", "anysr", "bench", *argv, "--json", str(out)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        live.append(proc)
        return proc, out

    def stop_all() -> None:
        for proc in live:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in live:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def on_signal(signum: int, _frame: object) -> None:
        raise TrainingError(f"anysr bench --beside stopped by {signal.Signals(signum).name}; its copies were ended")

    def finish(runs: list[tuple[subprocess.Popen[str], Path]]) -> list[dict[str, Any]]:
        results = []
        for proc, out in runs:
            text, _ = proc.communicate()
            if proc.returncode != 0 or not out.is_file():
                last = [ln for ln in text.splitlines() if ln.strip()][-1:] or ["(no output)"]
                raise TrainingError(f"a bench copy failed (exit {proc.returncode}): {last[0]}")
            results.append(json.loads(out.read_text(encoding="utf-8")))
        return results

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        alone = finish([start("alone")])[0]
        together = finish([start(f"copy{i}") for i in range(copies + 1)])
    finally:
        stop_all()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    base = alone["train"]["ms_per_iter"]
    return {"alone": {"ms_per_iter": base, "threads": alone["threads"]},
            "together": [{"ms_per_iter": r["train"]["ms_per_iter"], "threads": r["threads"],
                          "slowdown": r["train"]["ms_per_iter"] / base} for r in together],
            "copies": copies + 1, "cores": os.cpu_count(), "name": alone["name"], "network": alone["network"]}


def format_beside(result: dict[str, Any]) -> str:
    """The ``--beside`` comparison as a few lines."""
    lines = [f"anysr bench --beside: {result['name']} ({result['network']}), {result['copies']} identical jobs at "
             f"once on {result['cores']} cores vs one alone",
             f"alone:    {result['alone']['ms_per_iter']:8.1f} ms/iter ({result['alone']['threads']} threads)"]
    for i, r in enumerate(result["together"]):
        lines.append(f"copy {i + 1}:   {r['ms_per_iter']:8.1f} ms/iter ({r['threads']} threads), "
                     f"{r['slowdown']:.2f}x alone")
    lines.append(f"fair share: {result['copies']:.0f}x alone when the jobs split the cores exactly; anysr picks "
                 "each job's threads from the cores the others leave free (ANYSR_THREADS=auto; =N to fix them)")
    return "\n".join(lines)

"""Where a Real-ESRNet training step's time goes, with the synthesis in the step and in the loader.

    PYTHONPATH=. python benchmarks/bench_realesrnet_breakdown.py [--iters 8] [--workers 2] [--accelerator cpu]
        [--degradation realesrgan] [--out benchmarks/realworld-run.md] [--tiny]

Real-ESRGAN's own degradation settings (``options/train/train_RealESRNet_x4plus.yml``: kernels, USM of the GT,
second-order resize / noise / JPEG, crop_pad_size 400, queue) with the issue's network and size: SRVGGNetCompact
(64 features, 32 convolutions, x4, PReLU), batch 4, GT 256, on T91 (the repository's images, reflect-padded to 400
as BasicSR does). For ``degrade_in: step`` and ``degrade_in: loader`` (the accelerator's plan picks one; ``auto``
keeps ``step`` except on XLA) two passes of ``--iters`` iterations after 3 warm-up ones (1 with ``--tiny``):

* *instrumented* (DataLoader with 0 workers, so every part runs in this process): each part is timed with a device
  synchronize before and after it: kernel sampling (the dataset's draws and kernel construction), USM, blur / sinc
  filters, resizes, noise, DiffJPEG, draws + crop + rounding, the training-pair pool, the rest of the loader (read,
  flip, pad), the host-to-device copy, and the network step (forward, backward, optimiser, EMA: the step minus the
  synthesis and pool inside it);
* *plain* (``--workers`` loader processes, no instrumentation): the iteration time and how much of it the step
  waited for the loader.

Prints ms per iteration per part and the 1-minute load average while each mode ran (rows measured at a load above
1.5 are starred: take them as upper bounds); ``--out`` also writes them as a Markdown section. ``--degradation``
names the synthesis pipeline: ``realesrgan``, or BSRGAN's ``bsrgan`` / ``bsrgan_plus`` (KAIR's x4 settings,
``options/train/train_BSRGAN_x4.yml``: degrade_size 320, any SR model, the dataset's ``degrade_in`` step or loader;
same network, batch and GT size; JPEG there is OpenCV's, as KAIR's; in the step every part runs in the step).
``--tiny``: small sizes for the CPU check of ``benchmarks/gpu.sh --cpu-check``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
LOADED = 1.5  # 1-minute load average above which a row is starred

# Synthesis pipelines the breakdown knows: options file, overrides, the placements to measure, and the function
# that wraps its operators (as its modules look them up) with the clock. A new degradation model gets an entry here.
PIPELINES: dict[str, dict[str, Any]] = {
    "realesrgan": {"options": "options/train/train_RealESRNet_x4plus.yml", "placements": ("step", "loader")},
    "bsrgan": {"options": "options/train/train_BSRGAN_x4.yml", "placements": ("step", "loader"), "key": "dataset"},
    "bsrgan_plus": {"options": "options/train/train_BSRGAN_x4.yml", "placements": ("step", "loader"),
                    "key": "dataset", "train": {"degradation_type": "bsrgan_plus"}},
}
PARTS = ("kernel sampling", "USM", "blur / sinc filters", "resizes", "noise", "JPEG",
         "draws, crop, rounding", "pair pool", "loader other (read, flip, pad)", "host-to-device copy",
         "network fwd + bwd + optimiser + EMA")


class Clock:
    """Accumulates seconds per part; ``wrap`` times a callable with a device synchronize on both sides."""

    def __init__(self, sync: Callable[[], None]) -> None:
        self.sync = sync
        self.seconds: dict[str, float] = defaultdict(float)
        self.depth = 0
        self.on = False

    def wrap(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on or self.depth:  # nested parts count once, in the outer one
                return fn(*args, **kwargs)
            self.sync()
            self.depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.sync()
                self.seconds[part] += time.perf_counter() - t0
                self.depth -= 1
        return timed


def instrument(clock: Clock, pipeline: str = "realesrgan") -> None:
    """Wrap the pipeline's operators (as the modules look them up) with ``clock``."""
    if pipeline.startswith("bsrgan"):
        instrument_bsrgan(clock)
        return
    from anysr.data import realesrgan_dataset as ds_mod  # noqa: PLC0415
    from anysr.data.degradation import realesrgan as rg  # noqa: PLC0415
    from anysr.data.pair_pool import TrainingPairPool  # noqa: PLC0415
    from anysr.models import realesrgan as model_mod  # noqa: PLC0415
    from anysr.ops.degradation import USMSharp  # noqa: PLC0415
    from anysr.ops.diffjpeg import DiffJPEG  # noqa: PLC0415

    for name in ("filter2d",):
        setattr(rg, name, clock.wrap("blur / sinc filters", getattr(rg, name)))
    for name in ("resize", "resize_filtered", "thick_lines"):
        setattr(rg, name, clock.wrap("resizes", getattr(rg, name)))
    for name in ("gaussian_noise_per_sample", "poisson_noise_per_sample"):
        setattr(rg, name, clock.wrap("noise", getattr(rg, name)))
    for name in ("clamp_round", "crop_pair", "draw_samples", "draw_batch_choices"):
        setattr(rg, name, clock.wrap("draws, crop, rounding", getattr(rg, name)))
    model_mod.draw_batch_choices = clock.wrap("draws, crop, rounding", model_mod.draw_batch_choices)
    for name in ("make_kernel", "draw_degradation_kernel_params"):
        if hasattr(ds_mod, name):
            setattr(ds_mod, name, clock.wrap("kernel sampling", getattr(ds_mod, name)))
    ds_mod.RealESRGANDataset.kernel_params = clock.wrap(  # type: ignore[method-assign]
        "kernel sampling", ds_mod.RealESRGANDataset.kernel_params)
    USMSharp.forward = clock.wrap("USM", USMSharp.forward)  # type: ignore[method-assign]
    DiffJPEG.forward = clock.wrap("JPEG", DiffJPEG.forward)  # type: ignore[method-assign]
    TrainingPairPool.swap = clock.wrap("pair pool", TrainingPairPool.swap)  # type: ignore[method-assign]


def instrument_bsrgan(clock: Clock) -> None:
    """Wrap BSRGAN's operators (``anysr.data.degradation.bsrgan``'s names, which ``apply_step`` looks up)."""
    from anysr.data.degradation import bsrgan as bs  # noqa: PLC0415

    bs.BSRGANPipeline.draw = clock.wrap("kernel sampling", bs.BSRGANPipeline.draw)  # type: ignore[method-assign]
    bs.step_kernel = clock.wrap("kernel sampling", bs.step_kernel)
    bs.convolve_mirror = clock.wrap("blur / sinc filters", bs.convolve_mirror)
    for name in ("resize_cv2", "imresize_torch"):
        setattr(bs, name, clock.wrap("resizes", getattr(bs, name)))
    for name in ("gaussian_noise_3ch", "speckle_noise_3ch", "poisson_noise_kair"):
        setattr(bs, name, clock.wrap("noise", getattr(bs, name)))
    bs._jpeg = clock.wrap("JPEG", bs._jpeg)
    bs.USMSharp.forward = clock.wrap("USM", bs.USMSharp.forward)  # type: ignore[method-assign]


def options_file(folder: Path, pipeline: str, tiny: bool) -> Path:
    """The pipeline's options with the breakdown's network, batch, crop and data (T91)."""
    opt = yaml.safe_load((ROOT / PIPELINES[pipeline]["options"]).read_text())
    batch, gt, pad = (2, 64, 96) if tiny else (4, 256, 400)
    opt.update(name="breakdown", num_gpu=1)
    train = dict(opt["datasets"]["train"], **PIPELINES[pipeline].get("train", {}))
    if train["type"] == "BSRGANDataset":
        train.update(degrade_size=80 if tiny else 320)
    else:
        opt.update(gt_size=gt, queue_size=4 * batch)
        train.update(crop_pad_size=pad)
    opt["network_g"] = {"type": "SRVGGNetCompact", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 8 if tiny else 64,
                        "num_conv": 2 if tiny else 32, "upscale": 4, "act_type": "prelu"}
    opt["datasets"] = {"train": {**train, "dataroot_gt": str(ROOT / "datasets" / "T91" / "HR"), "gt_size": gt,
                                 "batch_size_per_gpu": batch, "num_worker_per_gpu": 0}}
    opt["datasets"]["train"].pop("meta_info_file", None)
    opt.pop("val", None)
    opt["path"] = {"pretrain_network_g": None, "resume_state": None}
    path = folder / "breakdown.yml"
    path.write_text(yaml.safe_dump(opt, sort_keys=False))
    return path


def _batches(loader: Any, sampler: Any) -> Iterator[dict[str, Any]]:
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def run_mode(acc: Any, opt: Any, iters: int, workers: int, instrumented: bool, clock: Clock,
             warmup: int = 3) -> dict[str, Any]:
    """One pass of ``iters`` timed iterations after ``warmup`` ones; seconds per part per iteration."""
    from anysr.data import build_dataset, build_train_loader  # noqa: PLC0415
    from anysr.models import build_model  # noqa: PLC0415

    acc.manual_seed(int(opt.manual_seed))
    model = build_model(opt, acc)
    model.setup()
    dopt = opt.datasets["train"]
    dataset = build_dataset(dopt, "datasets.train")
    model.prepare_train_set(dataset)
    place = getattr(dataset, "place_synthesis", None)  # BSRGANDataset: its degrade_in, as the trainer asks
    stage = place(acc.static_shapes) if place is not None else None
    loader, sampler = build_train_loader(
        dataset, {**dict(dopt), "num_worker_per_gpu": 0 if instrumented else workers},
        batch_size=int(dopt.batch_size_per_gpu), world_size=1, rank=0, seed=int(opt.manual_seed))
    stream = _batches(loader, sampler)
    wait = step = h2d = 0.0
    load = []
    t_start = 0.0
    for it in range(1, warmup + iters + 1):
        if it == warmup + 1:
            acc.synchronize()
            clock.seconds.clear()
            clock.on = instrumented
            wait = step = h2d = 0.0
            t_start = time.perf_counter()
        t0 = time.perf_counter()
        batch = next(stream)
        t1 = time.perf_counter()
        batch = acc.to_device(batch)
        if instrumented:
            acc.synchronize()
        t2 = time.perf_counter()
        if stage is not None:  # the dataset's synthesis in the step, as the trainer applies it
            batch = acc.to_device(stage(batch))
        model.update_learning_rate(it)
        model.train_step([batch])
        acc.mark_step()
        acc.synchronize()
        t3 = time.perf_counter()
        wait, h2d, step = wait + t1 - t0, h2d + t2 - t1, step + t3 - t2
        if it > warmup:
            load.append(os.getloadavg()[0])
    total = time.perf_counter() - t_start
    clock.on = False
    parts = {k: v / iters for k, v in clock.seconds.items()}
    where = getattr(model, "degrade_in", None) or ("step" if stage is not None else "loader")
    if instrumented:  # Real-ESRGAN samples its kernels in the loader wherever it synthesises; BSRGAN draws in place
        loader_parts = ("kernel sampling",) if stage is None else ()
        in_step = sum(v for k, v in parts.items() if k not in loader_parts) if where == "step" \
            else parts.get("pair pool", 0.0)
        in_loader = sum(v for k, v in parts.items() if k != "pair pool") if where == "loader" \
            else sum(parts.get(k, 0.0) for k in loader_parts)
        parts["network fwd + bwd + optimiser + EMA"] = step / iters - in_step
        parts["loader other (read, flip, pad)"] = wait / iters - in_loader
        parts["host-to-device copy"] = h2d / iters
    return {"degrade_in": where, "parts": parts, "iteration": total / iters, "loader_wait": wait / iters,
            "step": step / iters, "load": max(load) if load else os.getloadavg()[0], "workers": 0 if instrumented
            else workers}


def worker(acc: Any, opt_path: str, iters: int, workers: int, warmup: int,
           pipeline: str = "realesrgan") -> list[dict[str, Any]]:
    """The pipeline's placements, instrumented and plain, on the accelerator ``acc``."""
    from anysr.options import load_options  # noqa: PLC0415

    clock = Clock(acc.synchronize)
    instrument(clock, pipeline)
    rows = []
    placements = PIPELINES[pipeline]["placements"]
    for where in placements:
        key = "datasets.train.degrade_in" if PIPELINES[pipeline].get("key") == "dataset" else "degrade_in"
        opt = load_options(opt_path, [f"{key}={where}"], is_train=True)
        inst = run_mode(acc, opt, iters, workers, True, clock, warmup)
        plain = run_mode(acc, opt, iters, workers, False, clock, warmup)
        rows.append({"where": where, "instrumented": inst, "plain": plain})
        print(format_row(rows[-1], header=len(rows) == 1), flush=True)
    return rows


def format_row(row: dict[str, Any], header: bool = False) -> str:
    inst, plain = row["instrumented"], row["plain"]
    star = "*" if max(inst["load"], plain["load"]) > LOADED else ""
    cells = [f"{row['where']}{star}"] + [f"{1e3 * inst['parts'].get(p, 0.0):.1f}" for p in PARTS] + [
        f"{1e3 * sum(inst['parts'].values()):.1f}", f"{1e3 * plain['iteration']:.1f}",
        f"{1e3 * plain['loader_wait']:.1f}", f"{inst['load']:.1f} / {plain['load']:.1f}"]
    line = "| " + " | ".join(cells) + " |"
    if not header:
        return line
    head = ["degrade_in", *PARTS, "sum (instrumented, 0 workers)", f"iteration ({plain['workers']} workers)",
            f"of which loader wait ({plain['workers']} workers)", "load avg (instr. / plain)"]
    return "| " + " | ".join(head) + " |\n|---|" + "---:|" * (len(head) - 1) + "\n" + line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="loader processes of the plain pass (default 2)")
    parser.add_argument("--accelerator", default="cpu", choices=("cpu", "cuda", "mps"))
    parser.add_argument("--degradation", default="realesrgan", choices=sorted(PIPELINES))
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: anysr's choice)")
    parser.add_argument("--tiny", action="store_true", help="small sizes (the CPU check of gpu.sh)")
    parser.add_argument("--out", default=None, help="also write the table as a Markdown section to this file")
    a = parser.parse_args()
    if a.threads:
        os.environ["ANYSR_THREADS"] = str(a.threads)
    from anysr.accelerators import launch, resolve_plan  # noqa: PLC0415
    from anysr.cli import load_plugins  # noqa: PLC0415

    load_plugins()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="anysr-breakdown-") as tmp:
        path = options_file(Path(tmp), a.degradation, a.tiny)
        plan = resolve_plan(a.accelerator, 1, precision="fp32", channels_last=False)
        rows = launch(plan, worker, str(path), a.iters, a.workers, 1 if a.tiny else 3, a.degradation)
    size = "tiny (SRVGGNetCompact 8x2, batch 2, GT 64)" if a.tiny else "SRVGGNetCompact 64x32, batch 4, GT 256"
    text = "\n".join([
        f"## {started}: {a.degradation}, {size}, {a.accelerator}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {os.cpu_count()} cores", "",
        f"`PYTHONPATH=. python benchmarks/bench_realesrnet_breakdown.py --iters {a.iters} --workers {a.workers} "
        f"--accelerator {a.accelerator} --degradation {a.degradation}{' --tiny' if a.tiny else ''}`; "
        f"ms per iteration, fp32; * = load average "
        f"above {LOADED} while measuring.", "",
        format_row(rows[0], header=True), *(format_row(r) for r in rows[1:]), ""])
    print()
    print(text)
    if a.out:
        Path(a.out).write_text(text)
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()

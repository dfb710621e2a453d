"""Time accelerator: xla through torchax: the bare jitted training step and the whole ``anysr train``, per network.

Meant for a TPU host (JAX with libtpu, a CPU torch build, torchax 0.0.14): it writes one JSON file with, per network,
the first step (trace + compile; from JAX's persistent cache on a second run of this script), the median step, images
per second, and ``anysr train``'s iterations per second on the bundled T91 images against the bare step. ``--tiny``
shrinks every network, batch and crop so the script also runs on JAX's CPU backend (a smoke run, not a measurement
of a TPU). Networks the jitted step does not carry yet (GAN steps, on-device degradations) are listed as skipped.

    python benchmarks/tpu_bench.py --out tpu_bench.json                  # on the TPU host
    python benchmarks/tpu_bench.py --tiny --nets EDSR-M --out cpu.json   # JAX CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from anysr.accelerators import create_accelerator, resolve_plan  # noqa: E402
from anysr.engine import checkpoint as ckpt  # noqa: E402
from anysr.models import build_model  # noqa: E402
from anysr.options.loader import load_options  # noqa: E402
from anysr.plugins import load_plugins  # noqa: E402

# name: (network_g, scale, batch, LQ side) as issue 39 lists them (batch 16, GT 96 / 128)
NETS: dict[str, tuple[dict[str, Any], int, int, int]] = {
    "EDSR-M x2": ({"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 64, "num_block": 16, "upscale": 2,
                   "res_scale": 1, "img_range": 255.0, "rgb_mean": [0.4488, 0.4371, 0.4040]}, 2, 16, 48),
    "MSRResNet x4": ({"type": "MSRResNet", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 64, "num_block": 16,
                      "upscale": 4}, 4, 16, 32),
    "RRDBNet x4": ({"type": "RRDBNet", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 64, "num_block": 23,
                    "num_grow_ch": 32, "scale": 4}, 4, 16, 32),
    "SwinIR-light x2": ({"type": "SwinIR", "upscale": 2, "in_chans": 3, "img_size": 64, "window_size": 8,
                         "img_range": 1.0, "depths": [6, 6, 6, 6], "embed_dim": 60, "num_heads": [6, 6, 6, 6],
                         "mlp_ratio": 2, "upsampler": "pixelshuffledirect", "resi_connection": "1conv"}, 2, 16, 64),
    "SwinIR classical x2": ({"type": "SwinIR", "upscale": 2, "in_chans": 3, "img_size": 64, "window_size": 8,
                             "img_range": 1.0, "depths": [6] * 6, "embed_dim": 180, "num_heads": [6] * 6,
                             "mlp_ratio": 2, "upsampler": "pixelshuffle", "resi_connection": "1conv"}, 2, 16, 64),
    "HAT-S x2": ({"type": "HAT", "upscale": 2, "in_chans": 3, "img_size": 64, "window_size": 16,
                  "compress_ratio": 24, "squeeze_factor": 24, "conv_scale": 0.01, "overlap_ratio": 0.5,
                  "img_range": 1.0, "depths": [6] * 6, "embed_dim": 144, "num_heads": [6] * 6, "mlp_ratio": 2,
                  "upsampler": "pixelshuffle", "resi_connection": "1conv"}, 2, 16, 64),
    "SPAN x4": ({"type": "SPAN", "num_in_ch": 3, "num_out_ch": 3, "feature_channels": 48, "upscale": 4}, 4, 16, 32),
}
SKIPPED = {"Real-ESRNet x4": "on-device degradations are not in torchax's jitted step yet",
           "Real-ESRGAN x4plus": "the GAN step (discriminator, its optimizer) is not in torchax's jitted step yet"}


def _tiny(net: dict[str, Any]) -> dict[str, Any]:
    """The same network family, small enough for JAX's CPU backend."""
    small = dict(net)
    for key, value in (("num_feat", 8), ("num_block", 1), ("num_grow_ch", 4), ("feature_channels", 8),
                       ("embed_dim", 12), ("compress_ratio", 3), ("squeeze_factor", 4)):
        if key in small:
            small[key] = value
    if "depths" in small:
        small["depths"], small["num_heads"] = [1], [2]
    if small["type"] == "HAT":
        small["window_size"] = 8
    return small


def _options(name: str, net: dict[str, Any], scale: int, batch: int, lq: int, total: int, precision: str,
             matmul: str, train_dir: Path) -> dict[str, Any]:
    return {
        "name": re.sub(r"[^A-Za-z0-9_-]+", "_", name), "model_type": "SRModel", "scale": scale,
        "accelerator": "xla", "num_gpu": "auto", "manual_seed": 0,
        "xla": {"backend": "torchax", "matmul_precision": matmul},
        "datasets": {"train": {"name": "T91", "type": "PairedImageDataset", "dataroot_gt": str(train_dir),
                               "lq_from_gt": True, "io_backend": {"type": "disk"}, "gt_size": lq * scale,
                               "use_hflip": True, "use_rot": True, "use_shuffle": True, "num_worker_per_gpu": 4,
                               "batch_size_per_gpu": batch, "dataset_enlarge_ratio": 100}},
        "network_g": net, "path": {"pretrain_network_g": None},
        "train": {"precision": precision, "ema_decay": 0.999,
                  "optim_g": {"type": "Adam", "lr": 2e-4, "betas": [0.9, 0.99]},
                  "scheduler": {"type": "MultiStepLR", "milestones": [10**6], "gamma": 0.5},
                  "total_iter": total, "pixel_opt": {"type": "L1Loss", "loss_weight": 1.0}},
        "logger": {"print_freq": max(1, total // 2), "save_checkpoint_freq": 10**6, "use_tb_logger": False},
    }


def bare_step(opt_path: Path, workdir: Path, precision: str, matmul: str, steps: int) -> dict[str, Any]:
    """The jitted step alone on synthetic batches: first step (trace + compile), then the median of ``steps``."""
    options = load_options(str(opt_path), is_train=True, root=str(workdir))
    acc = create_accelerator(resolve_plan("xla", "auto", precision=precision, xla_backend="torchax",
                                          matmul_precision=matmul))
    acc.setup()
    acc.manual_seed(0)
    model = build_model(options, acc)
    ckpt.load_model_weights(model, fresh=True, stand_ins=True)
    model.setup()
    train = options["datasets"]["train"]
    scale, gt = int(options["scale"]), int(train["gt_size"])
    batch = int(train["batch_size_per_gpu"]) * acc.batch_multiplier
    g = torch.Generator().manual_seed(0)
    batches = [{"lq": torch.rand(batch, 3, gt // scale, gt // scale, generator=g),
                "gt": torch.rand(batch, 3, gt, gt, generator=g)}]
    model.update_learning_rate(1)
    t0 = time.perf_counter()
    model.train_step(batches)  # the losses come back to the host: the step has finished
    first = time.perf_counter() - t0
    times = []
    for it in range(2, steps + 2):
        model.update_learning_rate(it)
        t0 = time.perf_counter()
        model.train_step(batches)
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    stats = acc.stats()
    return {"first_step_s": round(first, 3), "step_ms_median": round(1000 * median, 3),
            "images_per_s": round(batch / median, 2), "global_batch": batch, "devices": acc.batch_multiplier,
            "compiles": stats["compiles"], "persistent_cache": stats["persistent_cache"],
            "accelerator": acc.describe()}


def whole_train(opt_path: Path, workdir: Path, total: int) -> dict[str, Any]:
    """``anysr train`` of ``total`` iterations in a fresh process: its wall time and the iterations/s it logged."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "anysr", "train", "-opt", str(opt_path), "--force_yml",
                           f"path.root={workdir}"], cwd=workdir, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    wall = time.perf_counter() - t0
    out = proc.stdout + proc.stderr
    if proc.returncode:
        return {"error": out.strip().splitlines()[-1] if out.strip() else f"exit {proc.returncode}"}
    iter_times = [float(x) for x in re.findall(r"time \(data\): ([0-9.]+)", out)]
    done = re.search(r"training done: (\d+) iterations in ([0-9.]+) s", out)
    result: dict[str, Any] = {"process_wall_s": round(wall, 2)}
    if done:
        result["loop_s"] = float(done.group(2))
    if len(iter_times) >= 2:  # the first report window holds the compile; the later ones are the steady state
        result["steady_s_per_iter"] = round(statistics.median(iter_times[1:]), 4)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nets", default=",".join(NETS), help="comma-separated names (or prefixes) from: "
                    + ", ".join(NETS))
    ap.add_argument("--tiny", action="store_true", help="small networks, batch 2 and crops of 16 LQ pixels (JAX CPU)")
    ap.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
    ap.add_argument("--matmul", default="default", choices=("default", "high", "highest"))
    ap.add_argument("--steps", type=int, default=20, help="timed steps of the bare step")
    ap.add_argument("--train-iters", type=int, default=60, help="iterations of the whole anysr train (0: skip)")
    ap.add_argument("--out", default="tpu_bench.json")
    a = ap.parse_args()
    load_plugins()
    train_dir = ROOT / "datasets" / "T91" / "HR"
    wanted = [n.strip() for n in a.nets.split(",") if n.strip()]
    chosen = [n for n in NETS if any(n.startswith(w) for w in wanted)]
    results: dict[str, Any] = {"host": platform.node(), "torch": torch.__version__, "tiny": a.tiny,
                               "precision": a.precision, "matmul": a.matmul, "nets": {},
                               "skipped": {k: v for k, v in SKIPPED.items() if any(k.startswith(w) for w in wanted)}}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in chosen:
            net, scale, batch, lq = NETS[name]
            if a.tiny:
                net, batch, lq = _tiny(net), 2, 16
            opt = _options(name, net, scale, batch, lq, a.train_iters or 1, a.precision, a.matmul, train_dir)
            path = work / f"{opt['name']}.yml"
            path.write_text(yaml.safe_dump(opt, sort_keys=False))
            entry: dict[str, Any] = {"network_g": net, "batch_per_device": batch, "lq": lq, "scale": scale}
            entry["bare_step"] = bare_step(path, work, a.precision, a.matmul, a.steps)
            if a.train_iters:
                entry["anysr_train"] = whole_train(path, work, a.train_iters)
                steady = entry["anysr_train"].get("steady_s_per_iter")
                if steady:
                    entry["train_vs_bare"] = round(entry["bare_step"]["step_ms_median"] / (1000 * steady), 3)
            results["nets"][name] = entry
            print(name, json.dumps(entry["bare_step"]), json.dumps(entry.get("anysr_train")), flush=True)
    Path(a.out).write_text(json.dumps(results, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()

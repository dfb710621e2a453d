"""The GPU benchmark (what ``benchmarks/gpu.sh`` runs after the CUDA tests): training speed, peak memory, achieved
TFLOP/s and data-loader stalls of five networks, and BasicSR 1.4.2 beside them where it is installed.

    PYTHONPATH=. python benchmarks/bench_gpu.py [--cpu-check] [--deadline EPOCH_S] [--out DIR]
        [--basicsr-python PATH] [--matrix core|full] [--nets MSRResNet,EDSR,...]

Per network (MSRResNet, EDSR, RRDBNet, SwinIR, HAT-S with the batch and crop of their BasicSR / HAT option files),
one ``anysr bench`` process per variant (precision x channels_last x torch.compile; ``--matrix core`` the five
that matter, ``full`` all twelve): iterations/s of the training step on a device-resident batch, peak memory
(``torch.cuda.max_memory_allocated`` through the accelerator's stats; on the CPU the bench process's peak RSS), and
the achieved TFLOP/s (``anysr.engine.bench.forward_flops`` x 3 per image: Conv2d + Linear only, attention matmuls
uncounted) against the device's dense bf16 peak (:data:`PEAK_BF16_TFLOPS`; "peak unknown" elsewhere).
Then short real trainings (``anysr train`` on T91 prepared as pairs) give the data-loader stall share
(mean data wait / mean iteration, from the log's last window), and the same trainings in BasicSR 1.4.2
(``--basicsr-python``: a Python where ``import basicsr`` works; ``benchmarks/basicsr_runner.py`` times it).
Writes ``DIR/gpu.json`` and ``DIR/gpu.md`` (a section for benchmarks/gpu.md). ``--cpu-check`` runs every one of
these code paths on the CPU with tiny networks and two iterations (CI: ``tests/test_gpu_script.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s from the vendors' data sheets, matched in order against the
# device name (more specific names first). GPUs without bf16 tensor cores (V100, T4) are not listed: "peak unknown".
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2500.0), ("B200", 2250.0), ("B100", 1750.0),
    ("H200 NVL", 835.0), ("H200", 989.0), ("GH200", 989.0),
    ("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("H800", 989.0),
    ("A100", 312.0), ("A800", 312.0), ("L40S", 362.0), ("L40", 181.0), ("L4", 121.0), ("A10", 125.0),
    ("MI300X", 1307.0), ("MI250X", 383.0),
)


def peak_bf16(device_name: str) -> float | None:
    """The dense bf16 peak of ``device_name`` in TFLOP/s, or None when the table does not know it."""
    for key, peak in PEAK_BF16_TFLOPS:
        if re.search(rf"(^|[^A-Za-z0-9]){re.escape(key)}([^A-Za-z0-9]|$)", device_name):
            return peak
    return None


@dataclass(frozen=True)
class Net:
    """One benchmarked network: its options file, how the GPU run and the CPU check change it."""

    name: str
    options: str
    gpu: tuple[str, ...] = ()
    tiny: tuple[str, ...] = ()
    basicsr: bool = True  # whether BasicSR 1.4.2 has the architecture
    train_gt: int = 96  # GT crop of the stall / BasicSR trainings (T91's smallest image side is 70 after mod-crop)


_TINY_DATA = ("datasets.train.batch_size_per_gpu=2", "datasets.train.gt_size=32")
NETS: tuple[Net, ...] = (
    Net("MSRResNet", "options/train/train_MSRResNet_x4.yml",
        tiny=("network_g.num_feat=8", "network_g.num_block=1", *_TINY_DATA)),
    Net("EDSR", "options/train/train_EDSR_Mx2.yml",
        tiny=("network_g.num_feat=8", "network_g.num_block=1", *_TINY_DATA)),
    Net("RRDBNet", "options/train/train_RRDBNet_PSNR_x4.yml",
        tiny=("network_g.num_feat=8", "network_g.num_block=1", "network_g.num_grow_ch=4", *_TINY_DATA)),
    Net("SwinIR", "options/train/train_SwinIR_SRx2_scratch.yml",
        tiny=("network_g.embed_dim=12", "network_g.depths=[1]", "network_g.num_heads=[2]", "network_g.img_size=16",
              *_TINY_DATA)),
    # HAT-S (the HAT paper's small model): embed 144, compress and squeeze ratio 24; HAT's own x2 file otherwise.
    Net("HAT-S", "options/train/train_HAT_SRx2_from_scratch.yml",
        gpu=("network_g.embed_dim=144", "network_g.compress_ratio=24", "network_g.squeeze_factor=24"),
        tiny=("network_g.embed_dim=12", "network_g.depths=[1]", "network_g.num_heads=[2]", "network_g.compress_ratio=3",
              "network_g.squeeze_factor=4", "network_g.img_size=16", *_TINY_DATA),
        basicsr=False),
)

# (precision, channels_last, compile)
# in the order they run (the budget drops the last first): eager ones, then compiled
CORE = (("bf16", True, False), ("fp32", False, False), ("fp16", True, False), ("bf16", False, False),
        ("bf16", True, True))
FULL = tuple((p, cl, c) for p in ("fp32", "bf16", "fp16") for cl in (False, True) for c in (False, True))
# --cpu-check: one variant per network, in turn (every code path, few processes: CI runs it in under a minute)
CPU_CHECK = (("fp32", False, False), ("bf16", True, False))


@dataclass
class Budget:
    """Wall-clock deadline of the whole script (gpu.sh passes what is left of its 10 minutes)."""

    deadline: float
    skipped: list[str] = field(default_factory=list)

    def left(self) -> float:
        return self.deadline - time.time()

    def allows(self, what: str, need_s: float) -> bool:
        if self.left() >= need_s:
            return True
        self.skipped.append(f"{what} (needs ~{need_s:.0f} s, {max(self.left(), 0):.0f} s left)")
        return False


def _run(cmd: list[str], *, timeout: float, env: dict[str, str] | None = None, cwd: Path = ROOT,
         log: Path | None = None) -> tuple[int, str, float]:
    """Run ``cmd``; (exit status, its output, peak RSS in MiB). A run past ``timeout`` is killed (status -9)."""
    with tempfile.TemporaryFile(mode="w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                env={**os.environ, **(env or {})}, text=True, start_new_session=True)
        timer = threading.Timer(max(timeout, 1.0), lambda: os.killpg(proc.pid, 9))
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
    if log is not None:
        log.write_text(text)
    return proc.returncode, text, usage.ru_maxrss / 1024


def _tail(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "(no output)"


# ---------------------------------------------------------------- device facts
def device_facts(python: str, accelerator: str) -> dict[str, Any]:
    """Name, capability, memory and torch version of the device, asked in a child process."""
    code = ("import json, platform, torch\n"
            "d = {'torch': torch.__version__, 'cuda': torch.version.cuda}\n"
            "if torch.cuda.is_available():\n"
            "    p = torch.cuda.get_device_properties(0)\n"
            "    d.update(name=p.name, capability='%d.%d' % (p.major, p.minor),\n"
            "             memory_gib=round(p.total_memory / 2**30, 1), count=torch.cuda.device_count())\n"
            "print(json.dumps(d))\n")
    status, text, _ = _run([python, "-c", code], timeout=120)
    facts: dict[str, Any] = json.loads(text.strip().splitlines()[-1]) if status == 0 else {"error": _tail(text)}
    if accelerator == "cpu":
        model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                      if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() \
            else platform.processor()
        facts.update(name=f"CPU: {model} ({os.cpu_count()} cores)", capability="-", memory_gib=None)
    facts["peak_bf16_tflops"] = peak_bf16(str(facts.get("name", "")))
    return facts


# ---------------------------------------------------------------- anysr bench per variant
def bench_variant(net: Net, variant: tuple[str, bool, bool], *, python: str, accelerator: str, cpu_check: bool,
                  iters: int, warmup: int, folder: Path, timeout: float) -> dict[str, Any]:
    precision, channels_last, compiled = variant
    out = folder / f"{net.name}-{precision}-{'cl' if channels_last else 'nchw'}-{'compile' if compiled else 'eager'}"
    cmd = [python, "-m", "anysr", "bench", "-opt", net.options, "--iters", str(iters), "--warmup", str(warmup),
           "--infer-size", "0", "--json", str(out.with_suffix(".json")), "--force_yml", f"accelerator={accelerator}",
           f"train.precision={precision}", f"train.channels_last={str(channels_last).lower()}",
           f"train.compile={str(compiled).lower()}", *(net.tiny if cpu_check else net.gpu)]
    row: dict[str, Any] = {"network": net.name, "precision": precision, "channels_last": channels_last,
                           "compile": compiled}
    t0 = time.time()
    status, text, rss = _run(cmd, timeout=timeout, log=out.with_suffix(".log"))
    row["wall_s"] = round(time.time() - t0, 1)
    if status != 0 or not out.with_suffix(".json").is_file():
        row["error"] = "timed out" if status == -9 else f"exit {status}: {_tail(text)}"
        return row
    r = json.loads(out.with_suffix(".json").read_text())
    tr = r["train"]
    cuda_peak = r.get("stats", {}).get("max_memory_allocated_mb")
    row.update(batch=tr["batch_size"] * tr["accumulate"], lq_size=tr["lq_size"], params=r["params"],
               ms_per_iter=tr["ms_per_iter"], iters_per_s=1e3 / tr["ms_per_iter"], images_per_s=tr["images_per_s"],
               tflops=tr["gflops_per_s"] / 1e3, gflop_per_iter=tr["gflop_per_iter"],
               peak_mib=cuda_peak if cuda_peak is not None else rss,
               peak_kind="device (max_memory_allocated)" if cuda_peak is not None else "host (peak RSS)",
               chosen_precision=r["precision"], chosen_channels_last=r["channels_last"], loss=tr["loss"])
    return row


# ---------------------------------------------------------------- T91 as training pairs
def prepare_pairs(folder: Path, scale: int, min_side: int) -> tuple[Path, Path, int]:
    """T91 mod-cropped to ``scale`` (images smaller than ``min_side`` left out) and its MATLAB-bicubic LR, as the
    paired folders both anysr and BasicSR read. Returns (GT folder, LQ folder, images)."""
    import cv2  # noqa: PLC0415 - only the trainings need it
    import numpy as np  # noqa: PLC0415

    from anysr.ops.imresize import imresize  # noqa: PLC0415

    gt_dir, lq_dir = folder / f"T91_x{scale}" / "HR", folder / f"T91_x{scale}" / "LR"
    if gt_dir.is_dir():
        return gt_dir, lq_dir, len(list(gt_dir.iterdir()))
    gt_dir.mkdir(parents=True)
    lq_dir.mkdir(parents=True)
    n = 0
    for src in sorted((ROOT / "datasets" / "T91" / "HR").iterdir()):
        img = cv2.imread(str(src), cv2.IMREAD_COLOR)
        if img is None:
            continue
        h, w = img.shape[0] - img.shape[0] % scale, img.shape[1] - img.shape[1] % scale
        if min(h, w) < min_side:
            continue
        img = np.ascontiguousarray(img[:h, :w])
        lr = np.clip(np.round(imresize(img, 1 / scale)), 0, 255).astype(np.uint8)
        cv2.imwrite(str(gt_dir / f"{src.stem}.png"), img)
        cv2.imwrite(str(lq_dir / f"{src.stem}.png"), lr)
        n += 1
    return gt_dir, lq_dir, n


def _scale_of(options: str) -> int:
    text = (ROOT / options).read_text()
    m = re.search(r"^scale:\s*(\d+)", text, re.M)
    return int(m.group(1)) if m else 4


def _last_window(log: str) -> tuple[float, float] | None:
    """(iteration s, data s) of the last ``time (data): a (b)`` line of a training log."""
    found = re.findall(r"time \(data\): ([0-9.]+) \(([0-9.]+)\)", log)
    return (float(found[-1][0]), float(found[-1][1])) if found else None


def _training_options(net: Net, name: str, pairs: tuple[Path, Path], *, cpu_check: bool, workers: int,
                      iters: int) -> dict[str, Any]:
    """``net``'s options file for a short training on the T91 pairs: no validation, no checkpoints, its own
    network, optimiser, loss and batch size (the tiny network and batch with ``cpu_check``)."""
    import yaml  # noqa: PLC0415

    from anysr.options.loader import apply_overrides  # noqa: PLC0415 - plain dicts, no torch

    opt = apply_overrides(yaml.safe_load((ROOT / net.options).read_text()), net.tiny if cpu_check else net.gpu)
    gt_size = 32 if cpu_check else net.train_gt
    opt["datasets"] = {"train": opt["datasets"]["train"]}
    ds = opt["datasets"]["train"]
    for key in ("meta_info_file", "meta_info", "lq_from_gt"):
        ds.pop(key, None)
    ds.update(dataroot_gt=str(pairs[0]), dataroot_lq=str(pairs[1]), io_backend={"type": "disk"}, gt_size=gt_size,
              num_worker_per_gpu=workers, dataset_enlarge_ratio=1, filename_tmpl="{}", prefetch_mode=None)
    opt.pop("val", None)
    opt.update(name=name, num_gpu=1)
    opt["train"]["total_iter"] = iters
    opt["logger"] = {"print_freq": max(iters // 2, 1), "save_checkpoint_freq": iters * 10, "use_tb_logger": False,
                     "wandb": {"project": None}}
    opt["path"] = {"pretrain_network_g": None, "strict_load_g": True, "resume_state": None}
    return opt


def train_anysr(net: Net, *, python: str, accelerator: str, cpu_check: bool, iters: int, folder: Path,
                pairs: tuple[Path, Path], workers: int, timeout: float, logs: Path) -> dict[str, Any]:
    """A short real ``anysr train`` of ``net`` (bf16 + channels_last on a GPU) on the T91 pairs: the data-loader
    stall share from the log's last window (the second half of the run)."""
    import yaml  # noqa: PLC0415

    name = f"stall_{net.name.replace('-', '')}"
    opt = _training_options(net, name, pairs, cpu_check=cpu_check, workers=workers, iters=iters)
    path = folder / f"{name}.yml"
    path.write_text(yaml.safe_dump(opt, sort_keys=False))
    over = [f"accelerator={accelerator}", f"path.root={folder}",
            f"train.precision={'fp32' if cpu_check else 'bf16'}",
            f"train.channels_last={'false' if cpu_check else 'true'}"]
    cmd = [python, "-m", "anysr", "train", "-opt", str(path), "--force_yml", *over]
    row: dict[str, Any] = {"network": net.name, "framework": "anysr", "iters": iters, "workers": workers}
    status, text, rss = _run(cmd, timeout=timeout, log=logs / f"{name}.log")
    window = _last_window(text)
    if status != 0 or window is None:
        row["error"] = "timed out" if status == -9 else f"exit {status}: {_tail(text)}"
        return row
    summary = json.loads((folder / "experiments" / name / "summary.json").read_text())
    peak = summary.get("stats", {}).get("max_memory_allocated_mb", rss)
    row.update(ms_per_iter=window[0] * 1e3, data_ms=window[1] * 1e3, stall_share=window[1] / window[0],
               peak_mib=peak, precision=summary["accelerator"]["precision"],
               channels_last=summary["accelerator"]["channels_last"])
    return row


def train_basicsr(net: Net, *, python: str, path: str | None, cpu_check: bool, iters: int, folder: Path,
                  pairs: tuple[Path, Path], workers: int, timeout: float, logs: Path) -> dict[str, Any]:
    """The same training in BasicSR 1.4.2 (its own fp32 NCHW loop: it has no autocast or channels_last option)."""
    import yaml  # noqa: PLC0415

    name = f"basicsr_{net.name}"
    opt = _training_options(net, name, pairs, cpu_check=cpu_check, workers=workers, iters=iters)
    opt["num_gpu"] = 0 if cpu_check else 1  # BasicSR: 0 is its CPU
    opt = {k: v for k, v in opt.items() if k in ("name", "model_type", "scale", "num_gpu", "manual_seed", "datasets",
                                                 "network_g", "path", "train", "logger", "dist_params")}
    for key in ("precision", "channels_last", "compile", "accumulate"):
        opt["train"].pop(key, None)
    run_dir = folder / "basicsr_root"
    run_dir.mkdir(exist_ok=True)
    opt_file = run_dir / f"{name}.yml"
    opt_file.write_text(yaml.safe_dump(opt, sort_keys=False))
    cmd = [python, str(ROOT / "benchmarks" / "basicsr_runner.py"), str(opt_file), str(run_dir)]
    row: dict[str, Any] = {"network": net.name, "framework": "BasicSR 1.4.2", "iters": iters, "workers": workers}
    env = {"PYTHONPATH": path} if path else {"PYTHONPATH": ""}  # BasicSR's own, not anysr's folder
    status, text, rss = _run(cmd, timeout=timeout, cwd=run_dir, env=env, log=logs / f"{name}.log")
    found = re.findall(r"^BASICSR_RUNNER (\{.*\})$", text, re.M)
    if status != 0 or not found:
        row["error"] = "timed out" if status == -9 else f"exit {status}: {_tail(text)}"
        return row
    r = json.loads(found[-1])
    row.update(ms_per_iter=r["ms_per_iter"], data_ms=r["data_ms"], stall_share=r["data_ms"] / r["ms_per_iter"],
               peak_mib=r["peak_mib"] if r.get("peak_mib") is not None else rss, precision="fp32",
               channels_last=False)
    return row


# ---------------------------------------------------------------- output
def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _tf(value: float) -> str:
    """TFLOP/s with three significant digits below 100 (tiny CPU-check values stay readable)."""
    return f"{value:.1f}" if value >= 100 else f"{value:.3g}"


def markdown(result: dict[str, Any]) -> str:
    """The results as a benchmarks/gpu.md section."""
    dev = result["device"]
    peak = dev.get("peak_bf16_tflops")
    check = " (--cpu-check: tiny networks, not a measurement)" if result["cpu_check"] else ""
    lines = [f"## {result['date']}, {dev.get('name', '?')}{check}",
             "",
             f"torch {dev.get('torch')} (CUDA {_fmt(dev.get('cuda'))}), capability {dev.get('capability')}, "
             f"{_fmt(dev.get('memory_gib'))} GiB; {result['cores']} CPU cores; load average at start "
             f"{result['load_start']:.2f}; dense bf16 peak: "
             + (f"{peak:g} TFLOP/s" if peak else "peak unknown") + f". Command: `{result['command']}`.",
             "",
             "### Training step on a device-resident batch (`anysr bench`, one process per row)",
             "",
             "| network | batch x LR crop | precision | channels_last | compile | it/s | images/s | peak MiB | "
             "TFLOP/s | % of bf16 peak |",
             "|---|---|---|---|---|---:|---:|---:|---:|---:|"]
    order = [n.name for n in NETS]
    rows = sorted(result["bench"], key=lambda r: (order.index(r["network"]), FULL.index(
        (r["precision"], r["channels_last"], r["compile"]))))
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['network']} | - | {r['precision']} | {_fmt(r['channels_last'])} | "
                         f"{_fmt(r['compile'])} | failed: {r['error']} | | | | |")
            continue
        share = f"{100 * r['tflops'] / peak:.1f}" if peak else "peak unknown"
        lines.append(f"| {r['network']} | {r['batch']} x {r['lq_size']}² | {r['precision']} | "
                     f"{_fmt(r['channels_last'])} | {_fmt(r['compile'])} | {r['iters_per_s']:.2f} | "
                     f"{r['images_per_s']:.1f} | {r['peak_mib']:.0f} | {_tf(r['tflops'])} | {share} |")
    kind = next((r["peak_kind"] for r in result["bench"] if "peak_kind" in r), "")
    lines += ["", f"Peak memory: {kind}. TFLOP/s: Conv2d + Linear FLOPs x 3 per image (forward + backward), "
              "attention matmuls uncounted (SwinIR, HAT-S: a lower bound).", ""]
    if result["trainings"]:
        lines += ["### Real training on T91 pairs: iteration time and data-loader stall (last log window)", "",
                  "anysr: the training log's mean over the second half (1 ms resolution); BasicSR: "
                  "`basicsr_runner.py` over the same iterations.", "",
                  "| network | framework | precision | channels_last | workers | ms / iter | data wait ms | "
                  "stall share | peak MiB |",
                  "|---|---|---|---|---:|---:|---:|---:|---:|"]
        for r in result["trainings"]:
            if "error" in r:
                lines.append(f"| {r['network']} | {r['framework']} | | | {r['workers']} | failed: {r['error']} | | | |")
                continue
            lines.append(f"| {r['network']} | {r['framework']} | {r['precision']} | {_fmt(r['channels_last'])} | "
                         f"{r['workers']} | {r['ms_per_iter']:.1f} | {r['data_ms']:.1f} | "
                         f"{100 * r['stall_share']:.1f} % | {_fmt(r['peak_mib'], 0)} |")
        lines.append("")
    lines.append(f"BasicSR 1.4.2: {result['basicsr']}.")
    if result["skipped"]:
        lines.append("Left out for time: " + "; ".join(result["skipped"]) + ".")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-check", action="store_true",
                        help="the same code paths on the CPU: tiny networks, 2 iterations, 2 variants")
    parser.add_argument("--out", default="benchmarks/gpu-results", help="folder for gpu.json, gpu.md and the logs")
    parser.add_argument("--deadline", type=float, default=None, help="stop starting work at this UNIX time")
    parser.add_argument("--matrix", choices=("core", "full"), default="core")
    parser.add_argument("--nets", default=",".join(n.name for n in NETS))
    parser.add_argument("--iters", type=int, default=None, help="timed bench iterations (default 20; CPU check 2)")
    parser.add_argument("--train-iters", type=int, default=None, help="iterations of each training (default 200)")
    parser.add_argument("--stall-nets", default=None,
                        help="networks trained for the stall / BasicSR rows (default MSRResNet,EDSR,RRDBNet,SwinIR; "
                        "CPU check: MSRResNet)")
    parser.add_argument("--basicsr-python", default=None, help="a Python that imports basicsr 1.4.2")
    parser.add_argument("--basicsr-path", default=None, help="a folder to put first on its PYTHONPATH")
    parser.add_argument("--basicsr-note", default=None, help="what the results say about BasicSR")
    a = parser.parse_args(argv)
    names = [n.strip() for n in a.nets.split(",") if n.strip()]
    unknown = sorted(set(names) - {n.name for n in NETS})
    if unknown:
        parser.error(f"--nets: unknown {', '.join(unknown)}; known: {', '.join(n.name for n in NETS)}")
    nets = [n for n in NETS if n.name in names]
    cpu = a.cpu_check
    accelerator = "cpu" if cpu else "cuda"
    iters = a.iters or (2 if cpu else 20)
    warmup = 1 if cpu else 5
    train_iters = a.train_iters or (4 if cpu else 200)
    variants = CPU_CHECK if cpu else (FULL if a.matrix == "full" else CORE)
    budget = Budget(a.deadline or time.time() + (600 if cpu else 540))
    out = Path(a.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env_path}" if env_path else str(ROOT)

    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu_check": cpu, "cores": os.cpu_count(),
        "load_start": os.getloadavg()[0], "command": " ".join(["benchmarks/bench_gpu.py", *(argv or sys.argv[1:])]),
        "device": device_facts(python, accelerator), "bench": [], "trainings": [], "skipped": budget.skipped,
        "basicsr": a.basicsr_note or (f"1.4.2 with {a.basicsr_python} (fp32, its own loop)" if a.basicsr_python
                                      else "skipped in --cpu-check" if cpu else "not run (no --basicsr-python)"),
    }
    print(f"device: {result['device']}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="anysr-gpubench-"))

    def bench(net: Net, variant: tuple[str, bool, bool], reserve: float = 0.0) -> None:
        label = f"{net.name} {'/'.join(str(v) for v in variant)}"
        if not budget.allows(f"bench {label}", (20 if cpu else (150 if variant[2] else 25)) + reserve):
            return
        row = bench_variant(net, variant, python=python, accelerator=accelerator, cpu_check=cpu,
                            iters=iters, warmup=warmup, folder=out, timeout=min(budget.left(), 300))
        result["bench"].append(row)
        print(f"bench {label}: " + (row.get("error") or f"{row['iters_per_s']:.2f} it/s, "
              f"{row['peak_mib']:.0f} MiB, {row['tflops']:.3f} TFLOP/s"), flush=True)

    def trainings() -> None:
        workers = min(6, os.cpu_count() or 1) if not cpu else 1
        stall_nets = a.stall_nets or ("MSRResNet" if cpu else "MSRResNet,EDSR,RRDBNet,SwinIR")
        for name in [n.strip() for n in stall_nets.split(",") if n.strip()]:
            net = next((n for n in nets if n.name == name), None)
            if net is None:
                continue
            gt_dir, lq_dir, count = prepare_pairs(workdir, _scale_of(net.options), 32 if cpu else net.train_gt)
            frameworks = ["anysr"] + (["basicsr"] if a.basicsr_python and net.basicsr else [])
            for fw in frameworks:
                if not budget.allows(f"{fw} training of {net.name}", 30 if cpu else 60):
                    continue
                kw = {"iters": train_iters, "folder": workdir, "pairs": (gt_dir, lq_dir), "workers": workers,
                      "timeout": min(budget.left(), 240), "logs": out}
                row = (train_anysr(net, python=python, accelerator=accelerator, cpu_check=cpu, **kw) if fw == "anysr"
                       else train_basicsr(net, python=a.basicsr_python, path=a.basicsr_path, cpu_check=cpu, **kw))
                row["images"] = count
                result["trainings"].append(row)
                print(f"train {fw} {net.name}: " + (row.get("error") or f"{row['ms_per_iter']:.1f} ms/iter, "
                      f"stall {100 * row['stall_share']:.1f} %"), flush=True)

    try:
        # eager variants first, then the trainings, then the compiled variants (the slowest to start)
        # the trainings keep ~150 s on a GPU; every network's first variant comes before any network's second
        eager = [v for v in variants if not v[2]]
        for k in range(1 if cpu else len(eager)):
            for i, net in enumerate(nets):
                bench(net, eager[(i + k) % len(eager)] if cpu else eager[k], reserve=0.0 if cpu else 150.0)
        trainings()
        for net in nets if not cpu else []:
            for variant in [v for v in variants if v[2]]:
                bench(net, variant)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    (out / "gpu.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "gpu.md").write_text(markdown(result))
    print(markdown(result))
    print(f"wrote {out / 'gpu.json'} and {out / 'gpu.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

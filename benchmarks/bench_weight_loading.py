"""Reading pretrained weights: time and memory of ``load_weights`` for .safetensors vs BasicSR .pth files.

    PYTHONPATH=. python benchmarks/bench_weight_loading.py [--models RRDBNet SwinIR] [--repeats 3] [--procs 2]

For each model (BasicSR default sizes) the parent writes one file per format holding ``params`` and
``params_ema`` (what a BasicSR or anysr run with EMA saves): anysr's ``.safetensors``, a BasicSR ``.pth``
(zip archive, ``torch.save`` since torch 1.6), the same archive re-packed with deflated records (as some
released files are, e.g. Real-ESRGAN's realesr-animevideov3.pth) and a legacy ``.pth`` (the pre-1.6 pickle
format). Every case
runs in a fresh subprocess that builds the network first, then loads ``params_ema`` and copies it into
the network, and reports from ``/proc/self``:

* ``read s`` / ``into s``: wall time of ``anysr.engine.checkpoint.load_weights`` and of ``load_into``;
* ``peak +MiB``: ``VmHWM`` minus ``VmRSS`` just before the read (resident memory the load added at its peak,
  page-cache pages mapped from the file included);
* ``anon MiB`` / ``file MiB``: ``RssAnon`` / ``RssFile`` growth while the state dict is still alive (private
  copies vs pages of the file shared with the page cache);
* ``PSS MiB``: proportional set size growth (shared file pages divided among the processes mapping them).

``bytes`` is the previous .pth path (read the whole file, then ``torch.load`` from memory) for comparison.
With ``--procs N`` the same case also runs in N processes released at once on the same file (every rank
reading the file itself, as each training rank does); the numbers are per process (mean) plus the largest
time. ``cold`` runs first evict the file from the page cache with ``posix_fadvise(DONTNEED)``; ``warm`` runs
read it from the cache (best of ``--repeats``). Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import torch

MiB = 1024 * 1024
MODELS: dict[str, dict[str, Any]] = {
    "RRDBNet": {"type": "RRDBNet", "num_in_ch": 3, "num_out_ch": 3},  # 64 features, 23 blocks
    "SwinIR": {"type": "SwinIR", "upscale": 2, "img_size": 64, "window_size": 8, "img_range": 1.0,
               "depths": [6] * 6, "embed_dim": 180, "num_heads": [6] * 6, "mlp_ratio": 2,
               "upsampler": "pixelshuffle", "resi_connection": "1conv"},  # classical SR x2
}
FORMATS = ("safetensors", "pth", "pth-deflated", "pth-legacy")


# ---------------------------------------------------------------------------------------------- /proc
def _status() -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile (bytes) of this process."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def _pss() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def _evict(path: Path) -> None:
    """Drop the file's pages from the page cache (only this file; nothing else is touched)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------- worker
def _meet(sync: Path, tag: str, index: int, nprocs: int) -> None:
    """Wait until all ``nprocs`` workers reach this point (files in ``sync``)."""
    (sync / f"{tag}{index}").touch()
    while not all((sync / f"{tag}{i}").exists() for i in range(nprocs)):
        time.sleep(0.001)


def _worker(model: str, path: str, method: str, sync_dir: str, index: str, nprocs: str) -> None:
    """One measured load in this (fresh) process; prints a JSON line. With several processes they start
    reading together and measure memory only once all have loaded (so PSS shows what they share)."""
    from anysr.archs import build_network
    from anysr.engine.checkpoint import load_into, load_weights

    torch.set_num_threads(1)
    sync, i, n = Path(sync_dir), int(index), int(nprocs)
    net = build_network(dict(MODELS[model]))
    _meet(sync, "ready", i, n)
    before, pss0 = _status(), _pss()
    t0 = time.perf_counter()
    if method == "bytes":  # the previous .pth path: the whole file in memory, then unpickled from it
        obj = torch.load(io.BytesIO(Path(path).read_bytes()), map_location="cpu", weights_only=True)
        sd = obj["params_ema"]
    else:
        sd, _ = load_weights(path, "params_ema")
    t1 = time.perf_counter()
    load_into(net, sd, strict=True, source=path)
    t2 = time.perf_counter()
    _meet(sync, "loaded", i, n)
    after, pss1 = _status(), _pss()
    print(json.dumps({
        "read_s": t1 - t0, "into_s": t2 - t1,
        "peak": after["VmHWM"] - before["VmRSS"], "anon": after["RssAnon"] - before["RssAnon"],
        "file": after["RssFile"] - before["RssFile"], "pss": pss1 - pss0,
    }))
    _meet(sync, "measured", i, n)  # keep the mapping until every process has measured
    del sd


# ---------------------------------------------------------------------------------------------- parent
def _write_files(model: str, folder: Path) -> tuple[dict[str, Path], tuple[int, int]]:
    from anysr.archs import build_network
    from anysr.engine.checkpoint import save_weights

    torch.manual_seed(0)
    net = build_network(dict(MODELS[model]))
    sd = net.state_dict()
    ema = {k: v.clone() for k, v in sd.items()}
    groups = {"params": sd, "params_ema": ema}
    files = {
        "safetensors": save_weights(folder / f"{model}.safetensors", groups, {"network_g": MODELS[model]}),
        "pth": folder / f"{model}.pth",
        "pth-deflated": folder / f"{model}_deflated.pth",
        "pth-legacy": folder / f"{model}_legacy.pth",
    }
    torch.save(groups, files["pth"])  # what BasicSR writes (and what its model zoo holds)
    with zipfile.ZipFile(files["pth"]) as zin, \
            zipfile.ZipFile(files["pth-deflated"], "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
    torch.save(groups, files["pth-legacy"], _use_new_zipfile_serialization=False)
    return files, (sum(p.numel() for p in net.parameters()), sum(v.numel() for v in sd.values()))


def _run(model: str, path: Path, method: str, procs: int, cold: bool, tmp: Path) -> list[dict[str, float]]:
    if cold:
        _evict(path)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(dir=tmp) as sync:
        cmd = [sys.executable, __file__, "--worker", model, str(path), method, sync]
        running = [subprocess.Popen([*cmd, str(i), str(procs)], stdout=subprocess.PIPE, text=True, env=env)
                   for i in range(procs)]
        results = []
        for p in running:
            out, _ = p.communicate(timeout=600)
            if p.returncode != 0:
                raise SystemExit(f"worker failed ({p.returncode}): {' '.join(cmd)}")
            results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _summary(runs: list[list[dict[str, float]]]) -> dict[str, float]:
    """Best run (by the slowest process's total time); memory as the per-process mean of that run."""
    best = min(runs, key=lambda r: max(x["read_s"] + x["into_s"] for x in r))
    n = len(best)
    out = {k: sum(x[k] for x in best) / n for k in ("peak", "anon", "file", "pss")}
    out["read_s"] = max(x["read_s"] for x in best)
    out["into_s"] = max(x["into_s"] for x in best)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--repeats", type=int, default=3, help="warm runs per case (the best is shown)")
    parser.add_argument("--procs", type=int, default=2, help="processes reading at once (1: skip)")
    parser.add_argument("--dir", default=None, help="where to write the weight files (default: a temp folder)")
    args = parser.parse_args()

    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          "per process: mean over processes, times: the slowest process")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp_name:
        tmp = Path(tmp_name)
        for model in args.models:
            files, (params, values) = _write_files(model, tmp)
            size = files["safetensors"].stat().st_size
            print(f"\n### {model}: {params / 1e6:.1f} M parameters ({values / 1e6:.1f} M values in the state dict), "
                  f"files of {size / MiB:.0f} MiB (params + params_ema; params_ema is loaded)\n")
            print("| file | reader | procs | cache | read s | into s | peak +MiB | anon MiB | file MiB | PSS MiB |")
            print("|---|---|---|---|---|---|---|---|---|---|")
            cases = [(fmt, "load_weights") for fmt in FORMATS] + [("pth", "bytes")]
            for fmt, method in cases:
                for procs in sorted({1, max(1, args.procs)}):
                    for cold in (True, False):
                        runs = [_run(model, files[fmt], method, procs, cold, tmp)
                                for _ in range(1 if cold else args.repeats)]
                        s = _summary(runs)
                        print(f"| {fmt} | {method} | {procs} | {'cold' if cold else 'warm'} | {s['read_s']:.3f} "
                              f"| {s['into_s']:.3f} | {s['peak'] / MiB:.0f} | {s['anon'] / MiB:.0f} "
                              f"| {s['file'] / MiB:.0f} | {s['pss'] / MiB:.0f} |", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(*sys.argv[2:8])
    else:
        main()

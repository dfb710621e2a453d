"""How fast a run ends around a failure: a killed rank, a killed parent, SIGTERM (save, then exit).

A tiny EDSR x2 trains on 8 bundled T91 images (CPU; 1 process or 2 gloo ranks) until it has logged 3
iterations; then the event is caused and the wall time until the job (or its workers) is gone is measured:

* ``kill-rank``: SIGKILL to rank 1 of 2; the parent must stop rank 0 and exit 2 with one line.
* ``kill-parent``: SIGKILL to the parent of 2 ranks; the workers must die with it (PR_SET_PDEATHSIG).
* ``sigterm-1`` / ``sigterm-2``: SIGTERM to the parent; the step finishes, a training state is saved, exit 143.

    PYTHONPATH=. python benchmarks/bench_failure_exit.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CASES = ("kill-rank", "kill-parent", "sigterm-1", "sigterm-2")


def _options(tmp: Path, train: Path, name: str, num_gpu: int) -> Path:
    opt = {
        "name": name, "model_type": "SRModel", "scale": 2, "num_gpu": num_gpu, "accelerator": "cpu",
        "manual_seed": 0, "path": {"root": str(tmp)},
        "datasets": {"train": {"name": "t", "type": "PairedImageDataset", "dataroot_gt": str(train),
                               "lq_from_gt": True, "gt_size": 32, "use_hflip": True, "use_rot": True,
                               "batch_size_per_gpu": 4, "num_worker_per_gpu": 0}},
        "network_g": {"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 16, "num_block": 1,
                      "upscale": 2, "img_range": 1.0, "rgb_mean": [0.5, 0.5, 0.5]},
        "train": {"total_iter": 100000, "precision": "fp32", "channels_last": False,
                  "optim_g": {"type": "Adam", "lr": 1e-3}, "pixel_opt": {"type": "L1Loss"}},
        "logger": {"print_freq": 1, "save_checkpoint_freq": 100000, "use_tb_logger": False},
    }
    path = tmp / f"{name}.yml"
    path.write_text(yaml.safe_dump(opt))
    return path


def _workers(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(k) for k in out if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes()]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def run_case(case: str, tmp: Path, train: Path, n: int) -> tuple[float, int | None, str]:
    """Seconds from the event until the job is gone, the exit code (None: parent killed), the last stderr line."""
    num_gpu = 1 if case == "sigterm-1" else 2
    path = _options(tmp, train, f"{case}_{n}", num_gpu)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "anysr", "train", "-opt", str(path)], cwd=tmp, env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    seen = 0
    for line in proc.stdout:
        seen += bool(re.search(r"iter:\s+\d+", line))
        if seen >= 3:
            break
    workers = _workers(proc.pid)
    t0 = time.perf_counter()
    if case == "kill-rank":
        os.kill(workers[1], signal.SIGKILL)
    elif case == "kill-parent":
        os.kill(proc.pid, signal.SIGKILL)
    else:
        os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    while any(_alive(w) for w in workers):
        time.sleep(0.005)
    dt = time.perf_counter() - t0
    last = next((ln for ln in reversed(out.splitlines()) if ln.startswith("anysr")), "")
    return dt, None if case == "kill-parent" else proc.returncode, last


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        train = tmp / "train"
        train.mkdir()
        for p in sorted((ROOT / "datasets" / "T91" / "HR").glob("*.png"))[:8]:
            shutil.copy(p, train / p.name)
        print("| event | exit code | seconds until gone (each run) | message |\n|---|---|---|---|")
        for case in args.cases:
            runs = [run_case(case, tmp, train, i) for i in range(args.repeats)]
            times = ", ".join(f"{t:.2f}" for t, _, _ in runs)
            print(f"| {case} | {runs[0][1] if runs[0][1] is not None else '-'} | {times} | {runs[0][2][:90]} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

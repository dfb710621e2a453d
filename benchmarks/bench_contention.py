"""Two trainings on the same cores: each one's step time against one alone (benchmarks/contention.md).

Runs ``anysr bench --beside 1`` on the quick start (EDSR x2, batch 16 of 48x48 LR crops) with the thread choice
left to anysr (``ANYSR_THREADS=auto``, the default) and with the old fair split that ignores other programs
(``ANYSR_THREADS=fair``), then two separate ``anysr bench`` processes (started together, and 3 s apart: the
second while the first calibrates), then the bench beside a pure-Python CPU hog (one core busy, not anysr). Run
it on an otherwise idle machine, from the repository root:

    PYTHONPATH=. python benchmarks/bench_contention.py --iters 20

Prints one line per case; ``--json FILE`` keeps the raw results.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OPTIONS = "options/train/quickstart_EDSR_x2.yml"
HOG = "import time\nend = time.time() + 3600\nwhile time.time() < end:\n    pass\n"


def _bench(args: list[str], env: dict[str, str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        subprocess.run([sys.executable, "-m", "anysr", "bench", "-opt", OPTIONS, *args, "--json", str(out)],
                       env=env, check=True, capture_output=True, text=True)
        return json.loads(out.read_text())


def _separate(common: list[str], env: dict[str, str], delay: float) -> list[dict]:
    """Two ``anysr bench`` processes of their own (not ``--beside``), the second started ``delay`` s after the
    first (0: together; a few seconds: while the first calibrates); each one's result."""
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"r{k}.json" for k in range(2)]
        procs = []
        for k, out in enumerate(outs):
            if k:
                time.sleep(delay)
            procs.append(subprocess.Popen([sys.executable, "-m", "anysr", "bench", "-opt", OPTIONS, *common,
                                           "--json", str(out)], env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, text=True))
        for p in procs:
            _, err = p.communicate()
            if p.returncode:
                raise SystemExit(f"anysr bench failed ({p.returncode}):\n{err}")
        return [json.loads(out.read_text()) for out in outs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", default=None)
    a = parser.parse_args()
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "ANYSR_THREADS")}
    common = ["--iters", str(a.iters), "--warmup", str(a.warmup), "--infer-size", "0"]
    results: dict = {"cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M"), "load_before": os.getloadavg()}
    for mode in ("auto", "fair"):
        r = _bench([*common, "--beside", "1"], {**base, "ANYSR_THREADS": mode})
        results[f"two_jobs_{mode}"] = r
        slow = ", ".join(f"{c['ms_per_iter']:.0f} ms ({c['threads']} thr, {c['slowdown']:.2f}x)" for c in r["together"])
        print(f"ANYSR_THREADS={mode}: alone {r['alone']['ms_per_iter']:.0f} ms ({r['alone']['threads']} thr); "
              f"two at once: {slow}", flush=True)
    alone = results["two_jobs_auto"]["alone"]["ms_per_iter"]
    for delay in (0.0, 3.0):  # two separate processes: started together, and one while the other calibrates
        runs = _separate(common, {**base, "ANYSR_THREADS": "auto"}, delay)
        results[f"separate_{delay:g}s"] = [{"ms_per_iter": r["train"]["ms_per_iter"], "threads": r["threads"]}
                                           for r in runs]
        each = ", ".join(f"{r['train']['ms_per_iter']:.0f} ms ({r['threads']} thr, "
                         f"{r['train']['ms_per_iter'] / alone:.2f}x)" for r in runs)
        print(f"two separate anysr bench processes, the second {delay:g} s after the first: {each}", flush=True)
    hog = subprocess.Popen([sys.executable, "-c", HOG])
    try:
        time.sleep(1.0)
        for mode in ("auto", "fair"):
            r = _bench(common, {**base, "ANYSR_THREADS": mode})
            results[f"beside_hog_{mode}"] = {"ms_per_iter": r["train"]["ms_per_iter"], "threads": r["threads"]}
            alone = results[f"two_jobs_{mode}"]["alone"]["ms_per_iter"]
            print(f"ANYSR_THREADS={mode} beside a CPU hog: {r['train']['ms_per_iter']:.0f} ms ({r['threads']} thr, "
                  f"{r['train']['ms_per_iter'] / alone:.2f}x alone)", flush=True)
    finally:
        hog.kill()
        hog.wait()
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()

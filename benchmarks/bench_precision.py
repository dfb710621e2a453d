"""precision x memory format on this CPU, as it is and as an AVX2-only CPU computes: does `auto` pick the faster?

Runs ``anysr bench`` (real model, optimiser, loss, EMA on a synthetic batch) for the quick start and MSRResNet x4
with fp32 / bf16 / auto and NCHW / channels_last, once with this CPU's kernels and once capped at AVX2
(``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``: what a CPU without AVX-512 runs). Variants are
interleaved over ``--rounds`` and the lowest median per variant is kept (the least disturbed run). Prints a
Markdown table; ``--json`` keeps every number.

    PYTHONPATH=. python benchmarks/bench_precision.py --rounds 3 --json benchmarks/results/precision.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
MODELS = {
    "quickstart_EDSR_x2": ("options/train/quickstart_EDSR_x2.yml", [], 10),
    "MSRResNet_x4 (batch 4)": ("options/train/train_MSRResNet_x4.yml", ["datasets.train.batch_size_per_gpu=4"], 4),
}
VARIANTS = [("fp32", "false"), ("fp32", "true"), ("bf16", "false"), ("bf16", "true"), ("auto", "auto")]


def run(options: str, overrides: list[str], precision: str, layout: str, iters: int, env: dict[str, str],
        warmup: int = 2) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "anysr", "bench", "-opt", options, "--iters", str(iters), "--warmup",
               str(warmup), "--infer-iters", "1" if warmup < 2 else "2", "--infer-size", "128", "--precision",
               precision, "--json", str(out),
               "--force_yml", "accelerator=cpu", f"train.channels_last={layout}", *overrides]
        subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, check=True, capture_output=True)
        return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    results: dict[str, dict] = {}
    for round_ in range(args.rounds):
        for isa, env in (("native", {}), ("avx2", AVX2)):
            for model, (options, overrides, iters) in MODELS.items():
                for precision, layout in VARIANTS:
                    slow = isa == "avx2" and precision == "bf16"  # emulated: ~24x slower; measured once, 2 steps
                    if slow and round_:
                        continue
                    r = run(options, overrides, precision, layout, 2 if slow else iters, env, 1 if slow else 2)
                    key = f"{isa}|{model}|{precision}|{layout}"
                    best = results.get(key)
                    if best is None or r["train"]["ms_per_iter"] < best["train"]["ms_per_iter"]:
                        results[key] = r
    print("| CPU kernels | options | precision asked | chosen | channels_last | train ms / iter | "
          "infer ms / 128² image |")
    print("|---|---|---|---|---|---:|---:|")
    for key, r in results.items():
        isa, model, precision, _ = key.split("|")
        print(f"| {isa} | {model} | {precision} | {r['precision']} | {'on' if r['channels_last'] else 'off'} | "
              f"{r['train']['ms_per_iter']:.1f} | {r['infer']['ms_per_image']:.1f} |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

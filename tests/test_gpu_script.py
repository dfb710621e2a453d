"""``benchmarks/gpu.sh --cpu-check``: the GPU benchmark's steps run on the CPU and fill every table (no timings
are asserted); the dense-bf16 peak table picks the right row for real device names."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NETWORKS = ("MSRResNet", "EDSR", "RRDBNet", "SwinIR", "HAT-S")


def _bench_gpu():  # noqa: ANN202 - the benchmark script as a module
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "benchmarks" / "bench_gpu.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_peak_table_matches_device_names() -> None:
    peak = _bench_gpu().peak_bf16
    assert peak("NVIDIA H200") == 989.0
    assert peak("NVIDIA H100 80GB HBM3") == 989.0 and peak("NVIDIA H100 PCIe") == 756.0
    assert peak("NVIDIA H100 NVL") == 835.0 and peak("NVIDIA GH200 480GB") == 989.0
    assert peak("NVIDIA A100-SXM4-80GB") == 312.0 and peak("NVIDIA A100 80GB PCIe") == 312.0
    assert peak("NVIDIA L4") == 121.0 and peak("NVIDIA L40S") == 362.0 and peak("NVIDIA A10") == 125.0
    assert peak("Tesla V100-SXM2-16GB") is None and peak("CPU: AMD EPYC (2 cores)") is None


@pytest.mark.slow
def test_gpu_script_cpu_check_fills_every_table(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "GPU_BENCH_OUT": str(tmp_path / "out"),
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--cpu-check"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "out"
    for step in ("1. environment", "2. CUDA tests", "3. BasicSR", "4. training speed", "5. Real-ESRNet"):
        assert step in proc.stdout
    assert "BasicSR comparison skipped" in proc.stdout
    result = json.loads((out / "gpu.json").read_text())
    assert result["cpu_check"] is True and result["device"]["peak_bf16_tflops"] is None
    assert sorted(r["network"] for r in result["bench"]) == sorted(NETWORKS)
    for row in result["bench"]:
        assert "error" not in row, row
        for key in ("iters_per_s", "images_per_s", "tflops", "peak_mib", "ms_per_iter"):
            assert math.isfinite(row[key]) and row[key] > 0, (row["network"], key)
    (train,) = result["trainings"]
    assert "error" not in train, train
    assert train["network"] == "MSRResNet" and 0 <= train["stall_share"] < 1 and train["ms_per_iter"] > 0
    md = (out / "gpu.md").read_text()
    for name in NETWORKS:
        assert f"| {name} |" in md
    assert not re.search(r"\bnan\b", md, re.I) and "failed" not in md
    assert "peak unknown" in md
    realworld = (out / "realworld.md").read_text()
    rows = [ln for ln in realworld.splitlines() if ln.startswith(("| step", "| loader"))]
    assert len(rows) == 2 and not re.search(r"\bnan\b", realworld, re.I)
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")][1:-1]
        assert cells and all(float(c) >= 0 for c in cells), row


def test_markdown_of_a_gpu_run() -> None:
    """The page section a GPU run writes: the share of the bf16 peak, failed rows kept with their reason."""
    bg = _bench_gpu()
    row = {"network": "EDSR", "precision": "bf16", "channels_last": True, "compile": False, "batch": 16,
           "lq_size": 48, "iters_per_s": 40.0, "images_per_s": 640.0, "peak_mib": 3210.4, "tflops": 98.9,
           "peak_kind": "device (max_memory_allocated)"}
    failed = {"network": "MSRResNet", "precision": "fp16", "channels_last": True, "compile": True,
              "error": "timed out"}
    train = {"network": "EDSR", "framework": "BasicSR 1.4.2", "precision": "fp32", "channels_last": False,
             "workers": 6, "ms_per_iter": 20.0, "data_ms": 5.0, "stall_share": 0.25, "peak_mib": 2000.0}
    result = {"date": "2026-12-02 08:00 UTC", "cpu_check": False, "cores": 16, "load_start": 0.1,
              "command": "benchmarks/bench_gpu.py", "device": {"name": "NVIDIA H200", "torch": "2.9", "cuda": "12.8",
                                                                "capability": "9.0", "memory_gib": 139.8,
                                                                "peak_bf16_tflops": 989.0},
              "bench": [row, failed], "trainings": [train], "skipped": ["bench HAT-S bf16/True/True (needs ~150 s)"],
              "basicsr": "1.4.2 from /tmp/x (fp32, its own loop)"}
    md = bg.markdown(result)
    lines = md.splitlines()
    msr = lines.index(next(ln for ln in lines if ln.startswith("| MSRResNet")))
    edsr = lines.index(next(ln for ln in lines if ln.startswith("| EDSR | 16 x 48²")))
    assert msr < edsr  # rows in the networks' order, whatever order they ran in
    assert "| EDSR | 16 x 48² | bf16 | on | off | 40.00 | 640.0 | 3210 | 98.9 | 10.0 |" in md
    assert "failed: timed out" in md and "989 TFLOP/s" in md and "Left out for time: bench HAT-S" in md
    assert "| EDSR | BasicSR 1.4.2 | fp32 | off | 6 | 20.0 | 5.0 | 25.0 % | 2000 |" in md
    assert bg._last_window("x time (data): 0.155 (0.104)] y\nz time (data): 0.046 (0.017)] w") == (0.046, 0.017)

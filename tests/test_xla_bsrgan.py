"""BSRGAN training on XLA:CPU (run in the XLA venv: PJRT_DEVICE=CPU python -m pytest -m xla tests/test_xla_bsrgan.py).

BSRGANDataset degrades in the loader workers, so its random resizes never reach the device: an SRModel run of 40
iterations compiles no more graphs than one of 20, none after warm-up, nothing falls back to the CPU, and the run
resumes bit-exactly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("PJRT_DEVICE", "CPU")
pytest.importorskip("torch_xla")

import torch  # noqa: E402
import yaml  # noqa: E402

pytestmark = pytest.mark.xla

ROOT = Path(__file__).resolve().parents[1]
PRINT, VAL = 5, 10


def _options(name: str, train_dir: Path, val_dir: Path, total: int) -> dict[str, Any]:
    return {
        "name": name, "model_type": "SRModel", "scale": 4, "accelerator": "xla", "num_gpu": 1, "manual_seed": 5,
        "datasets": {
            "train": {"name": "t91", "type": "BSRGANDataset", "degradation_type": "bsrgan_plus",
                      "dataroot_gt": str(train_dir), "gt_size": 32, "degrade_size": 64, "use_hflip": True,
                      "num_worker_per_gpu": 0, "batch_size_per_gpu": 2},
            "val": {"name": "val", "type": "PairedImageDataset", "dataroot_gt": str(val_dir), "lq_from_gt": True}},
        "network_g": {"type": "SRVGGNetCompact", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 8, "num_conv": 2,
                      "upscale": 4, "act_type": "prelu"},
        # With an EMA: while its weights were Python floats, 40 iterations compiled 15 graphs against 14 in 20.
        "train": {"optim_g": {"type": "Adam", "lr": 1e-3}, "total_iter": total, "ema_decay": 0.9,
                  "pixel_opt": {"type": "L1Loss", "loss_weight": 1.0}},
        "val": {"val_freq": VAL, "metrics": {"psnr": {"type": "calculate_psnr", "crop_border": 4}}},
        "logger": {"print_freq": PRINT, "save_checkpoint_freq": 20, "use_tb_logger": False},
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("xla_bsrgan")
    train, val = root / "train", root / "val"
    train.mkdir()
    val.mkdir()
    for p in sorted((ROOT / "datasets" / "T91" / "HR").glob("*.png"))[:6]:
        shutil.copy(p, train / p.name)
    shutil.copy(ROOT / "datasets" / "Set5" / "HR" / "butterfly.png", val / "butterfly.png")

    def train_run(name: str, total: int, *extra: str) -> Path:
        path = root / f"{name}.yml"
        path.write_text(yaml.safe_dump(_options(name, train, val, total), sort_keys=False))
        env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "1",
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        env.pop("XLA_USE_SPMD", None)
        proc = subprocess.run([sys.executable, "-m", "anysr", "train", "-opt", str(path), "--force_yml",
                               f"path.root={root}", *extra], cwd=root, env=env, capture_output=True, text=True,
                              timeout=900, check=False)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        return root / "experiments" / name

    out = {"short": train_run("short", 20), "long": train_run("long", 40)}
    split = train_run("split", 20)
    out["split"] = train_run("split", 40, "--auto_resume")
    assert split == out["split"]
    return out


def _summary(exp: Path) -> dict[str, Any]:
    return json.loads((exp / "summary.json").read_text())


def test_forty_iterations_compile_no_more_graphs_than_twenty(runs: dict[str, Path]) -> None:
    short, long = _summary(runs["short"]), _summary(runs["long"])
    assert short["finished"] and long["finished"] and long["iterations_done"] == 40
    assert long["stats"]["compiles"] == short["stats"]["compiles"], (short["stats"], long["stats"])
    assert long["stats"]["compiles_after_warmup"] == 0 and short["stats"]["compiles_after_warmup"] == 0
    assert long["stats"]["cpu_fallbacks"] == {}
    log = "\n".join(p.read_text() for p in (runs["long"] / "log").glob("train_*.log"))
    assert "new graph(s) after warm-up" not in log


def test_xla_resume_is_bit_exact(runs: dict[str, Path]) -> None:
    from safetensors.torch import load_file

    a = load_file(str(runs["long"] / "models" / "net_g_40.safetensors"))
    b = load_file(str(runs["split"] / "models" / "net_g_40.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

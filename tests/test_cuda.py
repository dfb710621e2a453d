"""CUDA checks (marked ``cuda``): run where a GPU exists, skipped elsewhere. Same CLI, same options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import run_cli, tiny_train_options, write_options
from safetensors.torch import load_file

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _train(tmp_path: Path, name: str, train_dir: Path, val_dir: Path, **over: object) -> dict:
    opt = tiny_train_options(name, train_dir, val_dir, total_iter=6)
    opt.update({k: v for k, v in over.items() if "." not in k})
    for key, value in over.items():
        if "." in key:
            section, sub = key.split(".", 1)
            opt[section][sub] = value
    run_cli("train", "-opt", str(write_options(tmp_path / f"{name}.yml", opt)), "--force_yml",
            f"path.root={tmp_path}", cwd=tmp_path)
    return json.loads((tmp_path / "experiments" / name / "summary.json").read_text())


def test_cuda_matches_cpu(tmp_path: Path, small_train_dir: Path, small_val_dir: Path) -> None:
    cpu = _train(tmp_path, "cpu", small_train_dir, small_val_dir, accelerator="cpu")
    gpu = _train(tmp_path, "gpu", small_train_dir, small_val_dir, accelerator="cuda")
    assert gpu["accelerator"]["kind"] == "cuda"
    a = load_file(str(tmp_path / "experiments" / "cpu" / "models" / "net_g_6.safetensors"))
    b = load_file(str(tmp_path / "experiments" / "gpu" / "models" / "net_g_6.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-3, atol=1e-4)
    assert gpu["validation"]["val"]["psnr"]["value"] == pytest.approx(cpu["validation"]["val"]["psnr"]["value"],
                                                                      abs=0.05)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_cuda_mixed_precision(tmp_path: Path, small_train_dir: Path, small_val_dir: Path, precision: str) -> None:
    s = _train(tmp_path, precision, small_train_dir, small_val_dir, accelerator="cuda",
               **{"train.precision": precision})
    assert s["accelerator"]["precision"] == precision and 0 < s["final_losses"]["l_pix"] < 1


def test_cuda_auto_uses_all_gpus(tmp_path: Path, small_train_dir: Path, small_val_dir: Path) -> None:
    s = _train(tmp_path, "auto", small_train_dir, small_val_dir, accelerator="auto", num_gpu="auto")
    assert s["accelerator"]["kind"] == "cuda"
    assert s["accelerator"]["world_size"] == torch.cuda.device_count()


def test_cuda_resume_on_cpu(tmp_path: Path, small_train_dir: Path, small_val_dir: Path) -> None:
    opt = tiny_train_options("x", small_train_dir, small_val_dir, total_iter=4)
    opt["accelerator"] = "cuda"
    path = write_options(tmp_path / "x.yml", opt)
    run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    proc = run_cli("train", "-opt", str(path), "--auto_resume", "--force_yml", f"path.root={tmp_path}",
                   "accelerator=cpu", "train.total_iter=6", cwd=tmp_path)
    assert "resumed from" in proc.stdout

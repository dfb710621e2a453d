"""Data parallel on CPU ranks (gloo): 2 spawned ranks == 1 process with the same global batch; torchrun joins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_cli, tiny_train_options, write_options
from safetensors.torch import load_file


def _run(tmp_path: Path, name: str, train_dir: Path, val_dir: Path, *, num_gpu: int, batch: int) -> Path:
    opt = tiny_train_options(name, train_dir, val_dir, total_iter=4)
    opt["num_gpu"] = num_gpu
    opt["datasets"]["train"]["batch_size_per_gpu"] = batch
    opt["val"]["val_freq"] = 4
    return write_options(tmp_path / f"{name}.yml", opt)


def _compare(tmp_path: Path, a: str, b: str) -> None:
    wa = load_file(str(tmp_path / "experiments" / a / "models" / "net_g_4.safetensors"))
    wb = load_file(str(tmp_path / "experiments" / b / "models" / "net_g_4.safetensors"))
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-5, msg=f"{k}")
    va = json.loads((tmp_path / "experiments" / a / "summary.json").read_text())["validation"]
    vb = json.loads((tmp_path / "experiments" / b / "summary.json").read_text())["validation"]
    assert va["val"]["psnr"]["value"] == pytest.approx(vb["val"]["psnr"]["value"], abs=2e-3)


@pytest.mark.slow
def test_two_gloo_ranks_match_one_process(tmp_path: Path, small_train_dir: Path, small_val_dir: Path) -> None:
    one = _run(tmp_path, "one", small_train_dir, small_val_dir, num_gpu=1, batch=4)
    two = _run(tmp_path, "two", small_train_dir, small_val_dir, num_gpu=2, batch=2)
    run_cli("train", "-opt", str(one), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    proc = run_cli("train", "-opt", str(two), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    assert "rank 0/2" in proc.stdout
    _compare(tmp_path, "one", "two")
    summary = json.loads((tmp_path / "experiments" / "two" / "summary.json").read_text())
    assert summary["accelerator"]["world_size"] == 2 and summary["accelerator"]["launcher"] == "spawn"


@pytest.mark.slow
def test_torchrun_joins_instead_of_spawning(tmp_path: Path, small_train_dir: Path, small_val_dir: Path) -> None:
    one = _run(tmp_path, "one", small_train_dir, small_val_dir, num_gpu=1, batch=4)
    tr = _run(tmp_path, "tr", small_train_dir, small_val_dir, num_gpu=1, batch=2)  # num_gpu ignored: torchrun rules
    run_cli("train", "-opt", str(one), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "anysr.train", "-opt", str(tr), "--force_yml", f"path.root={tmp_path}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "experiments" / "tr" / "summary.json").read_text())
    assert summary["accelerator"]["launcher"] == "torchrun" and summary["accelerator"]["world_size"] == 2
    _compare(tmp_path, "one", "tr")


def test_impossible_rank_count_is_a_clear_error(tmp_path: Path, small_train_dir: Path) -> None:
    opt = tiny_train_options("many", small_train_dir, None)
    opt["num_gpu"] = 512
    path = write_options(tmp_path / "m.yml", opt)
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert "num_gpu: 512 CPU ranks" in proc.stderr and "Traceback" not in proc.stderr

"""Real-ESRGAN training end to end on the CPU: exact resume after kill -9 (pool included), 2 gloo ranks = 1 process,
the loader workers, and ``anysr prepare degrade`` showing exactly what the training step trains on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch
from conftest import ROOT, run_cli, write_options
from safetensors.torch import load_file
from test_realesrgan import real_options

from anysr.cli import main
from anysr.data.transforms import tensor2img
from anysr.models.realesrgan import RealESRNetModel


def _weights(root: Path, name: str, it: int) -> dict[str, torch.Tensor]:
    return load_file(str(root / "experiments" / name / "models" / f"net_g_{it}.safetensors"))


def _identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs"


def _gan(name: str, train_dir: Path, total: int, **kw: Any) -> dict[str, Any]:
    return real_options(name, train_dir, model="RealESRGANModel", total_iter=total, **kw)


@pytest.mark.slow
def test_realesrgan_kill_minus_nine_then_resume_matches(tmp_path: Path, small_train_dir: Path) -> None:
    """SIGKILL a RealESRGANModel run saving every iteration (pool filling, then full), resume, compare."""
    total = 10
    ref = write_options(tmp_path / "ref.yml", _gan("ref", small_train_dir, total))
    run_cli("train", "-opt", str(ref), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    opt = _gan("killed", small_train_dir, total)
    opt["logger"]["save_checkpoint_freq"] = 1
    path = write_options(tmp_path / "k.yml", opt)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.setdefault("OMP_NUM_THREADS", "2")  # as run_cli: the same thread count in both runs
    states = tmp_path / "experiments" / "killed" / "training_states"
    proc = subprocess.Popen([sys.executable, "-m", "anysr", "train", "-opt", str(path), "--force_yml",
                             f"path.root={tmp_path}"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    while time.time() < deadline and len(list(states.glob("*.state"))) < 3:  # the pool (2 rows) is full by then
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = sorted(int(p.stem) for p in states.glob("*.state"))
    assert done and done[-1] < total, done
    state = torch.load(states / f"{done[-1]}.state", weights_only=True)
    assert state["model"]["pool"]["data"]["lq"].dtype == torch.uint8 and "net_d" in state["model"]["nets"]
    run_cli("train", "-opt", str(path), "--auto_resume", "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    _identical(_weights(tmp_path, "killed", total), _weights(tmp_path, "ref", total))


@pytest.mark.slow
def test_two_gloo_ranks_match_one_process(tmp_path: Path, small_train_dir: Path) -> None:
    """The same global batch (4) and pool rows (2): one process, or two ranks of 2 with half the pool each."""
    for name, model in (("net", "RealESRNetModel"), ("gan", "RealESRGANModel")):
        one = real_options(f"{name}1", small_train_dir, model=model, batch=4, queue=8, total_iter=5)
        two = real_options(f"{name}2", small_train_dir, model=model, batch=2, queue=4, total_iter=5, num_gpu=2)
        for opt in (one, two):
            opt["logger"]["save_checkpoint_freq"] = 5
            run_cli("train", "-opt", str(write_options(tmp_path / f"{opt['name']}.yml", opt)), "--force_yml",
                    f"path.root={tmp_path}", cwd=tmp_path)
        a, b = _weights(tmp_path, f"{name}1", 5), _weights(tmp_path, f"{name}2", 5)
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=f"{name}: {k}")
        summary = json.loads((tmp_path / "experiments" / f"{name}2" / "summary.json").read_text())
        assert summary["accelerator"]["world_size"] == 2
        # the two-rank state holds the whole pool (both ranks' columns), as the one-process state does
        sa = torch.load(tmp_path / "experiments" / f"{name}1" / "training_states" / "5.state", weights_only=True)
        sb = torch.load(tmp_path / "experiments" / f"{name}2" / "training_states" / "5.state", weights_only=True)
        assert sa["model"]["pool"]["data"]["lq"].shape == sb["model"]["pool"]["data"]["lq"].shape == (2, 4, 3, 8, 8)
        assert torch.equal(sa["model"]["pool"]["data"]["lq"], sb["model"]["pool"]["data"]["lq"])


@pytest.mark.parametrize("where", ["step", "loader"])
def test_resume_is_bit_exact_in_both_places(tmp_path: Path, small_train_dir: Path, where: str) -> None:
    """N+M straight == N, stop, resume, M; the loader's worker count changes nothing either."""
    base = dict(degrade_in=where)
    straight = write_options(tmp_path / "a.yml", real_options("a", small_train_dir, total_iter=6, **base))
    assert main(["train", "-opt", str(straight), "--force_yml", f"path.root={tmp_path}"]) == 0
    split = real_options("b", small_train_dir, total_iter=4, **base)
    if where == "loader":
        split["datasets"]["train"]["num_worker_per_gpu"] = 2
    path = write_options(tmp_path / "b.yml", split)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 0
    assert main(["train", "-opt", str(path), "--auto_resume", "--force_yml", f"path.root={tmp_path}",
                 "train.total_iter=6"]) == 0
    _identical(_weights(tmp_path, "a", 6), _weights(tmp_path, "b", 6))


def test_prepare_degrade_shows_what_the_step_trains_on(tmp_path: Path, small_train_dir: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The pairs `anysr prepare degrade` writes are the (LQ, GT) the model's losses saw, pool included."""
    seen: list[tuple[np.ndarray, np.ndarray]] = []
    original = RealESRNetModel.targets

    def record(self: Any, lq: torch.Tensor, gt: torch.Tensor) -> dict[str, Any]:
        seen.extend((tensor2img(lq[j]), tensor2img(gt[j])) for j in range(lq.shape[0]))
        return original(self, lq, gt)

    monkeypatch.setattr(RealESRNetModel, "targets", record)
    opt = real_options("shown", small_train_dir, total_iter=5, gt_usm=False)
    path = write_options(tmp_path / "s.yml", opt)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 0
    assert len(seen) == 10
    proc = run_cli("prepare", "degrade", "-opt", str(path), "--force_yml", f"path.root={tmp_path}",
                   "--out", str(tmp_path / "pairs"), "-n", "10", cwd=tmp_path)
    assert "wrote 10 LQ/GT pair(s)" in proc.stdout and "(synthesised in the step)" in proc.stdout
    out = tmp_path / "pairs"
    for j, (lq, gt) in enumerate(seen):  # pairs 4.. come out of the full pool
        assert np.array_equal(cv2.imread(str(out / f"{j:04d}_lq.png")), lq), j
        assert np.array_equal(cv2.imread(str(out / f"{j:04d}_gt.png")), gt), j
        kernel = cv2.imread(str(out / f"{j:04d}_kernel1.png"), cv2.IMREAD_GRAYSCALE)
        assert kernel.shape == (168, 168) and kernel.max() == 255
    meta = json.loads((out / "degrade.json").read_text())
    assert meta["degrade_in"] == "step" and [p["pair"] for p in meta["pairs"]] == [f"{j:04d}" for j in range(10)]
    first = meta["pairs"][0]
    assert first["iteration"] == 1 and first["stage1"]["noise"] in ("gaussian", "poisson")
    assert {"kernel1", "kernel2", "sinc_kernel"} == set(first["kernels"])
    # the loader's synthesis, and the errors: a non-empty output, a model that does not synthesise
    run_cli("prepare", "degrade", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", "--degrade-in",
            "loader", "--out", str(tmp_path / "loader"), "-n", "3", cwd=tmp_path)
    assert json.loads((tmp_path / "loader" / "degrade.json").read_text())["degrade_in"] == "loader"
    again = run_cli("prepare", "degrade", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", "--out",
                    str(out), cwd=tmp_path, check=False)
    assert again.returncode == 2 and "is not empty; delete it or choose another output folder" in again.stderr
    paired = write_options(tmp_path / "p.yml", dict(real_options("p", small_train_dir), model_type="RealESRNetModel",
                                                    high_order_degradation=False, datasets={"train": {
                                                        "name": "p", "type": "PairedImageDataset",
                                                        "dataroot_gt": str(small_train_dir), "lq_from_gt": True,
                                                        "gt_size": 32, "batch_size_per_gpu": 2}}))
    read = run_cli("prepare", "degrade", "-opt", str(paired), "--force_yml", f"path.root={tmp_path}", "--out",
                   str(tmp_path / "p"), "-n", "2", cwd=tmp_path)  # pairs read from the dataset (test_training_pairs)
    assert "(read from the dataset)" in read.stdout and (tmp_path / "p" / "0001_lq.png").is_file()
    bad = run_cli("prepare", "degrade", "-opt", str(paired), "--force_yml", f"path.root={tmp_path}", "--out",
                  str(tmp_path / "q"), "--degrade-in", "step", cwd=tmp_path, check=False)
    assert bad.returncode == 2 and "does not synthesise its training pairs" in bad.stderr

"""Training end to end on real images: exact resume, NaN stop, experiment safety, summary, CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, assert_same_weights, run_cli, saved_weights, tiny_train_options, write_options

from anysr.cli import main


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_is_bit_exact(tmp_path: Path, small_train_dir: Path, workers: int) -> None:
    """N+M straight == N, stop, resume, M (weights and EMA, bit for bit), whatever the worker count."""
    straight = write_options(tmp_path / "a.yml", tiny_train_options("straight", small_train_dir, None,
                                                                    total_iter=6, workers=workers))
    assert main(["train", "-opt", str(straight), "--force_yml", f"path.root={tmp_path}"]) == 0
    split = write_options(tmp_path / "b.yml", tiny_train_options("split", small_train_dir, None,
                                                                 total_iter=4, workers=workers))
    assert main(["train", "-opt", str(split), "--force_yml", f"path.root={tmp_path}"]) == 0
    assert main(["train", "-opt", str(split), "--auto_resume", "--force_yml", f"path.root={tmp_path}",
                 "train.total_iter=6"]) == 0
    exp_a, exp_b = tmp_path / "experiments" / "straight", tmp_path / "experiments" / "split"
    assert_same_weights(saved_weights(exp_a, 6), saved_weights(exp_b, 6))
    # The training state is plain weights_only-loadable data.
    state = torch.load(exp_b / "training_states" / "6.state", weights_only=True)
    assert state["iter"] == 6
    summary = json.loads((exp_b / "summary.json").read_text())
    assert summary["iterations_done"] == 6 and summary["finished"]


def test_worker_count_does_not_change_the_stream(tmp_path: Path, small_train_dir: Path) -> None:
    for w in (0, 2):
        opt = write_options(tmp_path / f"w{w}.yml", tiny_train_options(f"w{w}", small_train_dir, None,
                                                                        total_iter=2, workers=w))
        assert main(["train", "-opt", str(opt), "--force_yml", f"path.root={tmp_path}"]) == 0
    assert_same_weights(saved_weights(tmp_path / "experiments" / "w0", 2),
                        saved_weights(tmp_path / "experiments" / "w2", 2))


def test_existing_experiment_is_never_overwritten(tmp_path: Path, small_train_dir: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    opt = write_options(tmp_path / "a.yml", tiny_train_options("keep", small_train_dir, None, total_iter=2))
    assert main(["train", "-opt", str(opt), "--force_yml", f"path.root={tmp_path}"]) == 0
    before = (tmp_path / "experiments" / "keep" / "training_states" / "2.state").read_bytes()
    assert main(["train", "-opt", str(opt), "--force_yml", f"path.root={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "already holds training states" in err and "--auto_resume" in err
    assert (tmp_path / "experiments" / "keep" / "training_states" / "2.state").read_bytes() == before


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path: Path, small_train_dir: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # lr so large that Adam's first steps overflow to inf/NaN after the first save.
    opt = tiny_train_options("nan", small_train_dir, None, total_iter=40)
    opt["train"]["optim_g"] = {"type": "SGD", "lr": 1e12}
    opt["train"]["warmup_iter"] = -1
    opt["logger"]["print_freq"] = 1
    opt["logger"]["save_checkpoint_freq"] = 1
    path = write_options(tmp_path / "nan.yml", opt)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "NaN or infinite at iteration" in err
    states = sorted((tmp_path / "experiments" / "nan" / "training_states").glob("*.state"))
    for s in states:  # whatever was saved is finite
        st = torch.load(s, weights_only=True)
        assert all(torch.isfinite(v).all() for v in st["model"]["nets"]["net_g"].values())


def test_corrupt_newest_state_falls_back(tmp_path: Path, small_train_dir: Path) -> None:
    opt = write_options(tmp_path / "c.yml", tiny_train_options("corrupt", small_train_dir, None, total_iter=4))
    assert main(["train", "-opt", str(opt), "--force_yml", f"path.root={tmp_path}"]) == 0
    states = tmp_path / "experiments" / "corrupt" / "training_states"
    newest = states / "4.state"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    assert main(["train", "-opt", str(opt), "--auto_resume", "--force_yml", f"path.root={tmp_path}",
                 "train.total_iter=4"]) == 0
    # Resumed from 2 and redid 3..4: the result equals a clean run.
    ref = write_options(tmp_path / "r.yml", tiny_train_options("ref", small_train_dir, None, total_iter=4))
    assert main(["train", "-opt", str(ref), "--force_yml", f"path.root={tmp_path}"]) == 0
    assert_same_weights(saved_weights(tmp_path / "experiments" / "corrupt", 4),
                        saved_weights(tmp_path / "experiments" / "ref", 4))


@pytest.mark.slow
def test_kill_minus_nine_then_resume_matches(tmp_path: Path, small_train_dir: Path) -> None:
    """Kill the trainer with SIGKILL mid-run (saving every iteration), resume, compare with a straight run."""
    total = 12
    ref = write_options(tmp_path / "ref.yml", tiny_train_options("ref", small_train_dir, None, total_iter=total))
    run_cli("train", "-opt", str(ref), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    opt = tiny_train_options("killed", small_train_dir, None, total_iter=total)
    opt["logger"]["save_checkpoint_freq"] = 1
    path = write_options(tmp_path / "k.yml", opt)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    states = tmp_path / "experiments" / "killed" / "training_states"
    proc = subprocess.Popen([sys.executable, "-m", "anysr", "train", "-opt", str(path), "--force_yml",
                             f"path.root={tmp_path}"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and len(list(states.glob("*.state"))) < 3:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    run_cli("train", "-opt", str(path), "--auto_resume", "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    assert_same_weights(saved_weights(tmp_path / "experiments" / "killed", total),
                      saved_weights(tmp_path / "experiments" / "ref", total))


def test_train_validates_and_writes_summary_via_cli(tmp_path: Path, small_train_dir: Path,
                                                    small_val_dir: Path) -> None:
    opt = write_options(tmp_path / "v.yml", tiny_train_options("val", small_train_dir, small_val_dir,
                                                               total_iter=6))
    proc = run_cli("train", "-opt", str(opt), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    assert "validation val (3 images)" in proc.stdout
    summary = json.loads((tmp_path / "experiments" / "val" / "summary.json").read_text())
    psnr = summary["validation"]["val"]["psnr"]
    assert 10 < psnr["value"] < 60 and psnr["best_iter"] in (3, 6)
    assert summary["mean_iter_time_s"] > 0 and "l_pix" in summary["final_losses"]


def test_python_m_anysr_train_reports_a_typo_cleanly(tmp_path: Path, small_train_dir: Path) -> None:
    """``python -m anysr.train -opt F`` (BasicSR habit): a misspelled key stops before any work."""
    opt = tiny_train_options("typo", small_train_dir, None)
    opt["datasets"]["train"]["gt_szie"] = opt["datasets"]["train"].pop("gt_size")
    path = write_options(tmp_path / "t.yml", opt)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "anysr.train", "-opt", str(path), "--force_yml",
                           f"path.root={tmp_path}"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "datasets.train.gt_szie" in proc.stderr and "gt_size" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "experiments" / "typo").exists()


def test_gradient_accumulation_equals_larger_batch(tmp_path: Path, small_train_dir: Path) -> None:
    big = tiny_train_options("big", small_train_dir, None, total_iter=3)
    big["train"]["ema_decay"] = 0
    acc = tiny_train_options("acc", small_train_dir, None, total_iter=3)
    acc["train"]["ema_decay"] = 0
    acc["train"]["accumulate"] = 2
    acc["datasets"]["train"]["batch_size_per_gpu"] = 2
    for name, opt in (("big", big), ("acc", acc)):
        opt["logger"]["save_checkpoint_freq"] = 3
        assert main(["train", "-opt", str(write_options(tmp_path / f"{name}.yml", opt)), "--force_yml",
                     f"path.root={tmp_path}"]) == 0
    a, b = saved_weights(tmp_path / "experiments" / "big", 3), saved_weights(tmp_path / "experiments" / "acc", 3)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)


def test_bf16_clipping_and_tensorboard(tmp_path: Path, small_train_dir: Path) -> None:
    opt = tiny_train_options("bf16", small_train_dir, None, total_iter=4)
    opt["train"]["precision"] = "bf16"
    opt["train"]["grad_clip_norm"] = 0.5
    opt["logger"]["use_tb_logger"] = True
    opt["logger"]["save_pth"] = True
    assert main(["train", "-opt", str(write_options(tmp_path / "b.yml", opt)), "--force_yml",
                 f"path.root={tmp_path}"]) == 0
    exp = tmp_path / "experiments" / "bf16"
    summary = json.loads((exp / "summary.json").read_text())
    assert summary["accelerator"]["precision"] == "bf16"
    assert 0 < summary["final_losses"]["l_pix"] < 1
    assert list((exp / "tb_logger").glob("events.out.tfevents.*"))
    pth = torch.load(exp / "models" / "net_g_4.pth", weights_only=True)  # BasicSR-format copy
    assert set(pth) >= {"params", "params_ema"}


@pytest.mark.slow
def test_torch_compile_on_cpu(tmp_path: Path, small_train_dir: Path) -> None:
    opt = tiny_train_options("compiled", small_train_dir, None, total_iter=2)
    opt["train"]["compile"] = True
    assert main(["train", "-opt", str(write_options(tmp_path / "c.yml", opt)), "--force_yml",
                 f"path.root={tmp_path}"]) == 0
    ref = tiny_train_options("eager", small_train_dir, None, total_iter=2)
    assert main(["train", "-opt", str(write_options(tmp_path / "e.yml", ref)), "--force_yml",
                 f"path.root={tmp_path}"]) == 0
    a, b = saved_weights(tmp_path / "experiments" / "compiled", 2), saved_weights(tmp_path / "experiments" / "eager", 2)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-3, atol=1e-4)


def test_resume_guards(tmp_path: Path, small_train_dir: Path, small_val_dir: Path,
                       capsys: pytest.CaptureFixture[str]) -> None:
    """Changed network, lowered total_iter, changed batch: one clear line each; a finished run is left alone."""
    opt = write_options(tmp_path / "g.yml", tiny_train_options("guard", small_train_dir, small_val_dir,
                                                               total_iter=4))
    root = f"path.root={tmp_path}"
    assert main(["train", "-opt", str(opt), "--force_yml", root]) == 0
    summary = tmp_path / "experiments" / "guard" / "summary.json"
    before = summary.read_text()
    assert main(["train", "-opt", str(opt), "--auto_resume", "--force_yml", root]) == 0  # nothing to do
    assert summary.read_text() == before
    # Resuming with unchanged options adds no options_*.yml; a changed run records its options.
    assert len(list((tmp_path / "experiments" / "guard").glob("options_*.yml"))) == 1
    assert main(["train", "-opt", str(opt), "--auto_resume", "--force_yml", root, "train.total_iter=3"]) == 2
    assert "train.total_iter: 3 is below the iteration being resumed" in capsys.readouterr().err
    assert main(["train", "-opt", str(opt), "--auto_resume", "--force_yml", root, "train.total_iter=6",
                 "network_g.num_feat=16"]) == 2
    assert "does not fit this run's net_g: shape mismatches" in capsys.readouterr().err
    assert main(["train", "-opt", str(opt), "--auto_resume", "--force_yml", root, "train.total_iter=6",
                 "datasets.train.batch_size_per_gpu=2"]) == 2
    assert "global batch" in capsys.readouterr().err


def test_validation_without_ground_truth_reports_no_metrics(tmp_path: Path, small_train_dir: Path,
                                                            small_val_dir: Path) -> None:
    opt = tiny_train_options("nogt", small_train_dir, small_val_dir, total_iter=3)
    opt["datasets"]["val"] = {"name": "val", "type": "SingleImageDataset", "dataroot_lq": str(small_val_dir),
                              "io_backend": {"type": "disk"}}
    assert main(["train", "-opt", str(write_options(tmp_path / "n.yml", opt)), "--force_yml",
                 f"path.root={tmp_path}"]) == 0
    summary = json.loads((tmp_path / "experiments" / "nogt" / "summary.json").read_text())
    assert summary["validation"]["val"] == {}  # no made-up zeros


def test_bad_validation_data_stops_before_training(tmp_path: Path, small_train_dir: Path, small_val_dir: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    lr = tmp_path / "lr_x4"
    lr.mkdir()
    import cv2

    for p in small_val_dir.glob("*.png"):  # LR made for x4 while the run is x2
        img = cv2.imread(str(p))
        cv2.imwrite(str(lr / p.name), cv2.resize(img, (img.shape[1] // 4, img.shape[0] // 4)))
    opt = tiny_train_options("badval", small_train_dir, small_val_dir, total_iter=3)
    opt["datasets"]["val"].pop("lq_from_gt")
    opt["datasets"]["val"]["dataroot_lq"] = str(lr)
    assert main(["train", "-opt", str(write_options(tmp_path / "b.yml", opt)), "--force_yml",
                 f"path.root={tmp_path}"]) == 2
    assert "lr_x4" in capsys.readouterr().err
    assert not list((tmp_path / "experiments" / "badval" / "training_states").glob("*.state"))


def test_perceptual_loss_on_a_pixel_model_is_refused(tmp_path: Path, small_train_dir: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    opt = tiny_train_options("percep", small_train_dir, None, total_iter=2)
    opt["train"]["perceptual_opt"] = {"type": "PerceptualLoss", "layer_weights": {"conv5_4": 1.0}}
    assert main(["train", "-opt", str(write_options(tmp_path / "p.yml", opt)), "--force_yml",
                 f"path.root={tmp_path}"]) == 2
    assert "train.perceptual_opt: model_type SRModel trains with pixel losses only" in capsys.readouterr().err

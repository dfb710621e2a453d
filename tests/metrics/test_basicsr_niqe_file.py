"""BasicSR's own ``options/train/SRResNet_SRGAN/train_MSRResNet_x4.yml`` (its structure, comments and quirks:
``!!float`` values, a DIV2K meta_info file, nccl, wandb, ``better`` on each metric, NIQE as ``calculate_niqe``)
trains and validates with ``anysr train`` with only its paths changed (and a few iterations for a test)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import cv2
import pytest
from conftest import DATASETS, run_cli

from anysr.engine.prepare.command import prepare_lr
from anysr.metrics.niqe import calculate_niqe

# BasicSR's file, with the dataset paths changed to folders the test prepares (marked "changed").
BASICSR_MSRRESNET_X4 = """\
# Modified SRResNet w/o BN from:
# Photo-Realistic Single Image Super-Resolution Using a Generative Adversarial Network

# general settings
name: 001_MSRResNet_x4_f64b16_DIV2K_1000k_B16G1_wandb
model_type: SRModel
scale: 4
num_gpu: 1  # set num_gpu: 0 for cpu mode
manual_seed: 0

# dataset and data loader settings
datasets:
  train:
    name: DIV2K
    type: PairedImageDataset
    dataroot_gt: {train_gt}  # changed
    dataroot_lq: {train_lq}  # changed
    meta_info_file: ~  # changed (BasicSR's DIV2K list)
    # (for lmdb)
    # dataroot_gt: datasets/DIV2K/DIV2K_train_HR_sub.lmdb
    # dataroot_lq: datasets/DIV2K/DIV2K_train_LR_bicubic_X4_sub.lmdb
    filename_tmpl: '{{}}'
    io_backend:
      type: disk
      # (for lmdb)
      # type: lmdb

    gt_size: 128
    use_hflip: true
    use_rot: true

    # data loader
    num_worker_per_gpu: 6
    batch_size_per_gpu: 16
    dataset_enlarge_ratio: 100
    prefetch_mode: ~

  val:
    name: Set5
    type: PairedImageDataset
    dataroot_gt: {set5_gt}  # changed
    dataroot_lq: {set5_lq}  # changed
    io_backend:
      type: disk

  val_2:
    name: Set14
    type: PairedImageDataset
    dataroot_gt: {set14_gt}  # changed
    dataroot_lq: {set14_lq}  # changed
    io_backend:
      type: disk

# network structures
network_g:
  type: MSRResNet
  num_in_ch: 3
  num_out_ch: 3
  num_feat: 64
  num_block: 16
  upscale: 4

# path
path:
  pretrain_network_g: ~
  param_key_g: params
  strict_load_g: true
  resume_state: ~

# training settings
train:
  ema_decay: 0.999
  optim_g:
    type: Adam
    lr: !!float 2e-4
    weight_decay: 0
    betas: [0.9, 0.99]

  scheduler:
    type: CosineAnnealingRestartLR
    periods: [250000, 250000, 250000, 250000]
    restart_weights: [1, 1, 1, 1]
    eta_min: !!float 1e-7

  total_iter: 1000000
  warmup_iter: -1  # no warm up

  # losses
  pixel_opt:
    type: L1Loss
    loss_weight: 1.0
    reduction: mean

# validation settings
val:
  val_freq: !!float 5e3
  save_img: false

  metrics:
    psnr: # metric name, can be arbitrary
      type: calculate_psnr
      crop_border: 4
      test_y_channel: false
      better: higher  # the higher, the better. Default: higher
    niqe:
      type: calculate_niqe
      crop_border: 4
      better: lower  # the lower, the better

# logging settings
logger:
  print_freq: 100
  save_checkpoint_freq: !!float 5e3
  use_tb_logger: true
  wandb:
    project: ~
    resume_id: ~

# dist training settings
dist_params:
  backend: nccl
  port: 29500
"""


def _folder(tmp: Path, name: str, src: Path, stems: list[str]) -> Path:
    out = tmp / name
    out.mkdir()
    for stem in stems:
        shutil.copy(src / f"{stem}.png", out / f"{stem}.png")
    return out


@pytest.mark.slow
def test_basicsr_msrresnet_x4_file_with_niqe_trains_and_validates(tmp_path: Path) -> None:
    train_gt = _folder(tmp_path, "train_hr", DATASETS / "Set14" / "HR", ["baboon", "coastguard", "lenna"])
    set5 = _folder(tmp_path, "Set5_HR", DATASETS / "Set5" / "HR", ["baby", "bird", "butterfly", "head", "woman"])
    set14 = _folder(tmp_path, "Set14_HR", DATASETS / "Set14" / "HR", ["monarch", "zebra"])
    paths = {}
    for key, hr in (("train", train_gt), ("set5", set5), ("set14", set14)):
        prepare_lr(hr, tmp_path / f"{hr.name}_LRbicx4", 4, progress=False)
        paths[f"{key}_gt"], paths[f"{key}_lq"] = hr, tmp_path / f"{hr.name}_LRbicx4"
    opt = tmp_path / "train_MSRResNet_x4.yml"
    opt.write_text(BASICSR_MSRRESNET_X4.format(**paths))
    proc = run_cli("train", "-opt", str(opt), "--force_yml", f"path.root={tmp_path}", "train.total_iter=1",
                   "val.val_freq=1", "logger.print_freq=1", "logger.save_checkpoint_freq=1",
                   "datasets.train.batch_size_per_gpu=2", "datasets.train.num_worker_per_gpu=0",
                   "train.precision=fp32", "train.channels_last=false", "val.save_img=true", cwd=tmp_path)
    exp = tmp_path / "experiments" / "001_MSRResNet_x4_f64b16_DIV2K_1000k_B16G1_wandb"
    summary = json.loads((exp / "summary.json").read_text())
    assert summary["finished"] and summary["iterations_done"] == 1
    for dataset in ("Set5", "Set14"):
        v = summary["validation"][dataset]
        assert set(v) == {"psnr", "niqe"} and 5 < v["psnr"]["value"] < 40 and v["niqe"]["value"] > 0
        assert v["niqe"]["best_iter"] == 1
    history = json.loads((exp / "history.json").read_text())
    assert history["val"][0]["better"] == {"psnr": "higher", "niqe": "lower"}
    assert "niqe:" in proc.stdout and (exp / "report.html").is_file()
    # the validation's NIQE is calculate_niqe (BasicSR's numbers: test_metrics_learned) of the 8-bit results
    saved = sorted((exp / "visualization" / "Set5").glob("*_1.png"))
    assert len(saved) == 5
    mean = sum(calculate_niqe(cv2.imread(str(p), cv2.IMREAD_UNCHANGED), 4) for p in saved) / 5
    assert summary["validation"]["Set5"]["niqe"]["value"] == pytest.approx(mean, rel=1e-6)  # float32 sums

"""Options: BasicSR-style YAML loads, defaults are filled, every bad option is named by its key path."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from anysr.archs import build_network
from anysr.errors import AnysrError, OptionError
from anysr.options import load_options, parse_override, plain, validate_options
from anysr.options.docs import render_markdown
from anysr.options.fields import walk
from anysr.options.schema import OPTIONS

REPO = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------- real BasicSR-shaped option files

EDSR_TRAIN = """\
# general settings
name: 201_EDSR_Mx2_f64b16_DIV2K_300k_B16G1
model_type: SRModel
scale: 2
num_gpu: 1  # set num_gpu: 0 for cpu mode
manual_seed: 10

# dataset and data loader settings
datasets:
  train:
    name: DIV2K
    type: PairedImageDataset
    dataroot_gt: datasets/DF2K/DIV2K_train_HR_sub
    dataroot_lq: datasets/DF2K/DIV2K_train_LR_bicubic_X2_sub
    meta_info_file: datasets/meta_info/meta_info_DIV2K800sub_GT.txt
    filename_tmpl: '{}'
    io_backend:
      type: disk

    gt_size: 96
    use_hflip: true
    use_rot: true

    # data loader
    use_shuffle: true
    num_worker_per_gpu: 6
    batch_size_per_gpu: 16
    dataset_enlarge_ratio: 100
    prefetch_mode: ~

  val:
    name: Set5
    type: PairedImageDataset
    dataroot_gt: datasets/Set5/GTmod12
    dataroot_lq: datasets/Set5/LRbicx2
    io_backend:
      type: disk

# network structures
network_g:
  type: EDSR
  num_in_ch: 3
  num_out_ch: 3
  num_feat: 64
  num_block: 16
  upscale: 2
  res_scale: 1
  img_range: 255.
  rgb_mean: [0.4488, 0.4371, 0.4040]

# path
path:
  pretrain_network_g: ~
  strict_load_g: true
  resume_state: ~

# training settings
train:
  ema_decay: 0.999
  optim_g:
    type: Adam
    lr: !!float 1e-4
    weight_decay: 0
    betas: [0.9, 0.99]

  scheduler:
    type: MultiStepLR
    milestones: [200000]
    gamma: 0.5

  total_iter: 300000
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
      crop_border: 2
      test_y_channel: false

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

SRRESNET_TRAIN = """\
name: 001_MSRResNet_x4_f64b16_DIV2K_1000k_B16G1
model_type: SRModel
scale: 4
num_gpu: auto
manual_seed: 0

datasets:
  train:
    name: DIV2K
    type: PairedImageDataset
    dataroot_gt: datasets/DF2K/DIV2K_train_HR_sub
    dataroot_lq: datasets/DF2K/DIV2K_train_LR_bicubic_X4_sub
    filename_tmpl: '{}'
    io_backend:
      type: disk
    gt_size: 128
    use_flip: true          # BasicSR's older name of use_hflip
    use_rot: true
    use_shuffle: true
    num_worker_per_gpu: 6
    batch_size_per_gpu: 16
    dataset_enlarge_ratio: 100
    prefetch_mode: ~
  val:
    name: Set5
    type: PairedImageDataset
    dataroot_gt: datasets/Set5/GTmod12
    dataroot_lq: datasets/Set5/LRbicx4
    io_backend:
      type: disk
  val_2:
    name: Set14
    type: PairedImageDataset
    dataroot_gt: datasets/Set14/GTmod12
    dataroot_lq: datasets/Set14/LRbicx4
    io_backend:
      type: disk

network_g:
  type: MSRResNet
  num_in_ch: 3
  num_out_ch: 3
  num_feat: 64
  num_block: 16
  upscale: 4

path:
  pretrain_network_g: ~
  param_key_g: params
  strict_load_g: true
  resume_state: ~

train:
  ema_decay: 0.999
  optim_g:
    type: Adam
    lr: 2e-4                # PyYAML reads this as the string '2e-4'
    weight_decay: 0
    betas: [0.9, 0.99]
  scheduler:
    type: CosineAnnealingRestartLR
    periods: [250000, 250000, 250000, 250000]
    restart_weights: [1, 1, 1, 1]
    eta_min: !!float 1e-7
  total_iter: 1e6           # the string '1e6'
  warmup_iter: -1
  pixel_opt:
    type: L1Loss
    loss_weight: 1.0
    reduction: mean

val:
  val_freq: !!float 5e3
  save_img: false
  metrics:
    psnr:
      type: calculate_psnr
      crop_border: 4
      test_y_channel: false
      better: higher

logger:
  print_freq: 100
  save_checkpoint_freq: !!float 5e3
  use_tb_logger: true
  wandb:
    project: ~
    resume_id: ~

dist_params:
  backend: nccl
  port: 29500
"""

SWINIR_TRAIN = """\
name: train_SwinIR_SRx2_scratch_P48W8_DIV2K_500k_B4G8
model_type: SRModel
scale: 2
num_gpu: auto
manual_seed: 0

datasets:
  train:
    name: DIV2K
    type: PairedImageDataset
    dataroot_gt: datasets/DF2K/DIV2K_train_HR_sub
    dataroot_lq: datasets/DF2K/DIV2K_train_LR_bicubic_X2_sub
    meta_info_file: datasets/meta_info/meta_info_DIV2K800sub_GT.txt
    filename_tmpl: '{}'
    io_backend:
      type: disk
    gt_size: 96
    use_hflip: true
    use_rot: true
    use_shuffle: true
    num_worker_per_gpu: 6
    batch_size_per_gpu: 4
    dataset_enlarge_ratio: 1
    prefetch_mode: ~
  val:
    name: Set5
    type: PairedImageDataset
    dataroot_gt: datasets/Set5/GTmod12
    dataroot_lq: datasets/Set5/LRbicx2
    io_backend:
      type: disk

network_g:
  type: SwinIR
  upscale: 2
  in_chans: 3
  img_size: 48
  window_size: 8
  img_range: 1.
  depths: [6, 6, 6, 6, 6, 6]
  embed_dim: 180
  num_heads: [6, 6, 6, 6, 6, 6]
  mlp_ratio: 2
  upsampler: 'pixelshuffle'
  resi_connection: '1conv'

path:
  pretrain_network_g: ~
  strict_load_g: true
  resume_state: ~

train:
  ema_decay: 0.999
  precision: bf16
  optim_g:
    type: Adam
    lr: !!float 2e-4
    weight_decay: 0
    betas: [0.9, 0.99]
  scheduler:
    type: MultiStepLR
    milestones: [250000, 400000, 450000, 475000]
    gamma: 0.5
  total_iter: 500000
  warmup_iter: -1
  pixel_opt:
    type: L1Loss
    loss_weight: 1.0
    reduction: mean

val:
  val_freq: !!float 5e3
  save_img: false
  metrics:
    psnr:
      type: calculate_psnr
      crop_border: 2
      test_y_channel: false

logger:
  print_freq: 100
  save_checkpoint_freq: !!float 5e3
  use_tb_logger: true
  wandb:
    project: ~
    resume_id: ~

dist_params:
  backend: nccl
  port: 29500
"""

EDSR_TEST = """\
name: EDSR_Mx2_f64b16_DIV2K_official-3ba7b086
model_type: SRModel
scale: 2
num_gpu: 1  # set num_gpu: 0 for cpu mode
manual_seed: 0

datasets:
  test_1:  # the 1st test dataset
    name: Set5
    type: PairedImageDataset
    dataroot_gt: datasets/Set5/GTmod12
    dataroot_lq: datasets/Set5/LRbicx2
    io_backend:
      type: disk
  test_2:  # the 2nd test dataset
    name: Set14
    type: PairedImageDataset
    dataroot_gt: datasets/Set14/GTmod12
    dataroot_lq: datasets/Set14/LRbicx2
    io_backend:
      type: disk

network_g:
  type: EDSR
  num_in_ch: 3
  num_out_ch: 3
  num_feat: 64
  num_block: 16
  upscale: 2
  res_scale: 1
  img_range: 255.
  rgb_mean: [0.4488, 0.4371, 0.4040]

path:
  pretrain_network_g: experiments/pretrained_models/EDSR/EDSR_Mx2_f64b16_DIV2K_official-3ba7b086.pth
  strict_load_g: true
  param_key_g: params_ema

val:
  save_img: true
  suffix: ~  # add suffix to saved images, if None, use exp name

  metrics:
    psnr: # metric name, can be arbitrary
      type: calculate_psnr
      crop_border: 2
      test_y_channel: false
    ssim:
      type: calculate_ssim
      crop_border: 2
      test_y_channel: false
"""

SWINIR_TEST = """\
name: SwinIR_SRx4_DF2K
model_type: SRModel
scale: 4
num_gpu: 1
manual_seed: 0

datasets:
  test_1:
    name: Set5
    type: PairedImageDataset
    dataroot_gt: datasets/Set5/GTmod12
    dataroot_lq: datasets/Set5/LRbicx4
    io_backend:
      type: disk
  test_2:
    name: own_images
    type: SingleImageDataset
    dataroot_lq: datasets/own_images
    io_backend:
      type: disk

network_g:
  type: SwinIR
  upscale: 4
  in_chans: 3
  img_size: 64
  window_size: 8
  img_range: 1.
  depths: [6, 6, 6, 6, 6, 6]
  embed_dim: 180
  num_heads: [6, 6, 6, 6, 6, 6]
  mlp_ratio: 2
  upsampler: 'pixelshuffle'
  resi_connection: '1conv'

path:
  pretrain_network_g: experiments/pretrained_models/SwinIR/001_classicalSR_DF2K_s64w8_SwinIR-M_x4.pth
  strict_load_g: true
  param_key_g: params

val:
  save_img: true
  tile: 64
  tile_pad: 8
  metrics:
    psnr:
      type: psnr
      test_y_channel: true
"""

FOLDERS = [
    "datasets/DF2K/DIV2K_train_HR_sub", "datasets/DF2K/DIV2K_train_LR_bicubic_X2_sub",
    "datasets/DF2K/DIV2K_train_LR_bicubic_X4_sub", "datasets/Set5/GTmod12", "datasets/Set5/LRbicx2",
    "datasets/Set5/LRbicx4", "datasets/Set14/GTmod12", "datasets/Set14/LRbicx2", "datasets/Set14/LRbicx4",
    "datasets/own_images", "datasets/meta_info",
]
FILES = [
    "datasets/meta_info/meta_info_DIV2K800sub_GT.txt",
    "experiments/pretrained_models/EDSR/EDSR_Mx2_f64b16_DIV2K_official-3ba7b086.pth",
    "experiments/pretrained_models/SwinIR/001_classicalSR_DF2K_s64w8_SwinIR-M_x4.pth",
]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A project root holding the folders and files the example option files point to."""
    for folder in FOLDERS:
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    for file in FILES:
        (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / file).write_bytes(b"x")
    return tmp_path


def write(root: Path, text: str, name: str = "opt.yml") -> Path:
    path = root / name
    path.write_text(text)
    return path


def data(text: str) -> dict[str, Any]:
    return yaml.safe_load(text)


def problems(err: pytest.ExceptionInfo[OptionError]) -> list[str]:
    """The problem lines of a collected OptionError (header dropped)."""
    lines = str(err.value).splitlines()
    return [ln.strip() for ln in lines[1:]] if re.match(r"\d+ problems? in ", lines[0]) else lines


def bad(opt: dict[str, Any], root: Path, *, is_train: bool = True) -> list[str]:
    with pytest.raises(OptionError) as err:
        validate_options(opt, is_train=is_train, root=root)
    return problems(err)


def minimal_train(root: Path) -> dict[str, Any]:
    gt = root / "gt"
    gt.mkdir(exist_ok=True)
    return {
        "name": "tiny", "scale": 2,
        "datasets": {"train": {"type": "PairedImageDataset", "dataroot_gt": str(gt), "lq_from_gt": True,
                               "gt_size": 32, "batch_size_per_gpu": 4}},
        "network_g": {"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "upscale": 2},
        "train": {"total_iter": 10, "optim_g": {"type": "Adam", "lr": 1e-3}, "pixel_opt": {"type": "L1Loss"}},
    }


# ---------------------------------------------------------------- real files

def test_edsr_train_file(root: Path) -> None:
    opt = load_options(write(root, EDSR_TRAIN), is_train=True, root=root)
    assert opt["is_train"] is True and opt["scale"] == 2 and opt["num_gpu"] == 1 and opt["manual_seed"] == 10
    tr = opt["datasets"]["train"]
    assert tr["phase"] == "train" and tr["scale"] == 2 and tr["name"] == "DIV2K"
    assert tr["dataroot_gt"] == str(root / "datasets/DF2K/DIV2K_train_HR_sub")
    assert tr["meta_info_file"] == str(root / "datasets/meta_info/meta_info_DIV2K800sub_GT.txt")
    assert tr["gt_size"] == 96 and tr["num_worker_per_gpu"] == 6 and tr["io_backend"] == {"type": "disk"}
    assert tr["pin_memory"] is False and tr["persistent_workers"] is False and tr["lq_from_gt"] is False
    val = opt["datasets"]["val"]
    assert val["phase"] == "val" and val["name"] == "Set5" and val["batch_size_per_gpu"] is None
    train = opt["train"]
    assert train["optim_g"] == {"type": "Adam", "lr": 1e-4, "weight_decay": 0.0, "betas": [0.9, 0.99]}
    assert train["scheduler"] == {"type": "MultiStepLR", "milestones": [200000], "gamma": 0.5}
    assert train["ema_decay"] == 0.999 and train["precision"] == "auto" and train["accumulate"] == 1
    assert train["channels_last"] == "auto"
    assert train["pixel_opt"] == {"type": "L1Loss", "loss_weight": 1.0, "reduction": "mean"}
    assert opt["val"]["val_freq"] == 5000 and isinstance(opt["val"]["val_freq"], int)
    assert opt["val"]["metrics"]["psnr"] == {"type": "calculate_psnr", "crop_border": 2,
                                             "test_y_channel": False, "better": "higher", "weights": None,
                                             "stats": None}
    assert opt["logger"]["save_checkpoint_freq"] == 5000 and opt["logger"]["keep_last"] == 3
    assert opt["logger"]["wandb"] == {"project": None, "resume_id": None, "entity": None}
    assert opt["dist_params"] == {"backend": "nccl", "port": 29500}
    exp = root / "experiments" / "201_EDSR_Mx2_f64b16_DIV2K_300k_B16G1"
    assert opt["path"]["experiments_root"] == str(exp)
    assert opt["path"]["models"] == str(exp / "models")
    assert opt["path"]["training_states"] == str(exp / "training_states")
    assert opt["path"]["log"] == str(exp / "log")
    assert opt["path"]["visualization"] == str(exp / "visualization")
    assert opt["path"]["root"] == str(root) and opt["path"]["results_root"] is None
    assert opt["network_g"]["type"] == "EDSR" and opt["network_g"]["img_range"] == 255.0
    # a plain dict that YAML can write back (the trainer saves a copy next to the run)
    assert yaml.safe_load(yaml.safe_dump(plain(opt))) == opt


def test_srresnet_numbers_written_as_text(root: Path) -> None:
    opt = load_options(write(root, SRRESNET_TRAIN), is_train=True, root=root)
    assert opt["train"]["optim_g"]["lr"] == 2e-4 and isinstance(opt["train"]["optim_g"]["lr"], float)
    assert opt["train"]["total_iter"] == 1_000_000 and isinstance(opt["train"]["total_iter"], int)
    sched = opt["train"]["scheduler"]
    assert sched["restart_weights"] == [1.0, 1.0, 1.0, 1.0] and sched["eta_min"] == 1e-7
    tr = opt["datasets"]["train"]
    assert tr["use_hflip"] is True and "use_flip" not in tr
    assert [opt["datasets"][k]["phase"] for k in ("val", "val_2")] == ["val", "val"]
    assert opt["num_gpu"] == "auto" and opt["accelerator"] == "auto"


def test_swinir_train_file(root: Path) -> None:
    opt = load_options(write(root, SWINIR_TRAIN), is_train=True, root=root)
    net = opt["network_g"]
    assert net["depths"] == [6] * 6 and net["upsampler"] == "pixelshuffle" and net["img_range"] == 1.0
    assert list(net)[0] == "type"
    assert opt["train"]["precision"] == "bf16"


def test_edsr_test_file(root: Path) -> None:
    opt = load_options(write(root, EDSR_TEST), is_train=False, root=root)
    assert opt["is_train"] is False and opt["train"] is None
    assert [d["phase"] for d in opt["datasets"].values()] == ["test", "test"]
    results = root / "results" / "EDSR_Mx2_f64b16_DIV2K_official-3ba7b086"
    paths = opt["path"]
    assert paths["results_root"] == str(results) and paths["log"] == str(results)
    assert paths["visualization"] == str(results / "visualization")
    assert paths["experiments_root"] is None and paths["models"] is None
    assert paths["param_key_g"] == "params_ema"
    assert paths["pretrain_network_g"] == str(root / FILES[1])
    assert opt["val"]["val_freq"] is None and opt["val"]["save_img"] is True
    assert opt["val"]["metrics"]["ssim"]["type"] == "calculate_ssim"


def test_swinir_test_file_with_tiles_and_single_images(root: Path) -> None:
    opt = load_options(write(root, SWINIR_TEST), is_train=False, root=root)
    assert opt["val"]["tile"] == 64 and opt["val"]["tile_pad"] == 8
    assert opt["val"]["metrics"]["psnr"]["crop_border"] == 4  # default: the scale
    single = opt["datasets"]["test_2"]
    assert single["type"] == "SingleImageDataset" and single["dataroot_gt"] is None


def test_defaults_filled(root: Path) -> None:
    opt = validate_options(minimal_train(root), is_train=True, root=root)
    assert opt["model_type"] == "SRModel" and opt["num_gpu"] == "auto" and opt["accelerator"] == "auto"
    assert opt["manual_seed"] == 0 and opt["launcher"] is None
    assert opt["xla"] == {"spmd": False, "backend": "auto", "matmul_precision": "default"}
    assert opt["find_unused_parameters"] is False and opt["use_static_graph"] is False
    ds = opt["datasets"]["train"]
    assert ds["name"] == "train" and ds["filename_tmpl"] == "{}" and ds["io_backend"] == {"type": "disk"}
    assert ds["num_worker_per_gpu"] == 0 and ds["dataset_enlarge_ratio"] == 1 and ds["use_shuffle"] is True
    assert ds["use_hflip"] is False and ds["use_rot"] is False and ds["color"] is None
    assert ds["mean"] is None and ds["std"] is None and ds["prefetch_mode"] is None
    train = opt["train"]
    assert train["warmup_iter"] == -1 and train["ema_decay"] == 0.0 and train["compile"] is False
    assert train["grad_clip_norm"] is None and train["scheduler"] is None
    assert train["net_d_iters"] == 1 and train["net_d_init_iters"] == 0
    assert train["optim_g"] == {"type": "Adam", "lr": 1e-3}  # unset optimizer keys keep torch's defaults
    assert opt["val"] is None and opt["network_d"] is None
    assert opt["logger"] == {"print_freq": 100, "save_checkpoint_freq": 5000, "use_tb_logger": True,
                             "save_pth": False, "save_format": ["safetensors"], "keep_last": 3,
                             "wandb": {"project": None, "resume_id": None, "entity": None}}
    assert opt["dist_params"] == {"backend": None, "port": None}
    assert opt["path"]["param_key_g"] == "params" and opt["path"]["strict_load_g"] is True


def test_scheduler_and_loss_defaults(root: Path) -> None:
    opt = minimal_train(root)
    opt["train"]["scheduler"] = {"type": "CosineAnnealingRestartLR", "periods": [5, 5]}
    opt["train"]["pixel_opt"] = {"type": "CharbonnierLoss"}
    out = validate_options(opt, is_train=True, root=root)["train"]
    assert out["scheduler"] == {"type": "CosineAnnealingRestartLR", "periods": [5, 5],
                                "restart_weights": [1.0, 1.0], "eta_min": 0.0}
    assert out["pixel_opt"]["eps"] == 1e-12
    opt["train"]["scheduler"] = {"type": "MultiStepLR", "milestones": [5]}
    assert validate_options(opt, is_train=True, root=root)["train"]["scheduler"]["gamma"] == 0.1


def test_cosine_schedule_must_cover_total_iter(root: Path) -> None:
    """Past the last cosine period the lr would silently climb back up (raising total_iter on a finished run)."""
    opt = minimal_train(root)
    opt["train"]["scheduler"] = {"type": "CosineAnnealingRestartLR", "periods": [5, 5]}
    assert validate_options(opt, is_train=True, root=root)["train"]["total_iter"] == 10  # exactly covered
    opt["train"]["total_iter"] = 14
    assert bad(opt, root) == [
        "train.scheduler.periods: the cosine periods end at iteration 10 but train.total_iter is 14: past the last "
        "period the learning rate would climb back up. Extend the periods to cover total_iter (e.g. add a period "
        "of 4 with its restart_weights entry) or lower train.total_iter"]
    opt["train"]["scheduler"] = {"type": "MultiStepLR", "milestones": [5]}
    assert validate_options(opt, is_train=True, root=root)["train"]["total_iter"] == 14


def test_validation_is_idempotent(root: Path) -> None:
    once = load_options(write(root, EDSR_TRAIN), is_train=True, root=root)
    assert validate_options(once, is_train=True, root=root) == once


def test_null_means_default_or_unset(root: Path) -> None:
    opt = minimal_train(root)
    opt["logger"] = None
    opt["datasets"]["train"]["num_worker_per_gpu"] = None
    opt["train"]["optim_g"]["weight_decay"] = None
    out = validate_options(opt, is_train=True, root=root)
    assert out["logger"]["print_freq"] == 100 and out["datasets"]["train"]["num_worker_per_gpu"] == 0
    assert "weight_decay" not in out["train"]["optim_g"]


def test_dist_is_accepted_and_dropped(root: Path) -> None:
    opt = minimal_train(root)
    opt["dist"] = True
    assert "dist" not in validate_options(opt, is_train=True, root=root)


# ---------------------------------------------------------------- paths and roots

def test_relative_paths_use_path_root(root: Path) -> None:
    opt = minimal_train(root)
    opt["datasets"]["train"]["dataroot_gt"] = "gt"
    opt["path"] = {"root": str(root)}
    out = validate_options(opt, is_train=True, root=root / "elsewhere")
    assert out["datasets"]["train"]["dataroot_gt"] == str(root / "gt")
    assert out["path"]["experiments_root"] == str(root / "experiments" / "tiny")


def test_root_defaults_to_cwd(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(root)
    opt = minimal_train(root)
    opt["datasets"]["train"]["dataroot_gt"] = "gt"
    out = validate_options(opt, is_train=True)
    assert out["path"]["root"] == str(root) and out["datasets"]["train"]["dataroot_gt"] == str(root / "gt")


def test_given_output_folders_are_kept(root: Path) -> None:
    opt = minimal_train(root)
    opt["path"] = {"experiments_root": "runs/a", "log": str(root / "logs")}
    paths = validate_options(opt, is_train=True, root=root)["path"]
    assert paths["experiments_root"] == str(root / "runs/a")
    assert paths["models"] == str(root / "runs/a/models")
    assert paths["log"] == str(root / "logs")


def test_missing_paths_are_named(root: Path) -> None:
    opt = data(EDSR_TEST)
    opt["datasets"]["test_1"]["dataroot_lq"] = "datasets/Set5/LRbicx3"
    opt["path"]["pretrain_network_g"] = "experiments/nope.pth"
    opt["datasets"]["test_2"]["meta_info_file"] = "datasets/meta_info"  # a folder, not a file
    lines = bad(opt, root, is_train=False)
    assert len(lines) == 3
    assert lines[0].startswith("datasets.test_1.dataroot_lq: 'datasets/Set5/LRbicx3' (resolved to ")
    assert "does not exist" in lines[0] and str(root / "datasets/Set5/LRbicx3") in lines[0]
    assert lines[1].startswith("datasets.test_2.meta_info_file:")
    assert "is a folder, expected a file" in lines[1]
    assert lines[2].startswith("path.pretrain_network_g: 'experiments/nope.pth'")
    assert "does not exist" in lines[2]


def test_resume_state_must_exist(root: Path) -> None:
    opt = minimal_train(root)
    opt["path"] = {"resume_state": str(root / "100.state")}
    assert bad(opt, root) == [f"path.resume_state: '{root / '100.state'}' does not exist; fix the path "
                              "(relative paths start at path.root) or create it"]


def test_lmdb_backend_wants_a_folder(root: Path) -> None:
    opt = minimal_train(root)
    (root / "gt.lmdb").write_bytes(b"")
    opt["datasets"]["train"].update(dataroot_gt=str(root / "gt.lmdb"), io_backend={"type": "lmdb"})
    assert bad(opt, root) == [f"datasets.train.dataroot_gt: '{root / 'gt.lmdb'}' is a file; point it to the "
                              ".lmdb folder (io_backend.type is lmdb)"]


# ---------------------------------------------------------------- errors name the key path

def test_unknown_key_suggests_nearest(root: Path) -> None:
    opt = minimal_train(root)
    opt["datasets"]["train"]["gt_szie"] = 96
    opt["train"]["optim_g"]["betass"] = [0.9, 0.99]
    assert bad(opt, root) == [
        "datasets.train.gt_szie: unknown key in datasets.train (did you mean 'gt_size'?)",
        "train.optim_g.betass: unknown argument of Adam (did you mean 'betas'?); valid arguments: lr, betas, "
        "eps, weight_decay, amsgrad, foreach, maximize, capturable, differentiable, fused, decoupled_weight_decay",
    ]


def test_unknown_top_level_section(root: Path) -> None:
    opt = minimal_train(root)
    opt["trian"] = {}
    opt["frobnicate"] = 1
    lines = bad(opt, root)
    assert lines[0] == "trian: unknown top-level key (did you mean 'train'?)"
    assert lines[1].startswith("frobnicate: unknown top-level key; valid keys: name, model_type, scale,")


def test_wrong_types(root: Path) -> None:
    opt = minimal_train(root)
    opt["train"]["total_iter"] = "lots"
    opt["datasets"]["train"]["use_rot"] = "yes please"
    opt["train"]["optim_g"]["betas"] = [0.9]
    opt["train"]["optim_g"]["lr"] = "fast"
    opt["network_g"] = "EDSR"
    assert bad(opt, root) == [
        "datasets.train.use_rot: expected bool, got 'yes please' (str)",
        "network_g: expected mapping, got 'EDSR' (str)",
        "train.total_iter: expected int >= 1 (a float like 5e3 is accepted), got 'lots' (str)",
        "train.optim_g.lr: expected float >= 0, got 'fast' (str)",
        "train.optim_g.betas: expected at least 2 items, got 1",
    ]


def test_numeric_strings_must_parse_exactly(root: Path) -> None:
    opt = minimal_train(root)
    opt["train"]["total_iter"] = "5e-1"
    opt["logger"] = {"print_freq": 2.5, "save_checkpoint_freq": "5e3"}
    opt["train"]["ema_decay"] = "nan"
    lines = bad(opt, root)
    assert lines == [
        "train.total_iter: expected int >= 1 (a float like 5e3 is accepted), got '5e-1' (str)",
        "train.ema_decay: expected float in [0, 1), got 'nan' (str)",
        "logger.print_freq: expected int >= 1 (a float like 5e3 is accepted), got 2.5 (float)",
    ]


def test_out_of_range_and_choices(root: Path) -> None:
    opt = minimal_train(root)
    opt.update(scale=9, num_gpu="all", accelerator="gpu", manual_seed=-1)
    opt["train"]["ema_decay"] = 1.0
    opt["train"]["precision"] = "fp8"
    opt["network_g"]["upscale"] = 9
    lines = bad(opt, root)
    assert lines == [
        "scale: must be in [1, 8], got 9 (int)",
        "num_gpu: must be 'auto' or an int >= 0, got 'all' (str)",
        "accelerator: expected 'auto' | 'cpu' | 'cuda' | 'mps' | 'xla', got 'gpu' (str) "
        "(NVIDIA GPUs are accelerator: cuda (Apple: mps))",
        "manual_seed: must be from 0 to 2**63 - 1, got -1 (int)",
        "train.ema_decay: must be in [0, 1), got 1.0 (float)",
        "train.precision: expected 'auto' | 'fp32' | 'bf16' | 'fp16', got 'fp8' (str)",
    ]


def test_missing_required(root: Path) -> None:
    opt = minimal_train(root)
    del opt["name"], opt["network_g"], opt["train"]["optim_g"]["lr"], opt["datasets"]["train"]["type"]
    assert bad(opt, root) == [
        "name: required (str (no '/')) but missing",
        "datasets.train.type: required (str) but missing",
        "network_g: required (mapping) but missing",
        "train.optim_g.lr: required (float >= 0) but missing",
    ]


def test_train_section_required_when_training(root: Path) -> None:
    opt = minimal_train(root)
    del opt["train"], opt["datasets"]["train"]
    assert bad(opt, root) == [
        "datasets: no train dataset; add datasets.train (type, dataroot_gt, ..., batch_size_per_gpu) "
        "to train",
        "train: required when training (at least total_iter, optim_g and a loss such as pixel_opt)",
    ]
    assert validate_options(opt, is_train=False, root=root)["train"] is None


def test_rank_and_world_size_refused(root: Path) -> None:
    opt = minimal_train(root)
    opt.update(rank=0, world_size=2)
    assert bad(opt, root) == ["rank: is set by the launcher, remove it",
                              "world_size: is set by the launcher, remove it"]


def test_bad_name(root: Path) -> None:
    opt = minimal_train(root)
    opt["name"] = "../escape"
    assert bad(opt, root) == ["name: must be a non-empty name without '/' of at most 200 bytes (it names the "
                              "output folder), got '../escape' (str)"]


def test_gt_size_not_multiple_of_scale(root: Path) -> None:
    opt = minimal_train(root)
    opt["scale"] = 3
    opt["network_g"]["upscale"] = 3
    opt["datasets"]["train"]["gt_size"] = 100
    assert bad(opt, root) == ["datasets.train.gt_size: 100 is not a multiple of scale (3); use e.g. 99"]


def test_scale_mismatch_with_network_upscale(root: Path) -> None:
    opt = data(EDSR_TRAIN)
    opt["network_g"]["upscale"] = 4
    with pytest.raises(OptionError) as err:
        load_options(write(root, yaml.safe_dump(plain(opt))), is_train=True, root=root)
    assert problems(err) == ["network_g.upscale: 4 differs from the top-level scale (2); "
                             "set network_g.upscale and scale to the same factor"]


def test_rrdbnet_scale_mismatch(root: Path) -> None:
    opt = minimal_train(root)
    opt["network_g"] = {"type": "RRDBNet", "num_in_ch": 3, "num_out_ch": 3, "scale": 4}
    assert bad(opt, root) == ["network_g.scale: 4 differs from the top-level scale (2); set network_g.scale "
                              "and scale to the same factor"]


def test_dataset_rules(root: Path) -> None:
    opt = minimal_train(root)
    ds = opt["datasets"]["train"]
    ds.update(lq_from_gt=False, gt_size=None, batch_size_per_gpu=None, mean=[0.5] * 3, std=[0.5, 0.0, 0.5])
    opt["datasets"]["train_2"] = dict(ds, lq_from_gt=True, dataroot_lq=str(root))
    opt["datasets"]["trian_3"] = dict(ds)
    opt["datasets"]["val"] = {"type": "SingleImageDataset", "phase": "train", "scale": 4}
    lines = bad(opt, root)
    assert lines == [
        "datasets.train.dataroot_lq: PairedImageDataset needs dataroot_lq (a folder of LQ images) or "
        "lq_from_gt: true (LQ made from GT by MATLAB bicubic)",
        "datasets.train.gt_size: required for a train PairedImageDataset (the GT patch size, a multiple of "
        "scale, e.g. 96 or 128)",
        "datasets.train.batch_size_per_gpu: required for a train dataset (images per device per step)",
        "datasets.train.std: every value must be > 0, got [0.5, 0.0, 0.5]",
        "datasets.train_2.dataroot_lq: set together with lq_from_gt: true; keep one (lq_from_gt makes the LQ "
        "images from the GT images; --force_yml datasets.train_2.dataroot_lq=~ removes the key)",
        "datasets.train_2.gt_size: required for a train PairedImageDataset (the GT patch size, a multiple of "
        "scale, e.g. 96 or 128)",
        "datasets.train_2.batch_size_per_gpu: required for a train dataset (images per device per step)",
        "datasets.train_2.std: every value must be > 0, got [0.5, 0.0, 0.5]",
        "datasets.trian_3: a dataset name must start with train, val or test (that is its phase), got "
        "'trian_3' (did you mean 'train'?)",
        "datasets.val.phase: is set by the loader from the dataset name ('val' -> 'val'); remove it, got "
        "'train' (str)",
        "datasets.val.scale: 4 differs from the top-level scale (2); remove it (the loader copies scale into "
        "every dataset)",
        "datasets.val.dataroot_lq: required by SingleImageDataset (the folder of input images)",
        "datasets: 2 train datasets (train, train_2); training reads exactly one, keep one",
    ]


def test_use_flip_alias_conflict(root: Path) -> None:
    opt = minimal_train(root)
    opt["datasets"]["train"].update(use_flip=True, use_hflip=False)
    assert bad(opt, root) == ["datasets.train.use_flip: is another name for 'use_hflip', which is also "
                              "set to a different value (False); keep only 'use_hflip'"]


def test_train_rules(root: Path) -> None:
    opt = minimal_train(root)
    opt["train"]["optim_g"] = {"type": "Adam", "lr": 1e-4, "momentum": 0.9}
    opt["train"]["scheduler"] = {"type": "MultiStepLR", "periods": [10]}
    opt["train"]["pixel_opt"] = {"type": "L1Loss", "eps": 1e-6}
    lines = bad(opt, root)
    assert lines == [
        "train.optim_g.momentum: unknown argument of Adam; valid arguments: lr, betas, eps, weight_decay, "
        "amsgrad, foreach, maximize, capturable, differentiable, fused, decoupled_weight_decay",
        "train.scheduler.periods: unknown argument of MultiStepLR; valid arguments: milestones, gamma, restarts, "
        "restart_weights",
        "train.scheduler.milestones: required argument of MultiStepLR is missing; add it (valid arguments: "
        "milestones, gamma, restarts, restart_weights)",
        "train.pixel_opt.eps: unknown argument of L1Loss; valid arguments: loss_weight, reduction",
    ]
    opt = minimal_train(root)
    opt["train"]["optim_g"] = {"type": "SGD", "lr": 0.1, "nesterov": True}
    opt["train"]["scheduler"] = {"type": "CosineAnnealingRestartLR", "periods": [5, 5],
                                 "restart_weights": [1]}
    opt["train"]["pixel_opt"] = None
    assert bad(opt, root) == [
        "train.optim_g.nesterov: needs momentum > 0; set momentum (e.g. 0.9) or nesterov: false",
        "train.scheduler.restart_weights: has 1 values but periods has 2; give one weight per period",
        "train: no loss is set; add one of train.pixel_opt (e.g. {type: L1Loss}), train.perceptual_opt, "
        "train.gan_opt, or a train.losses list (e.g. [{type: L1Loss}])",
    ]


def test_perceptual_and_gan_keys_accepted(root: Path) -> None:
    opt = minimal_train(root)
    opt["train"].update(pixel_opt=None,
                        perceptual_opt={"type": "PerceptualLoss", "layer_weights": {"conv5_4": 1}},
                        gan_opt={"type": "GANLoss", "gan_type": "vanilla"},
                        optim_d={"type": "Adam", "lr": 1e-4}, net_d_iters=1, net_d_init_iters=0)
    opt["network_d"] = {"type": "VGGStyleDiscriminator", "num_in_ch": 3, "num_feat": 64}
    out = validate_options(opt, is_train=True, root=root)
    assert out["train"]["perceptual_opt"]["layer_weights"] == {"conv5_4": 1}
    assert out["network_d"]["num_feat"] == 64
    opt["train"]["perceptual_opt"] = {"layer_weights": {}}
    assert bad(opt, root) == ["train.perceptual_opt.type: required (str) but missing"]


def test_val_rules(root: Path) -> None:
    opt = minimal_train(root)
    opt["val"] = {"save_img": True, "metrics": {"psnr": {"type": "calculate_pnsr", "crop_border": -1},
                                                "lpips": "yes"}}
    assert bad(opt, root) == [
        "val.metrics.psnr.crop_border: must be >= 0, got -1 (int)",
        "val.metrics.psnr.type: unknown metric 'calculate_pnsr' (did you mean 'calculate_psnr'?); known: "
        "calculate_dists, calculate_fid, calculate_lpips, calculate_niqe, calculate_psnr, calculate_psnr_pt, "
        "calculate_raw_dists, calculate_ssim, calculate_ssim_pt, calculate_topiq, dists, fid, lpips, niqe, psnr, "
        "raw_dists, ssim, topiq",
        "val.metrics.lpips: expected a mapping, got 'yes' (str)",
        "val.val_freq: required when training with a val section (validate every N iterations, e.g. 5000); "
        "or remove the val section",
    ]


def test_all_problems_in_one_error(root: Path) -> None:
    opt = data(EDSR_TRAIN)
    opt["scale"] = 5
    opt["datasets"]["train"]["gt_szie"] = 96
    opt["train"]["total_iter"] = "forever"
    opt["logger"]["print_freq"] = 0
    with pytest.raises(OptionError) as err:
        validate_options(opt, is_train=True, root=root, source="my.yml")
    text = str(err.value)
    assert text.startswith("5 problems in my.yml:\n")
    assert isinstance(err.value, AnysrError)
    assert [ln.split(":")[0].strip() for ln in text.splitlines()[1:]] == [
        "datasets.train.gt_szie", "datasets.train.gt_size", "network_g.upscale", "train.total_iter",
        "logger.print_freq"]


def test_not_a_mapping(root: Path) -> None:
    with pytest.raises(OptionError, match="the options must be a mapping"):
        validate_options([1, 2], is_train=True, root=root)  # type: ignore[arg-type]


# ---------------------------------------------------------------- registries and arch signatures

def test_registry_checks(root: Path) -> None:
    """Allowed names come from the registries (adding a class is adding a name), with a "did you mean"."""
    opt = minimal_train(root)
    opt["model_type"] = "SRModle"
    opt["datasets"]["train"]["type"] = "PairedImageDatset"
    opt["network_g"] = {"type": "MSRResNett"}
    opt["train"]["optim_g"]["type"] = "Adamm"
    opt["train"]["pixel_opt"]["type"] = "GANLoss"  # registered, but not a pixel loss
    opt["val"] = {"val_freq": 5, "metrics": {"ssim": {"type": "calculate_ssimm"}}}
    lines = bad(opt, root)
    assert lines[0].startswith("datasets.train.type: unknown dataset type 'PairedImageDatset' (did you mean "
                               "'PairedImageDataset'?); known: ")
    assert lines[1].startswith("network_g.type: unknown arch 'MSRResNett' (did you mean 'MSRResNet'?); known: ")
    assert lines[2].startswith("train.optim_g.type: unknown optimizer 'Adamm' (did you mean 'Adam'?); known: ASGD")
    assert lines[3].startswith("train.pixel_opt.type: unknown pixel loss 'GANLoss' (did you mean 'NCCLoss'?); "
                               "known: ArtifactWeightedLoss, AverageLoss, BicubicLoss, ")
    assert lines[4].startswith("val.metrics.ssim.type: unknown metric 'calculate_ssimm' (did you mean "
                               "'calculate_ssim'?)")
    assert lines[5].startswith("model_type: unknown model_type 'SRModle' (did you mean 'SRModel'?)")


def test_arch_signature_checks(root: Path) -> None:
    """Constructor arguments are checked by the one rule build_network uses too (registry.argument_problems)."""
    opt = minimal_train(root)
    opt["network_g"] = {"type": "EDSR", "num_in_ch": 3, "num_feats": 32, "upscale": 2}
    lines = bad(opt, root)
    assert lines[0].startswith("network_g.num_feats: unknown argument of EDSR (did you mean 'num_feat'?); "
                               "valid arguments: num_in_ch, num_out_ch, num_feat")
    assert lines[1].startswith("network_g.num_out_ch: required argument of EDSR is missing")
    with pytest.raises(OptionError, match=r"network_g\.num_feats: unknown argument of EDSR"):
        build_network({"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "num_feats": 32})
    # upscale left out: the arch default (4) is used, and it differs from scale 2
    opt["network_g"] = {"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3}
    assert bad(opt, root) == ["network_g.upscale: not set, so EDSR uses its default 4, which differs from "
                              "scale (2); set network_g.upscale: 2"]
    # a float argument written as text is converted like a typed option
    opt["network_g"] = {"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "upscale": 2, "img_range": "1e0"}
    assert validate_options(opt, is_train=True, root=root)["network_g"]["img_range"] == 1.0


def test_real_registries(root: Path) -> None:
    """The BasicSR example files are accepted and a misspelled kwarg is caught."""
    for text in (EDSR_TRAIN, SRRESNET_TRAIN, SWINIR_TRAIN):
        load_options(write(root, text), is_train=True, root=root)
    for text in (EDSR_TEST, SWINIR_TEST):
        load_options(write(root, text), is_train=False, root=root)
    with pytest.raises(OptionError, match=r"network_g\.num_feats: unknown argument of EDSR "
                                          r"\(did you mean 'num_feat'\?\)"):
        load_options(write(root, EDSR_TRAIN), ["network_g.num_feats=32"], is_train=True, root=root)


# ---------------------------------------------------------------- YAML files

def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match=r"options file '.*nope\.yml' does not exist; check the path"):
        load_options(tmp_path / "nope.yml", is_train=True)
    with pytest.raises(OptionError, match="is a folder"):
        load_options(tmp_path, is_train=True)


def test_yaml_syntax_error_has_line(tmp_path: Path) -> None:
    path = write(tmp_path, "name: a\nscale: 2\ndatasets:\n  train: [1, 2\nnetwork_g: {type: EDSR}\n")
    with pytest.raises(OptionError) as err:
        load_options(path, is_train=True)
    assert re.match(r"options file '.*opt\.yml': YAML syntax error at line 5, column \d+: ", str(err.value))


def test_yaml_duplicate_key(tmp_path: Path) -> None:
    path = write(tmp_path, "name: a\nscale: 2\ntrain:\n  total_iter: 5\n  total_iter: 6\n")
    with pytest.raises(OptionError, match=r"YAML syntax error at line 5, column 3: key 'total_iter' is "
                                          r"written twice \(first at line 4\); keep one"):
        load_options(path, is_train=True)


def test_empty_and_non_mapping_files(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="is empty; it needs at least name, scale and network_g"):
        load_options(write(tmp_path, "# nothing\n"), is_train=True)
    with pytest.raises(OptionError, match="the top level must be a mapping .*got list"):
        load_options(write(tmp_path, "- a\n- b\n"), is_train=True)


def test_yaml_merge_keys_still_work(root: Path) -> None:
    text = EDSR_TEST.replace("  test_1:  # the 1st test dataset", "  test_1: &set5").replace(
        "  test_2:  # the 2nd test dataset\n    name: Set14", "  test_2:\n    <<: *set5\n    name: Set14")
    opt = load_options(write(root, text), is_train=False, root=root)
    assert opt["datasets"]["test_2"]["name"] == "Set14"


# ---------------------------------------------------------------- overrides

def test_parse_override_types() -> None:
    assert parse_override("a.b=3") == (["a", "b"], 3)
    assert parse_override("a.b=true") == (["a", "b"], True)
    assert parse_override("a.b=[1,2]") == (["a", "b"], [1, 2])
    assert parse_override("a.b=null") == (["a", "b"], None)
    assert parse_override("a.b=5e3") == (["a", "b"], "5e3")  # typed by the schema later
    assert parse_override("name=x=y") == (["name"], "x=y")
    assert parse_override("a.b={type: L1Loss}") == (["a", "b"], {"type": "L1Loss"})
    assert parse_override("a=__import__('os')") == (["a"], "__import__('os')")  # text, never evaluated


@pytest.mark.parametrize(("text", "message"), [
    ("train.total_iter", "override 'train.total_iter': no '='; expected key.path=value"),
    ("=3", "override '=3': bad key path '' (empty or blank part)"),
    ("train..total_iter=3", "override 'train..total_iter=3': bad key path 'train..total_iter'"),
    ("a.b=[1, 2", "override 'a.b=[1, 2': the value '[1, 2' is not valid YAML"),
])
def test_bad_override_syntax(text: str, message: str) -> None:
    with pytest.raises(OptionError, match=re.escape(message)):
        parse_override(text)


def test_overrides_applied_and_typed(root: Path) -> None:
    opt = load_options(write(root, EDSR_TRAIN), [
        "datasets.train.gt_size=128", "network_g.num_feat=32", "val=null", "train.optim_g.betas=[0.9,0.999]",
        "logger.use_tb_logger=false", "train.scheduler.milestones.0=1000", "train.total_iter=5e3",
        "xla.spmd=true", "train.grad_clip_norm=0.5",
    ], is_train=True, root=root)
    assert opt["datasets"]["train"]["gt_size"] == 128 and opt["network_g"]["num_feat"] == 32
    assert opt["val"] is None and opt["train"]["optim_g"]["betas"] == [0.9, 0.999]
    assert opt["logger"]["use_tb_logger"] is False and opt["train"]["scheduler"]["milestones"] == [1000]
    assert opt["train"]["total_iter"] == 5000 and opt["xla"]["spmd"] is True
    assert opt["train"]["grad_clip_norm"] == 0.5


def test_override_creates_missing_sections(root: Path) -> None:
    text = EDSR_TEST.split("\nval:")[0]
    opt = load_options(write(root, text), ["val.save_img=true", "val.metrics.psnr.type=psnr"], is_train=False,
                       root=root)
    assert opt["val"]["save_img"] is True and opt["val"]["metrics"]["psnr"]["crop_border"] == 2


def test_override_errors_are_collected(root: Path) -> None:
    path = write(root, EDSR_TRAIN)
    with pytest.raises(OptionError) as err:
        load_options(path, ["network_g.type.x=1", "oops", "train.scheduler.milestones.5=1"], is_train=True,
                     root=root)
    lines = str(err.value).splitlines()
    assert lines[0] == "3 bad overrides:"
    assert lines[1].strip() == ("override 'network_g.type.x=1': network_g.type is 'EDSR' (str), not a "
                                "mapping, so network_g.type.x cannot be set; override network_g.type itself")
    assert lines[2].strip().startswith("override 'oops': no '='")
    assert lines[3].strip() == ("override 'train.scheduler.milestones.5=1': train.scheduler.milestones is a "
                                "list of 1 items; '5' is not an index in it")


def test_override_unknown_key_is_a_validation_error(root: Path) -> None:
    with pytest.raises(OptionError) as err:
        load_options(write(root, EDSR_TRAIN), ["train.totl_iter=10"], is_train=True, root=root)
    assert "(with overrides train.totl_iter=10)" in str(err.value).splitlines()[0]
    assert problems(err) == ["train.totl_iter: unknown key in train (did you mean 'total_iter'?)"]


# ---------------------------------------------------------------- docs

def test_docs_match_schema() -> None:
    text = (REPO / "docs" / "options.md").read_text()
    assert text == render_markdown(), "stale: run anysr schema --markdown -o docs/options.md"


def test_docs_mention_every_key() -> None:
    text = (REPO / "docs" / "options.md").read_text()
    missing = [path for path, _ in walk(OPTIONS) if f"`{path}`" not in text]
    assert not missing
    for alias in ("use_flip", "rank", "world_size"):
        assert alias in text


# ---------------------------------------------------------------- options on top: they read the registries

_NOT_IMPORTED = ("torch", "numpy", "anysr.data", "anysr.models", "anysr.archs", "anysr.losses", "anysr.metrics",
                 "anysr.engine", "anysr.plugins")
_BY_HAND = """
import sys
from anysr.registry import ARCH_REGISTRY, DATASET_REGISTRY, LOSS_REGISTRY, MODEL_REGISTRY, OPTIMIZER_REGISTRY
from anysr.options import validate_options

class Net:
    def __init__(self, upscale: int = 2) -> None: ...

class Paired:
    role = "paired"
    backend_types = ("disk", "lmdb")

class Adam:
    def __init__(self, params: object, lr: float = 1e-3) -> None: ...

class L1Loss:
    role = "pixel"

    def __init__(self, loss_weight: float = 1.0, reduction: str = "mean") -> None: ...

ARCH_REGISTRY.register(Net, name="Net")
MODEL_REGISTRY.register(type("SRModel", (), {"fsam_steps": True}))
DATASET_REGISTRY.register(Paired, name="PairedImageDataset")
OPTIMIZER_REGISTRY.register(Adam, name="Adam")
LOSS_REGISTRY.register(L1Loss, name="L1Loss")
is_train = sys.argv[2] == "train"
data_set = {"type": "PairedImageDataset", "dataroot_gt": ".", "lq_from_gt": True}
if is_train:  # a training file: its dataset, optimiser, loss and train.sam (FSAM) checked too
    data_set |= {"gt_size": 8, "batch_size_per_gpu": 2}
    extra = {"train": {"total_iter": 2, "sam": "fsam", "optim_g": {"type": "Adam", "lr": 1e-4},
                       "pixel_opt": {"type": "L1Loss"}}}
else:
    extra = {}
opt = validate_options({"name": "x", "scale": 2, "network_g": {"type": "Net"},
                        "datasets": {sys.argv[2]: data_set}, **extra}, is_train=is_train, root=sys.argv[1])
assert opt.datasets[sys.argv[2]].io_backend.type == "disk" and opt.network_g.type == "Net"
assert not is_train or opt.train.sam == "fsam"
loaded = sorted(m for m in sys.modules if any(m == n or m.startswith(n + ".") for n in sys.argv[3:]))
assert not loaded, loaded
"""


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)


@pytest.mark.parametrize("phase", ["test", "train"])
def test_options_import_no_torch_and_no_plugin_package(tmp_path: Path, phase: str) -> None:
    """Importing the options and validating a file (registries filled by hand), a test file or a training one,
    loads no torch, numpy, dataset, model, network, loss or metric module: the options only read what the
    registries hold."""
    done = _python(_BY_HAND, str(tmp_path), phase, *_NOT_IMPORTED)
    assert done.returncode == 0, done.stderr


def test_an_empty_registry_names_what_to_import() -> None:
    done = _python("from anysr.options import validate_options\n"
                   "validate_options({'name': 'x', 'scale': 2, 'network_g': {'type': 'EDSR'}}, is_train=False)")
    assert done.returncode != 0
    assert "the arch registry is empty" in done.stderr and "anysr.plugins.load_plugins()" in done.stderr

"""traiNNer-redux's video templates (TemporalSPAN, TemporalSPANv2, TSCUNet, TFDAT): ``pairedvideodataset`` with
``clip_size`` on anysr's video dataset code (``anysr.data.paired_video_dataset``), the options' mapping (clip_size ->
num_frame, the video models), OTF with a clip network refused in one line, and a training run through the command
line on a tiny folder of frames (validation scored per scene)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch
from arch_checks import check_two_ranks_match_one
from conftest import run_cli, saved_weights, write_options

from anysr.data.loaders import build_dataset
from anysr.errors import DataError, OptionError
from anysr.options import validate_options

SCENES = {"alpha": 6, "beta": 4}  # frames per scene (beta: one 3-frame window short of 5)


def _frames(root: Path, scale: int = 2, side: int = 24, skip_gt: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """Scenes of moving gradients: ``lr/<scene>_<i>.png`` (side x side) and ``hr/`` (x scale), traiNNer-redux's
    flat layout; GT files named in ``skip_gt`` are left out."""
    lq, gt = root / "lr", root / "hr"
    lq.mkdir(parents=True, exist_ok=True)
    gt.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    big = side * scale
    for scene, n in SCENES.items():
        base = rng.random((big + 2 * n, big + 2 * n, 3))
        base = cv2.GaussianBlur(base, (0, 0), 3)
        for i in range(n):
            img = (np.clip(base[i:i + big, 2 * i:2 * i + big] * 2 - 0.5, 0, 1) * 255).astype(np.uint8)
            name = f"{scene}_{i:04d}.png"
            if name not in skip_gt:
                cv2.imwrite(str(gt / name), img)
            cv2.imwrite(str(lq / name), cv2.resize(img, (side, side), interpolation=cv2.INTER_AREA))
    return lq, gt


def _dataset(opt: dict[str, Any], phase: str = "train") -> Any:
    """The dataset as the loader builds it from validated options (the defaults of the keys it reads)."""
    full = {"name": phase, "type": "PairedVideoDataset", "phase": phase, "scale": 2, "io_backend": {"type": "disk"},
            "lq_from_gt": False, "degradation": "BI", "use_hflip": False, "use_rot": False, "gt_size": None,
            "random_reverse": False, "interval_list": [1], "cache_data": False, "video_compression": None, **opt}
    return build_dataset(full, f"datasets.{phase}")


# ---------------------------------------------------------------- the dataset

def test_scenes_windows_and_sparse_gt(tmp_path: Path) -> None:
    lq, gt = _frames(tmp_path, skip_gt=("alpha_0002.png",))
    ds = _dataset({"dataroot_lq": str(lq), "dataroot_gt": str(gt), "num_frame": 3, "gt_size": 16}, "train")
    # alpha: 6 frames -> windows centred on 1..4, minus the one without GT (2); beta: centred on 1, 2
    assert [w[1] for _, w in ds.folders[0].windows] == ["alpha_0001", "alpha_0003", "alpha_0004", "beta_0001",
                                                        "beta_0002"]
    item = ds[(0, 5)]
    assert item["lq"].shape == (3, 3, 8, 8) and item["gt"].shape == (3, 16, 16)
    assert item["key"] == "alpha_0001"
    again = ds[(0, 5)]
    assert torch.equal(item["lq"], again["lq"]) and torch.equal(item["gt"], again["gt"])  # (index, seed) only


def test_training_crop_and_flips_are_the_same_for_every_frame(tmp_path: Path) -> None:
    lq, gt = _frames(tmp_path)
    for p in lq.glob("beta_*.png"):  # every beta LQ frame the same image: the crops must be equal too
        cv2.imwrite(str(p), cv2.imread(str(lq / "beta_0000.png")))
    ds = _dataset({"dataroot_lq": str(lq), "dataroot_gt": str(gt), "num_frame": 3, "gt_size": 16,
                   "use_hflip": True, "use_rot": True}, "train")
    beta = next(i for i, (_, w) in enumerate(ds.folders[0].windows) if w[0].startswith("beta"))
    for seed in range(4):
        clip = ds[(beta, seed)]["lq"]
        assert torch.equal(clip[0], clip[1]) and torch.equal(clip[1], clip[2])


def test_folder_lists_and_validation_items_per_scene(tmp_path: Path) -> None:
    lq1, gt1 = _frames(tmp_path / "a")
    lq2, gt2 = _frames(tmp_path / "b")
    ds = _dataset({"dataroot_lq": [str(lq1), str(lq2)], "dataroot_gt": [str(gt1), str(gt2)], "num_frame": 5},
                  "test")
    # 5-frame windows: alpha has 2 (centres 2, 3), beta (4 frames) none; two folders
    assert ds.video_kind == "test_window" and len(ds) == 4
    assert ds.clip_names == ["0:alpha", "1:alpha"] and ds.clip_lengths == [2, 2]
    item = ds[3]
    assert item["lq"].shape == (5, 3, 24, 24) and item["gt"].shape == (3, 48, 48)
    assert (item["clip"], item["frames"], item["folder"]) == (1, [1], "1:alpha")
    assert ds.frame_name(1, 1) == "alpha_0003"


def test_no_window_is_one_line(tmp_path: Path) -> None:
    lq, gt = _frames(tmp_path)
    with pytest.raises(DataError, match=r"no 7-frame window with a GT middle frame"):
        _dataset({"dataroot_lq": str(lq), "dataroot_gt": str(gt), "num_frame": 7}, "test")


# ---------------------------------------------------------------- the options (traiNNer-redux's dialect)

def _template(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    """A traiNNer-redux video template, small: TemporalSPAN x2 on pairedvideodataset (clip_size 3)."""
    lq, gt = _frames(tmp_path)
    opt: dict[str, Any] = {
        "name": "tspan", "scale": 2, "use_amp": False, "amp_bf16": False, "use_channels_last": False,
        "use_compile": False, "num_gpu": "auto", "accelerator": "cpu", "manual_seed": 3,
        "datasets": {
            "train": {"name": "Train Dataset", "type": "pairedvideodataset", "dataroot_gt": [str(gt)],
                      "dataroot_lq": [str(lq)], "clip_size": 3, "lq_size": 8, "use_hflip": True, "use_rot": True,
                      "num_worker_per_gpu": 0, "batch_size_per_gpu": 2, "accum_iter": 1},
            "val": {"name": "Val Dataset", "type": "pairedvideodataset", "dataroot_gt": [str(gt), str(gt)],
                    "dataroot_lq": [str(lq), str(lq)], "clip_size": 3},
        },
        "network_g": {"type": "temporalspan", "num_frames": 3, "feature_channels": 8, "history_channels": 4},
        "path": {"param_key_g": None, "strict_load_g": True, "resume_state": None},
        "train": {"ema_decay": 0.999, "ema_power": 0.75, "grad_clip": False,
                  "optim_g": {"type": "AdamW", "lr": 2e-4, "weight_decay": 0, "betas": [0.9, 0.99]},
                  "scheduler": {"type": "MultiStepLR", "milestones": [1000], "gamma": 0.5},
                  "total_iter": 4, "warmup_iter": -1, "losses": [{"type": "charbonnierloss", "loss_weight": 1.0}]},
        "val": {"val_enabled": True, "val_freq": 4, "save_img": False, "tile_size": 0, "tile_overlap": 8,
                "metrics_enabled": True, "metrics": {"psnr": {"type": "calculate_psnr", "crop_border": 2}}},
        "logger": {"print_freq": 2, "save_checkpoint_freq": 4, "save_checkpoint_format": "safetensors",
                   "use_tb_logger": False},
    }
    for key, value in changes.items():
        section, _, sub = key.partition("__")
        if sub:
            opt[section][sub] = value
        else:
            opt[key] = value
    return opt


def test_clip_size_and_the_video_models(tmp_path: Path) -> None:
    opt = validate_options(_template(tmp_path), is_train=True, root=tmp_path)
    assert opt["datasets"]["train"]["num_frame"] == 3 and "clip_size" not in opt["datasets"]["train"]
    assert opt["datasets"]["val"]["num_frame"] == 3
    assert opt["model_type"] == "VideoBaseModel"
    assert any("clip_size -> num_frame 3" in n for n in opt["mapped_keys"])
    gan = _template(tmp_path, network_d={"type": "dunet"})
    gan["train"]["losses"].append({"type": "ganloss", "gan_type": "vanilla", "loss_weight": 0.1})
    gan["train"]["optim_d"] = {"type": "AdamW", "lr": 1e-4}
    assert validate_options(gan, is_train=True, root=tmp_path)["model_type"] == "VideoGANModel"


def test_otf_with_a_clip_network_and_disagreeing_frames_are_one_line(tmp_path: Path) -> None:
    opt = _template(tmp_path, high_order_degradation=True)
    with pytest.raises(OptionError, match=r"high_order_degradation: on-the-fly degradation makes single LQ images, "
                                          r"but TemporalSPAN takes clips"):
        validate_options(opt, is_train=True, root=tmp_path)
    opt = _template(tmp_path)
    opt["datasets"]["train"]["num_frame"] = 5
    with pytest.raises(OptionError, match=r"clip_size: means num_frame: 3, but num_frame is also set to 5"):
        validate_options(opt, is_train=True, root=tmp_path)


# ---------------------------------------------------------------- a training run through the command line

TFDAT_TINY = {"type": "tfdat", "embed_dim": 8, "num_groups": 1, "depth_per_group": 1, "num_heads": 2,
              "window_size": 4, "aim_reduction_ratio": 4, "flow_base_ch": 4, "mid_dim": 8}


@pytest.mark.parametrize("gan", [False, True], ids=["TemporalSPAN-fidelity", "TFDAT-gan"])
def test_template_trains_and_validates_through_the_cli(gan: bool, tmp_path: Path) -> None:
    opt = _template(tmp_path)
    if gan:  # the GAN template's shape: dunet, vanilla GAN loss, MS-SSIM, a loss_weight 0 entry
        opt["network_g"] = dict(TFDAT_TINY)
        opt["network_d"] = {"type": "dunet", "num_feat": 8}
        opt["train"]["losses"] += [{"type": "ganloss", "gan_type": "vanilla", "loss_weight": 0.1},
                                   {"type": "mssimloss", "loss_weight": 0.5}, {"type": "ldlloss", "loss_weight": 0}]
        opt["train"]["optim_d"] = {"type": "AdamW", "lr": 1e-4}
    path = write_options(tmp_path / "tspan.yml", opt)
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    log = proc.stdout + proc.stderr
    model = "VideoGANModel" if gan else "VideoBaseModel"
    assert f"pairedvideodataset -> model_type {model}" in log, log
    assert ("l_g_gan" in log) == gan
    exp = tmp_path / "experiments" / "tspan"
    weights = saved_weights(exp, 4)
    assert weights and all(torch.isfinite(v).all() for v in weights.values() if v.is_floating_point())
    # validation: per scene (two folder pairs, 4 + 2 scored middle frames each), then over scenes
    assert "Val Dataset 1:beta" in log and "validation Val Dataset (12 images) at iter 4: psnr" in log, log


# ---------------------------------------------------------------- 2 gloo ranks = 1 process

TSPAN_TINY = {"type": "temporalspan", "num_frames": 3, "feature_channels": 8, "history_channels": 4}


@pytest.mark.slow
@pytest.mark.parametrize(("net", "atol"), [(TSPAN_TINY, 3e-4), ({**TFDAT_TINY, "drop_path_rate": 0.0}, 1e-5)],
                         ids=["TemporalSPAN", "TFDAT"])
def test_two_gloo_ranks_train_the_temporal_networks_as_one_process(net: dict[str, Any], atol: float,
                                                                    tmp_path: Path) -> None:
    """traiNNer-redux's video template (pairedvideodataset clips): 2 ranks x 2 clips == 1 process x 4 clips, the
    same weights (both groups) and the same validation PSNR. SGD: at initialisation some of these networks' conv
    biases get gradients of float-noise size, which Adam would scale up to full steps of either sign. TemporalSPAN
    at 8 channels: GroupNorm(8) normalises single channels of small, mostly padded frames, and its 1 / std scales
    the kernels' rounding (other summation orders at batch 2 and 4) up to ~3e-4 of the weights after 4 steps; a
    rank without the gradient all-reduce would be off by the steps themselves. (TSCUNet: its smallest network,
    dim 64, takes 90 s here; tests/archs/test_temporal.py trains it.)"""
    opt = _template(tmp_path, network_g=dict(net))
    opt["train"]["optim_g"] = {"type": "SGD", "lr": 1e-2}
    opt["datasets"]["val"]["name"] = "val"  # the name the check reads the PSNR under
    check_two_ranks_match_one(tmp_path, opt, atol=atol)

"""neosr's TOML option files: the dialect's mapping onto anysr's keys (``anysr.options.neosr``), its refusals, every
template neosr ships validating as it is, and a TOML file trained and tested through the CLI."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli

from anysr.errors import OptionError
from anysr.options import load_options
from anysr.options.neosr import NEOSR_NOTE, map_neosr

# A neosr training file as its templates write one (paired data, a GAN, its losses and its optimizer)
PAIRED: dict[str, Any] = {
    "name": "neo", "model_type": "image", "scale": 4, "use_amp": True, "bfloat16": True, "fast_matmul": True,
    "datasets": {
        "train": {"type": "paired", "dataroot_gt": "gt", "dataroot_lq": "lq", "patch_size": 32, "batch_size": 8,
                  "accumulate": 2, "augmentation": ["none", "mixup", "cutmix", "resizemix", "cutblur"],
                  "aug_prob": [0.5, 0.1, 0.1, 0.1, 0.5]},
        "val": {"name": "val", "type": "paired", "dataroot_gt": "vgt", "dataroot_lq": "vlq"},
    },
    "val": {"val_freq": 1000, "tile": -1,
            "metrics": {"psnr": {"type": "calculate_psnr"}, "ssim": {"type": "calculate_ssim", "crop_border": 2},
                        "dists": {"type": "calculate_dists", "better": "lower"},
                        "topiq": {"type": "calculate_topiq", "weights": "topiq.pth"}}},
    "path": {"print_network": False},
    "network_g": {"type": "span"},
    "network_d": {"type": "metagan"},
    "train": {"ema": 0.999, "wavelet_guided": True, "wavelet_init": 80000,
              "optim_g": {"type": "adan_sf", "lr": 1e-3, "betas": [0.98, 0.92, 0.99], "weight_decay": 0.01,
                          "schedule_free": True, "warmup_steps": 1600},
              "optim_d": {"type": "adan_sf", "lr": 1e-4, "betas": [0.98, 0.92, 0.99], "weight_decay": 0.01,
                          "schedule_free": True, "warmup_steps": 600},
              "pixel_opt": {"type": "L1Loss", "loss_weight": 1.0},
              "mssim_opt": {"type": "mssim_loss", "loss_weight": 1.0},
              "perceptual_opt": {"type": "vgg_perceptual_loss", "loss_weight": 0.5, "criterion": "huber"},
              "gan_opt": {"type": "gan_loss", "gan_type": "bce", "loss_weight": 0.3}},
    "logger": {"total_iter": 1000, "save_checkpoint_freq": 100, "use_tb_logger": True, "save_tb_img": True},
}

# neosr's OTF file: the same, with its Real-ESRGAN-style synthesis settings in [degradations]
OTF_DEGRADATIONS: dict[str, Any] = {
    "resize_prob": [0.3, 0.4, 0.3], "resize_range": [0.5, 1.5], "gaussian_noise_prob": 0.2, "noise_range": [0, 2],
    "poisson_scale_range": [0.05, 0.25], "gray_noise_prob": 0.1, "jpeg_range": [40, 95], "second_blur_prob": 0.4,
    "blur_kernel_size": 7, "kernel_list": ["iso", "aniso"], "kernel_prob": [0.5, 0.5], "sinc_prob": 0.1,
    "blur_sigma": [0.2, 3], "betag_range": [0.5, 4], "betap_range": [1, 2], "final_sinc_prob": 0.8,
}


def _paired() -> dict[str, Any]:
    return copy.deepcopy(PAIRED)


def _otf(batch: int = 8, queue: int | None = None) -> dict[str, Any]:
    opt = _paired()
    opt["model_type"] = "otf"
    opt["datasets"]["train"] = {"type": "otf", "dataroot_gt": "gt", "patch_size": 32, "batch_size": batch}
    if queue is not None:
        opt["datasets"]["train"]["queue_size"] = queue
    opt["degradations"] = dict(OTF_DEGRADATIONS)
    return opt


def test_paired_gan_file_maps_onto_anysr_keys() -> None:
    opt, notes = map_neosr(_paired())
    assert opt["model_type"] == "SRGANModel"
    train, data = opt["train"], opt["datasets"]["train"]
    assert data["type"] == "PairedImageDataset" and opt["datasets"]["val"]["type"] == "PairedImageDataset"
    assert data["gt_size"] == 128 and data["batch_size_per_gpu"] == 8  # neosr's patch_size is the LQ patch
    assert data["use_hflip"] is True and data["use_rot"] is True  # neosr's defaults
    assert not {"patch_size", "batch_size", "augmentation", "aug_prob", "accumulate"} & set(data)
    assert train["accumulate"] == 2 and train["precision"] == "auto" and train["ema_decay"] == 0.999
    assert train["ema_warmup"] is False  # neosr's EMA: copy once, then the plain decay
    assert train["use_moa"] is True and train["moa_augs"] == ["none", "mixup", "cutmix", "resizemix", "cutblur"]
    assert train["moa_probs"] == [0.5, 0.1, 0.1, 0.1, 0.5]
    assert train["grad_clip_norm"] == 1.0 and train["grad_clip_norm_d"] == 1.0  # neosr clips both unless told not
    assert train["clamp"] is True  # neosr's default
    assert train["total_iter"] == 1000 and "total_iter" not in opt["logger"]
    assert train["losses"] == [
        {"type": "L1Loss", "loss_weight": 1.0, "name": "pix"},
        {"type": "mssim_loss", "loss_weight": 1.0, "name": "mssim"},
        {"type": "vgg_perceptual_loss", "loss_weight": 0.5, "criterion": "huber", "name": "percep", "scale": 4},
        {"type": "gan_loss", "gan_type": "bce", "loss_weight": 0.3, "name": "gan"}]
    assert not [k for k in train if k.endswith("_opt") and k not in ("optim_g", "optim_d")]
    assert train["optim_g"]["type"] == "adan_sf" and train["wavelet_guided"] is True  # passed on as they are
    assert "tile" not in opt["val"] and "print_network" not in opt["path"]
    # neosr crops 4 pixels for PSNR / SSIM whatever the scale, none for its DISTS (no ImageNet normalisation: anysr's
    # raw_dists) and TOPIQ; anysr sets `better` from the metric
    assert opt["val"]["metrics"] == {
        "psnr": {"type": "calculate_psnr", "crop_border": 4}, "ssim": {"type": "calculate_ssim", "crop_border": 2},
        "dists": {"type": "raw_dists", "crop_border": 0},
        "topiq": {"type": "calculate_topiq", "weights": "topiq.pth", "crop_border": 0}}
    assert opt["val"]["save_img"] is True
    assert not {"use_amp", "bfloat16", "fast_matmul"} & set(opt)
    assert notes[0] == NEOSR_NOTE
    assert "model_type image -> SRGANModel" in notes
    assert any(n.startswith("ignored") and "fast_matmul" in n and "logger.save_tb_img" in n for n in notes)


def test_model_without_a_gan_loss_drops_the_discriminator() -> None:
    opt = _paired()
    del opt["train"]["gan_opt"]
    opt, notes = map_neosr(opt)
    assert opt["model_type"] == "SRModel" and opt["network_d"] is None
    assert "network_d without train.gan_opt -> unused (as neosr)" in notes
    opt = _paired()
    opt["train"]["gan_opt"]["loss_weight"] = 0
    assert map_neosr(opt)[0]["model_type"] == "SRModel"


def test_otf_file_splits_the_degradations_between_dataset_and_model() -> None:
    opt, _ = map_neosr(_otf(batch=8, queue=100))
    data = opt["datasets"]["train"]
    assert opt["model_type"] == "RealESRGANModel" and data["type"] == "RealESRGANDataset"
    for key in ("blur_kernel_size", "kernel_list", "kernel_prob", "sinc_prob", "blur_sigma", "final_sinc_prob"):
        assert data[key] == OTF_DEGRADATIONS[key] and key not in opt
    for key in ("resize_prob", "noise_range", "jpeg_range", "second_blur_prob", "gray_noise_prob"):
        assert opt[key] == OTF_DEGRADATIONS[key] and key not in data
    assert "degradations" not in opt
    assert data["crop_pad_size"] == 512  # neosr's fixed crop
    assert opt["queue_size"] == 96  # rounded down to whole batches, as neosr does
    assert opt["gt_usm"] is False and opt["l1_gt_usm"] is False and opt["percep_gt_usm"] is False
    plain = _otf()
    del plain["train"]["gan_opt"]
    assert map_neosr(plain)[0]["model_type"] == "RealESRNetModel"
    assert map_neosr(_otf())[0]["queue_size"] == 176  # neosr's default 180, in whole batches of 8


def test_scheduler_unet_and_grad_clip_names() -> None:
    opt = _paired()
    opt["train"]["scheduler"] = {"type": "cosineannealing", "T_max": 1000, "eta_min": 1e-6}
    opt["train"]["grad_clip"] = False
    opt["network_d"] = {"type": "unet"}
    opt["train"]["ema"] = -1
    opt["train"]["optim_g"] = {"type": "Adan", "lr": 1e-3}
    opt, notes = map_neosr(opt)
    assert opt["train"]["optim_g"]["type"] == "NeosrAdan" and opt["train"]["optim_d"]["type"] == "adan_sf"
    assert opt["train"]["scheduler"]["type"] == "CosineAnnealingLR"
    assert not {"grad_clip_norm", "grad_clip_norm_d", "grad_clip"} & set(opt["train"])
    assert opt["network_d"]["type"] == "UNetDiscriminatorSN"
    assert "ema_decay" not in opt["train"] and "train.ema <= 0 -> no EMA" in notes


@pytest.mark.parametrize(("change", "message"), [
    (lambda o: o["datasets"]["train"].pop("aug_prob"), "augmentation needs aug_prob"),
    (lambda o: o["datasets"]["train"].update(patch_size=0), "patch_size must be a whole number of LQ pixels"),
    (lambda o: o["datasets"]["train"].update(augmentation="mixup"), "augmentation must be a list of names"),
    (lambda o: o["train"].update(ema="yes"), "train.ema must be a number"),
    (lambda o: o["train"].update(grad_clip="sometimes"), "train.grad_clip must be true or false"),
    (lambda o: o["train"].update(losses=[{"type": "L1Loss"}]), "train.losses is set together with neosr's"),
    (lambda o: o["train"].update(total_iter=5), "logger.total_iter means total_iter = 1000, but total_iter is "
                                                "also set to 5"),
    (lambda o: o["train"].update(mssim_opt="mssim_loss"), "train.mssim_opt must be a table with a type"),
    (lambda o: o["train"].update(eco="on"), "train.eco must be true or false"),
])
def test_what_cannot_be_mapped_is_refused_in_one_line_each(change: Any, message: str) -> None:
    opt = _paired()
    change(opt)
    with pytest.raises(OptionError, match="problem") as err:
        map_neosr(opt)
    assert message in str(err.value)


def test_toml_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('name = "x"\nscale = 4\n[train]\nema = 0.9\nema = 0.99\n')
    with pytest.raises(OptionError, match=r"bad.toml': TOML syntax error: .*line 5") as err:
        load_options(path, is_train=True, check_paths=False)
    assert "\n" not in str(err.value)
    with pytest.raises(OptionError, match="does not exist"):
        load_options(tmp_path / "missing.toml", is_train=True)


# neosr's own templates (not part of this repository: their text is neosr's). Point NEOSR_OPTIONS at a checkout's
# options/ folder; without it the test is skipped.
NEOSR_OPTIONS = Path(os.environ.get("NEOSR_OPTIONS", "") or "/nonexistent")
TEMPLATES = sorted(NEOSR_OPTIONS.glob("*.toml")) if NEOSR_OPTIONS.is_dir() else []
# Files refused on purpose: neosr cannot read them either (its TOML reader refuses a key given twice; no network of
# that name in its registry)
REFUSED_TEMPLATES = {
    "train_dctlsa.toml": "TOML syntax error",
    "test_scnet.toml": "unknown arch 'scnet'",
}


@pytest.mark.skipif(not TEMPLATES, reason=f"neosr's templates are not at {NEOSR_OPTIONS} (set NEOSR_OPTIONS)")
@pytest.mark.parametrize("path", TEMPLATES, ids=[p.name for p in TEMPLATES] if TEMPLATES else None)
def test_neosr_template_validates(path: Path) -> None:
    is_train = path.name.startswith("train")
    refused = REFUSED_TEMPLATES.get(path.name)
    if refused is None:
        opt = load_options(str(path), is_train=is_train, check_paths=False)
        assert opt["mapped_keys_from"] == "neosr" and NEOSR_NOTE not in opt["mapped_keys"]
        return
    with pytest.raises(OptionError, match=refused):
        load_options(str(path), is_train=is_train, check_paths=False)


def _toml_list(values: list[Any]) -> str:
    return "[ " + ", ".join(f'"{v}"' if isinstance(v, str) else repr(v) for v in values) + " ]"


def test_toml_file_trains_and_tests_through_the_cli(tmp_path: Path, small_train_dir: Path,
                                                   small_val_dir: Path) -> None:
    """A neosr-style file (its names: image model, paired data with an LQ patch size, batch augmentations, EMA,
    loss tables, logger.total_iter) trains through ``anysr train -opt FILE.toml``, and its test file runs the
    weights through ``anysr test``."""
    train = tmp_path / "train_compact.toml"
    train.write_text(f"""
name = "neo_cli"
model_type = "image"
scale = 2
use_amp = false
manual_seed = 3
accelerator = "cpu"

[datasets.train]
type = "paired"
dataroot_gt = '{small_train_dir}'
lq_from_gt = true
patch_size = 16
batch_size = 2
augmentation = {_toml_list(["none", "mixup", "cutblur"])}
aug_prob = {_toml_list([0.5, 0.25, 0.25])}

[datasets.val]
name = "val"
type = "paired"
dataroot_gt = '{small_val_dir}'
lq_from_gt = true

[val]
val_freq = 2
[val.metrics.psnr]
type = "calculate_psnr"

[path]
root = '{tmp_path}'

[network_g]
type = "compact"
num_feat = 8
num_conv = 2

[train]
ema = 0.99
[train.optim_g]
type = "adamw"
lr = 1e-3
betas = [ 0.9, 0.99 ]
[train.pixel_opt]
type = "L1Loss"
loss_weight = 1.0

[logger]
total_iter = 4
save_checkpoint_freq = 2
use_tb_logger = false
""")
    proc = run_cli("train", "-opt", str(train), cwd=tmp_path)
    log = proc.stdout + proc.stderr
    assert "neosr keys mapped: " in log and "model_type image -> SRModel" in log
    weights = sorted((tmp_path / "experiments" / "neo_cli" / "models").glob("net_g_4.*"))
    assert weights, log
    test = tmp_path / "test_compact.toml"
    test.write_text(f"""
name = "neo_test"
model_type = "image"
scale = 2
accelerator = "cpu"

[datasets.test_1]
name = "val_1"
type = "single"
dataroot_lq = '{small_val_dir}'

[path]
root = '{tmp_path}'
pretrain_network_g = '{weights[0]}'

[network_g]
type = "compact"
num_feat = 8
num_conv = 2
""")
    run_cli("test", "-opt", str(test), cwd=tmp_path)
    outputs = sorted((tmp_path / "results" / "neo_test").rglob("*.png"))
    assert len(outputs) == 3, outputs


def test_metrics_of_a_neosr_file_validate(tmp_path: Path) -> None:
    """neosr's four validation metrics, as its templates write them (commented out there), pass anysr's checks."""
    path = tmp_path / "metrics.toml"
    path.write_text("""
name = "m"
model_type = "image"
scale = 2
[datasets.val]
name = "val"
type = "paired"
dataroot_gt = 'gt'
dataroot_lq = 'lq'
[val.metrics.psnr]
type = "calculate_psnr"
[val.metrics.ssim]
type = "calculate_ssim"
[val.metrics.dists]
type = "calculate_dists"
better = "lower"
[val.metrics.topiq]
type = "calculate_topiq"
weights = 'cfanet_fr_kadid_res50-2c4cc61d.pth'
[network_g]
type = "compact"
""")
    opt = load_options(str(path), is_train=False, check_paths=False)
    metrics = opt["val"]["metrics"]
    assert [metrics[k]["type"] for k in ("psnr", "ssim", "dists", "topiq")] == \
        ["calculate_psnr", "calculate_ssim", "raw_dists", "calculate_topiq"]
    assert metrics["psnr"]["crop_border"] == 4 and metrics["dists"]["better"] == "lower"


def test_eco_clamp_and_discriminator_clipping() -> None:
    """neosr's `eco` is anysr's eco_enabled (train.eco is traiNNer-redux's table); any schedule but sigmoid is linear;
    a model without a discriminator clips only the generator; a clamp the file sets is kept."""
    opt = _paired()
    del opt["train"]["gan_opt"]
    opt["train"].update(eco=True, eco_init=10, eco_iters=100, eco_schedule="lin", clamp=False)
    opt, notes = map_neosr(opt)
    train = opt["train"]
    assert train["eco_enabled"] is True and "eco" not in train and train["eco_schedule"] == "linear"
    assert train["eco_init"] == 10 and train["eco_iters"] == 100 and train["clamp"] is False
    assert train["grad_clip_norm"] == 1.0 and "grad_clip_norm_d" not in train
    assert "train.eco_schedule lin -> linear (as neosr reads it)" in notes


def test_ema_without_warmup_is_torchs_averaged_model() -> None:
    """train.ema_warmup false (a neosr file's train.ema): the first update copies, then the plain decay, as torch's
    AveragedModel with get_ema_multi_avg_fn computes it."""
    import torch
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    from anysr.models.ema import EMA

    torch.manual_seed(0)
    net = torch.nn.Linear(4, 3)
    ours = EMA(net, 0.9, warmup=False)
    ref = AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    for _ in range(4):
        with torch.no_grad():
            for p in net.parameters():
                p.add_(torch.randn_like(p))
        ours.update(net)
        ref.update_parameters(net)
        for a, b in zip(ours.module.parameters(), ref.module.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="no power"):
        EMA(net, 0.9, warmup=False, power=0.75)


def test_sam_passes_through_and_validates(tmp_path: Path) -> None:
    """neosr's `sam = "fsam"` / `sam_init` are anysr's keys of the same names (tests/test_neosr_sam.py trains it)."""
    opt = _paired()
    opt["train"].update(sam="fsam", sam_init=1000)
    opt, _ = map_neosr(opt)
    assert opt["train"]["sam"] == "fsam" and opt["train"]["sam_init"] == 1000

"""The shipped option files: BasicSR's standard settings load and train with only dataset paths changed."""

from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import pytest
from conftest import DATASETS, ROOT, run_cli
from safetensors.torch import save_file
from test_gan import fake_vgg19_state_dict

from anysr.options import load_options, read_yaml

TRAIN_FILES = sorted((ROOT / "options" / "train").glob("train_*.yml"))


LARGEST_GT_SIZE = 256  # of the shipped files (a test below checks it)


@pytest.fixture(scope="module")
def train_gt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Set14 images large enough for every shipped gt_size (training checks every image before it starts)."""
    out = tmp_path_factory.mktemp("train_gt")
    for p in sorted((DATASETS / "Set14" / "HR").glob("*.png")):
        if min(cv2.imread(str(p)).shape[:2]) >= LARGEST_GT_SIZE + 8:
            shutil.copy(p, out / p.name)
    assert len(list(out.iterdir())) >= 8
    return out


def _paths(tmp: Path, train_gt: Path) -> list[str]:
    """Overrides that point a DIV2K file at bundled data."""
    return [f"path.root={ROOT}", f"path.experiments_root={tmp / 'experiments' / 'run'}",
            f"datasets.train.dataroot_gt={train_gt}",
            "datasets.train.dataroot_lq=null", "datasets.train.lq_from_gt=true",
            "datasets.train.meta_info_file=null"]


@pytest.fixture(scope="module")
def vgg19_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random weights shaped like torchvision's vgg19 features (for files with a perceptual loss)."""
    path = tmp_path_factory.mktemp("vgg") / "vgg19.safetensors"
    save_file({k: v for k, v in fake_vgg19_state_dict().items() if k.startswith("features.")}, str(path))
    return path


def _vgg(path: Path, vgg19_file: Path) -> list[str]:
    """The override pointing a file's perceptual loss at ``vgg19_file`` (none without a perceptual loss)."""
    return [f"train.perceptual_opt.vgg_weights_path={vgg19_file}"] if "vgg_weights_path" in path.read_text() else []


@pytest.fixture(scope="module")
def tiny_val(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 108x204 crop of a real image: sides divisible by 2, 3 and 4, large enough for NIQE's two 96x96 blocks
    after a 4-pixel border (the MSRResNet file validates NIQE), small enough that validating a full-size network
    stays short."""
    out = tmp_path_factory.mktemp("val")
    img = cv2.imread(str(DATASETS / "Set5" / "HR" / "butterfly.png"), cv2.IMREAD_UNCHANGED)
    cv2.imwrite(str(out / "butterfly.png"), img[74:182, 26:230])
    return out


@pytest.fixture(scope="module")
def small_val(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 48x48 crop (sides divisible by 2, 3 and 4; window networks pad it) for the files without NIQE: validating
    a full-size transformer on it takes a tenth of the time ``tiny_val`` takes."""
    out = tmp_path_factory.mktemp("val_small")
    img = cv2.imread(str(DATASETS / "Set5" / "HR" / "butterfly.png"), cv2.IMREAD_UNCHANGED)
    cv2.imwrite(str(out / "butterfly.png"), img[104:152, 104:152])
    return out


@pytest.mark.parametrize("path", TRAIN_FILES, ids=lambda p: p.stem)
def test_train_file_validates(path: Path, tmp_path: Path, vgg19_file: Path, train_gt: Path) -> None:
    opt = load_options(path, [*_paths(tmp_path, train_gt), *_vgg(path, vgg19_file)], is_train=True)
    assert opt["network_g"]["type"] and opt["train"]["total_iter"] >= 100000


@pytest.mark.parametrize("path", sorted((ROOT / "options" / "test").glob("*.yml")), ids=lambda p: p.stem)
def test_test_files_validate(path: Path) -> None:
    weights = read_yaml(path).get("path", {}).get("pretrain_network_g")
    # The quick start's weights exist once `make demo` has run; until then every other key is still checked.
    check = not weights or (ROOT / weights).exists()
    opt = load_options(path, is_train=False, root=ROOT, check_paths=check)
    assert any(k.startswith("test") for k in opt["datasets"])


@pytest.mark.slow
@pytest.mark.parametrize("path", TRAIN_FILES, ids=lambda p: p.stem)
def test_basicsr_settings_train_unchanged(path: Path, tmp_path: Path, tiny_val: Path, small_val: Path,
                                         vgg19_file: Path, train_gt: Path) -> None:
    """One real iteration of each full-size network with its own settings (its losses, optimizers, schedule and
    synthesis; batch 1 and a crop of 32 LQ pixels to keep CI short), then its validation (on one small image; the
    NIQE file's needs two 96x96 blocks)."""
    raw = read_yaml(path)
    gt_size = int(raw["datasets"]["train"]["gt_size"])
    assert 0 < gt_size <= LARGEST_GT_SIZE
    crop = min(gt_size, 32 * max(int(raw.get("scale", 1)), 2))  # every window and discriminator of these files fits
    val = tiny_val if "niqe" in path.read_text().lower() else small_val
    over = [*_paths(tmp_path, train_gt), *_vgg(path, vgg19_file), "train.total_iter=1",
            "datasets.train.batch_size_per_gpu=1", f"datasets.train.gt_size={crop}",
            *([f"gt_size={crop}"] if "gt_size" in raw else []),
            "datasets.train.num_worker_per_gpu=0", "datasets.train.dataset_enlarge_ratio=1",
            f"datasets.val.dataroot_gt={val}", f"datasets.val_2.dataroot_gt={val}",
            "accelerator=cpu", "num_gpu=1", "train.precision=fp32", "train.channels_last=false",
            "logger.use_tb_logger=false"]
    run_cli("train", "-opt", str(path), "--force_yml", *over, cwd=tmp_path, timeout=900)
    exp = next((tmp_path / "experiments").iterdir())
    assert (exp / "models" / "net_g_1.safetensors").is_file()
    assert (exp / "training_states" / "1.state").is_file()


def test_basicsr_vocabulary_older_and_newer(tmp_path: Path) -> None:
    """Keys real BasicSR files use: old path names, use_flip, SwinIRModel, 5e3 as a string, num_gpu auto."""
    text = f"""
name: bsr_vocab
model_type: SwinIRModel
scale: 2
num_gpu: auto
manual_seed: 0
datasets:
  train:
    name: T91
    type: PairedImageDataset
    dataroot_gt: {DATASETS / 'T91' / 'HR'}
    lq_from_gt: true
    filename_tmpl: '{{}}'
    io_backend: {{type: disk}}
    gt_size: 48
    use_flip: true
    use_rot: true
    use_shuffle: true
    num_worker_per_gpu: 6
    batch_size_per_gpu: 4
    dataset_enlarge_ratio: 1
    prefetch_mode: ~
network_g: {{type: SwinIR, upscale: 2, in_chans: 3, img_size: 24, window_size: 8, img_range: 1.,
            depths: [2], embed_dim: 12, num_heads: [2], mlp_ratio: 2, upsampler: pixelshuffle,
            resi_connection: 1conv}}
path: {{pretrain_model_g: ~, strict_load: true, resume_state: ~}}
train:
  optim_g: {{type: Adam, lr: !!float 2e-4, weight_decay: 0, betas: [0.9, 0.99]}}
  scheduler: {{type: MultiStepLR, milestones: [250000], gamma: 0.5}}
  total_iter: 500000
  warmup_iter: -1
  pixel_opt: {{type: L1Loss, loss_weight: 1.0, reduction: mean}}
logger: {{print_freq: 100, save_checkpoint_freq: 5e3, use_tb_logger: true, wandb: {{project: ~, resume_id: ~}}}}
dist_params: {{backend: nccl, port: 29500}}
"""
    path = tmp_path / "bsr.yml"
    path.write_text(text)
    opt = load_options(path, [f"path.root={tmp_path}"], is_train=True)
    assert opt["model_type"] == "SwinIRModel"
    assert opt["path"]["strict_load_g"] is True and opt["path"]["pretrain_network_g"] is None
    assert opt["datasets"]["train"]["use_hflip"] is True
    assert opt["logger"]["save_checkpoint_freq"] == 5000

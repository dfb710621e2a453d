"""GFPGANModel: GFPGAN's training (TencentARC/GFPGAN) with its own option files, as released.

``train_gfpgan_v1.yml`` (every loss: pixel, image pyramid, perceptual + style, GAN with R1, the three facial
component discriminators with their style loss, identity) and ``train_gfpgan_v1_simple.yml`` (tests/fixtures/
gfpgan_options) validate and train through the command line on CPU with only sizes shrunk by overrides (64-pixel
faces, narrow networks); the weight files they name (the StyleGAN2 decoder, ArcFace, the landmarks) are stand-ins
the test writes where the files say. A run stopped and resumed ends with the same weights as one straight through;
the pieces (Gram matrices, the identity input, the RoIAligned components) are checked against their definitions.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import DATASETS, ROOT, run_cli, tiny_train_options, write_options
from safetensors.torch import load_file
from test_gan import fake_vgg19_state_dict

from anysr.archs import build_network
from anysr.errors import OptionError
from anysr.losses.perceptual import gram_matrix
from anysr.models.gfpgan import gray_for_identity
from anysr.options import load_options

OPTION_FILES = ROOT / "tests" / "fixtures" / "gfpgan_options"
FULL = OPTION_FILES / "train_gfpgan_v1.yml"
SIMPLE = OPTION_FILES / "train_gfpgan_v1_simple.yml"
NAMES = {FULL: "train_GFPGANv1_512", SIMPLE: "train_GFPGANv1_512_simple"}  # the files' experiment names
SIZE = 64
NET_G = {"out_size": SIZE, "num_style_feat": 32, "narrow": 0.125, "num_mlp": 2}
# the released files with 64-pixel faces and narrow networks (everything else as released)
SMALL = [*(f"network_g.{k}={v}" for k, v in NET_G.items()), f"network_d.out_size={SIZE}", "network_d.narrow=0.125",
         f"datasets.train.out_size={SIZE}", "datasets.train.num_worker_per_gpu=0",
         "datasets.train.batch_size_per_gpu=2", "accelerator=cpu", "num_gpu=1", "logger.use_tb_logger=false",
         "train.precision=fp32", "train.channels_last=false"]
LANDMARKS = {"left_eye": [20.5, 24.25, 4.5], "right_eye": [42.75, 25.5, 4.0], "mouth": [31.0, 47.5, 7.25]}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder laid out as GFPGAN's files expect: six 64x64 faces (real images), a validation pair folder, and
    stand-ins of the three weight files (a StyleGAN2 decoder with ``params_ema``, ArcFace's bare state dict, the
    landmarks table)."""
    out = tmp_path_factory.mktemp("gfpgan")
    ffhq = out / "datasets" / "ffhq" / "ffhq_512"
    val_in, val_ref = out / "datasets" / "faces" / "validation" / "input", out / "datasets" / "faces" / \
        "validation" / "reference"
    for d in (ffhq, val_in, val_ref):
        d.mkdir(parents=True)
    for i, p in enumerate(sorted((DATASETS / "Set14" / "HR").glob("*.png"))[:6]):
        img = cv2.imread(str(p))
        s = min(img.shape[:2])
        face = cv2.resize(img[:s, :s], (SIZE, SIZE), interpolation=cv2.INTER_AREA)
        cv2.imwrite(str(ffhq / f"{i:08d}.png"), face)
        if i < 2:
            cv2.imwrite(str(val_ref / f"{i:08d}.png"), face)
            cv2.imwrite(str(val_in / f"{i:08d}.png"), cv2.GaussianBlur(face, (5, 5), 1.5))
    models = out / "experiments" / "pretrained_models"
    models.mkdir(parents=True)
    torch.manual_seed(0)
    decoder = build_network({"type": "StyleGAN2Generator", "out_size": SIZE, "num_style_feat": 32, "num_mlp": 2,
                             "channel_multiplier": 1, "narrow": 0.125})
    torch.save({"params_ema": decoder.state_dict()}, models / "StyleGAN2_512_Cmul1_FFHQ_B12G4_scratch_800k.pth")
    arcface = build_network({"type": "ResNetArcFace", "block": "IRBlock", "layers": [2, 2, 2, 2], "use_se": False})
    torch.save(arcface.state_dict(), models / "arcface_resnet18.pth")
    torch.save({f"{i:08d}": {k: [np.float64(v) for v in vals] for k, vals in LANDMARKS.items()} for i in range(6)},
               models / "FFHQ_eye_mouth_landmarks_512.pth")
    torch.save(fake_vgg19_state_dict(), out / "vgg19.pth")  # the perceptual loss's VGG (no download in tests)
    return out


def _small(root: Path) -> list[str]:
    return [f"path.root={root}", *SMALL, f"train.perceptual_opt.vgg_weights_path={root / 'vgg19.pth'}"]


def train_gfpgan(root: Path, file: Path, sub: str, *extra: str, resume: bool = False,
                 env: dict[str, str] | None = None) -> Path:
    """``anysr train`` on a released file with the small overrides, in a copy of ``root`` named ``sub``."""
    work = root / sub
    if not work.exists():
        shutil.copytree(root, work, ignore=shutil.ignore_patterns("run_*", "train_GFPGAN*"))
    args = ["train", "-opt", str(file), "--force_yml", *_small(root), f"path.root={work}", *extra]
    run_cli(*args, *(["--auto_resume"] if resume else []), cwd=work, env=env)
    return work / "experiments" / NAMES[file]


# ----------------------------------------------------------------------------- the pieces

def test_gram_and_identity_input_follow_their_definitions() -> None:
    x = torch.randn(2, 3, 4, 5)
    f = x.reshape(2, 3, 20)
    torch.testing.assert_close(gram_matrix(x), torch.einsum("nci,ndi->ncd", f, f) / 60)
    for side in (64, 512, 100):  # up, down by 4 (GFPGAN's 512-pixel faces), a fraction
        face = torch.rand(2, 3, side, side) * 2 - 1
        luma = 0.2989 * face[:, 0:1] + 0.5870 * face[:, 1:2] + 0.1140 * face[:, 2:3]
        want = torch.nn.functional.interpolate(luma, (128, 128), mode="bilinear", align_corners=False)
        torch.testing.assert_close(gray_for_identity(face), want, rtol=1e-5, atol=1e-5)


def test_released_files_validate_as_they_are(root: Path) -> None:
    for file in (FULL, SIMPLE):
        opt = load_options(file, [f"path.root={root}", "accelerator=cpu", "num_gpu=1"], is_train=True)
        assert opt["model_type"] == "GFPGANModel" and opt["scale"] == 1  # no scale in the files: faces at size
        for ds in opt["datasets"].values():  # the authors' [-1, 1]: the model maps images itself
            assert ds["mean"] is None and ds["std"] is None
    opt = load_options(FULL, [f"path.root={root}", "accelerator=cpu", "num_gpu=1"], is_train=True)
    assert opt["network_d_left_eye"]["type"] == "FacialComponentDiscriminator"
    assert opt["network_g"]["decoder_load_path"] == str(
        root / "experiments" / "pretrained_models" / "StyleGAN2_512_Cmul1_FFHQ_B12G4_scratch_800k.pth")
    train = opt["train"]
    assert (train["pyramid_loss_weight"], train["remove_pyramid_loss"], train["comp_style_weight"],
            train["identity_weight"], train["r1_reg_weight"], train["net_d_reg_every"]) == (1, 50000, 200, 10, 10, 16)
    assert opt["path"]["strict_load_g"] is None  # BasicSR reads the file's null as "not strict"


@pytest.mark.parametrize(("extra", "pattern"), [
    (["datasets.train.mean=[0.4, 0.5, 0.5]"], r"datasets\.train\.mean: GFPGANModel maps images to \[-1, 1\] itself"),
    (["network_d_mouth=~"], r"network_d_mouth: the facial component discriminators come as three"),
    (["model_type=SRGANModel", "scale=1"],
     r"network_d_left_eye: is trained by model_type GFPGANModel or RestoreFormerModel only"),
    (["path.pretrain_network_identity=~"], r"path\.pretrain_network_identity: the identity loss needs ArcFace's"),
])
def test_mistakes_are_one_line(root: Path, extra: list[str], pattern: str) -> None:
    proc = run_cli("train", "-opt", str(FULL), "--force_yml", *_small(root), *extra,
                   "train.total_iter=1", cwd=root, check=False)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert any(re.search(pattern, ln) for ln in lines), proc.stderr
    assert "Traceback" not in proc.stderr


# ----------------------------------------------------------------------------- training

@pytest.mark.slow
def test_released_file_trains_every_loss_and_resumes_exactly(root: Path) -> None:
    """train_gfpgan_v1.yml: 4 iterations straight vs 2, stop, resume to 4 (R1 every 2, the pyramid loss off after
    2): the same generator, EMA, discriminators, bit for bit (the decoder's fresh noise comes from the generator
    state the training state keeps); every loss of the authors' log; the fixed decoder keeps the StyleGAN2 file's
    weights; validation PSNR on the pair folder."""
    common = ["logger.print_freq=1", "logger.save_checkpoint_freq=2", "val.val_freq=2", "train.net_d_reg_every=2",
              "train.remove_pyramid_loss=2"]
    exp_a = train_gfpgan(root, FULL, "run_a", *common, "train.total_iter=4")
    train_gfpgan(root, FULL, "run_b", *common, "train.total_iter=2")
    exp_b = train_gfpgan(root, FULL, "run_b", *common, "train.total_iter=4", resume=True)
    log = "\n".join(p.read_text() for p in (exp_a / "log").glob("train_*.log"))
    for key in ("l_g_pix", "l_p_8", "l_p_16", "l_p_32", "l_p_64", "l_g_percep", "l_g_style", "l_g_gan",
                "l_g_gan_left_eye", "l_g_gan_right_eye", "l_g_gan_mouth", "l_g_comp_style_loss", "l_identity", "l_d",
                "real_score", "fake_score", "l_d_r1", "l_d_left_eye", "l_d_right_eye", "l_d_mouth"):
        assert re.search(rf" {key}: [-+0-9.e]+", log), f"{key} not logged"
    assert re.search(r"l_p_64: [0-9.]+e-1[0-9]", log), "the pyramid loss is not 1e-12 after remove_pyramid_loss"
    assert re.search(r"psnr: [0-9]", log)
    a = load_file(str(exp_a / "models" / "net_g_4.safetensors"))
    b = load_file(str(exp_b / "models" / "net_g_4.safetensors"))
    assert {k.split(".")[0] for k in a} == {"params", "params_ema"}
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ"
    decoder = torch.load(root / "experiments" / "pretrained_models" / "StyleGAN2_512_Cmul1_FFHQ_B12G4_scratch_800k.pth",
                         weights_only=True)["params_ema"]
    assert all(torch.equal(a[f"params.stylegan_decoder.{k}"], v) for k, v in decoder.items()), "decoder moved"
    sa = torch.load(exp_a / "training_states" / "4.state", weights_only=True)["model"]["nets"]
    sb = torch.load(exp_b / "training_states" / "4.state", weights_only=True)["model"]["nets"]
    assert set(sa) == {"net_g", "net_d", "net_d_left_eye", "net_d_right_eye", "net_d_mouth"}  # not the identity net
    for net in sa:
        assert all(torch.equal(sa[net][k], sb[net][k]) for k in sa[net]), f"{net} differs after resume"


@pytest.mark.slow
def test_released_file_trains_on_two_gloo_ranks(root: Path) -> None:
    """Five networks under DDP (the file's find_unused_parameters), R1's double backward on the last iteration."""
    exp = train_gfpgan(root, FULL, "run_ranks", "num_gpu=2", "train.total_iter=2", "train.net_d_reg_every=2",
                 "logger.print_freq=2", "logger.save_checkpoint_freq=2", "val.val_freq=2")
    summary = json.loads((exp / "summary.json").read_text())
    assert summary["accelerator"]["world_size"] == 2 and summary["iterations_done"] == 2
    losses = summary["final_losses"]
    assert losses["l_d_r1"] > 0 and losses["l_identity"] >= 0 and "l_d_mouth" in losses
    assert all(np.isfinite(v) for v in losses.values())


@pytest.mark.slow
def test_simple_file_trains_and_tests(root: Path) -> None:
    """train_gfpgan_v1_simple.yml (no components, no identity) trains 2 iterations; `anysr test` on its weights."""
    exp = train_gfpgan(root, SIMPLE, "run_simple", "train.total_iter=2", "logger.print_freq=1",
                 "logger.save_checkpoint_freq=2", "val.val_freq=2")
    summary = json.loads((exp / "summary.json").read_text())
    assert summary["iterations_done"] == 2 and all(np.isfinite(v) for v in summary["final_losses"].values())
    assert "l_g_gan_left_eye" not in summary["final_losses"] and "l_p_8" in summary["final_losses"]
    weights = exp / "models" / "net_g_2.safetensors"
    out = root / "run_simple" / "out"
    run_cli("infer", "-i", str(root / "datasets" / "faces" / "validation" / "input"), "-o", str(out), "--weights",
            str(weights), cwd=root)
    got = sorted(p.name for p in out.iterdir())
    assert len(got) == 2 and cv2.imread(str(out / got[0])).shape == (SIZE, SIZE, 3)


def test_components_without_boxes_are_one_line(root: Path, small_train_dir: Path) -> None:
    """A training set without the landmarks (no loc_* boxes) with component discriminators: one line."""
    opt = tiny_train_options("gfp", small_train_dir, None, total_iter=1)
    opt.update(model_type="GFPGANModel", network_g={"type": "GFPGANv1", **NET_G, "fix_decoder": False},
               network_d={"type": "StyleGAN2Discriminator", "out_size": SIZE, "narrow": 0.125},
               **{f"network_d_{p}": {"type": "FacialComponentDiscriminator"} for p in LANDMARKS})
    del opt["scale"]
    opt["datasets"]["train"]["gt_size"] = SIZE
    opt["train"].update(optim_d={"type": "Adam", "lr": 1e-3}, optim_component={"type": "Adam", "lr": 1e-3},
                        gan_opt={"type": "GANLoss", "gan_type": "wgan_softplus", "loss_weight": 0.1},
                        gan_component_opt={"type": "GANLoss", "gan_type": "vanilla", "loss_weight": 1})
    path = write_options(root / "no_boxes.yml", opt)
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={root / 'run_no_boxes'}", cwd=root,
                   check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert re.search(r"GFPGANModel: the facial component discriminators need the face's eye and mouth boxes",
                     proc.stderr), proc.stderr


def test_other_models_refuse_face_networks(tmp_path: Path, small_train_dir: Path) -> None:
    opt = tiny_train_options("srgan", small_train_dir, None, total_iter=1)
    opt["network_identity"] = {"type": "ResNetArcFace"}
    with pytest.raises(OptionError,
                       match=r"network_identity: is trained by model_type GFPGANModel or RestoreFormerModel only"):
        load_options(write_options(tmp_path / "o.yml", opt), [], is_train=True)

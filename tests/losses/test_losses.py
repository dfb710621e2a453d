"""The loss menu: each loss against its reference (fixtures from tools/fixtures/make_loss_fixtures.py, or an
independent float64 computation / published values where the loss has no reference package), gradients,
reductions, fp32 under bf16 autocast, argument errors and option validation."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import FIXTURE_TOL, ROOT
from safetensors.torch import load_file
from torch import nn

from anysr.archs.vgg_features import VGG19_BN_NAMES
from anysr.losses import (
    CharbonnierLoss,
    ChromaLoss,
    ContextualLoss,
    DISTSLoss,
    FFLoss,
    FFTLoss,
    GANLoss,
    GradientVarianceLoss,
    HuberLoss,
    L1Loss,
    LPIPSLoss,
    LumaLoss,
    MSELoss,
    MSSSIML1Loss,
    MSSSIMLoss,
    MultiScaleGANLoss,
    OklabLoss,
    PerceptualLoss,
    SobelLoss,
    SSIMLoss,
    WeightedTVLoss,
    build_loss,
    gradient_penalty_loss,
    r1_penalty,
    relativistic_discriminator_loss,
    relativistic_generator_loss,
)
from anysr.losses.color import srgb_to_oklab
from anysr.losses.learned import contextual_similarity
from anysr.losses.perceptual import vgg19_stand_in
from anysr.options import validate_options
from anysr.registry import LOSS_REGISTRY

FIXTURES = ROOT / "tests" / "fixtures" / "losses"
IMAGES = ("x", "y", "xm", "ym")


def fixture(name: str) -> dict[str, torch.Tensor]:
    t = load_file(str(FIXTURES / f"{name}.safetensors"))
    return {k: v.float() / 255 if k in IMAGES else v for k, v in t.items()}


def close(got: torch.Tensor, want: torch.Tensor, what: str, **tol: float) -> None:
    torch.testing.assert_close(got, want.reshape(got.shape), **(tol or FIXTURE_TOL), msg=f"{what} differs")


# ---------------------------------------------------------------- structure (pytorch-msssim)
def test_ssim_matches_pytorch_msssim() -> None:
    t = fixture("structure")
    close(SSIMLoss(reduction="none")(t["x"], t["y"]), 1 - t["ssim"], "SSIM")
    close(SSIMLoss(reduction="none", win_size=7, win_sigma=1.0)(t["x"], t["y"]), 1 - t["ssim_w7"], "SSIM win 7")
    close(SSIMLoss(loss_weight=0.5)(t["x"], t["y"]), 0.5 * (1 - t["ssim"]).mean(), "SSIM mean")
    close(SSIMLoss(reduction="sum")(t["x"], t["y"]), (1 - t["ssim"]).sum(), "SSIM sum")


def test_ms_ssim_matches_pytorch_msssim() -> None:
    t = fixture("structure")
    x, y = t["xm"], t["ym"]
    close(MSSSIMLoss(reduction="none", win_size=3)(x, y), 1 - t["msssim_w3"], "MS-SSIM, 5 scales")
    close(MSSSIMLoss(reduction="none", win_size=3, weights=[0.2, 0.3, 0.5])(x, y), 1 - t["msssim_w3_3lvl"],
          "MS-SSIM, 3 scales")
    close(MSSSIML1Loss(reduction="none", win_size=3)(x, y), t["msssiml1_w3"], "MS-SSIM + L1")
    close(MSSSIML1Loss(loss_weight=2.0, win_size=3)(x, y), 2 * t["msssiml1_w3"].mean(), "MS-SSIM + L1 mean")


def test_ssim_of_identical_images_is_one_and_small_images_are_refused() -> None:
    x = torch.rand(1, 3, 24, 24)
    assert SSIMLoss()(x, x).abs().max() < 1e-6
    with pytest.raises(ValueError, match="too small.*>= 161"):
        MSSSIMLoss()(x, x)
    with pytest.raises(ValueError, match="too small"):
        SSIMLoss()(x[..., :8, :8], x[..., :8, :8])
    with pytest.raises(ValueError, match="one shape"):
        SSIMLoss()(x, x[..., :20])


# ---------------------------------------------------------------- pixel (BasicSR)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_weighted_pixel_losses_match_basicsr(reduction: str) -> None:
    t = fixture("pixel")
    x, y = t["x"], t["y"]
    close(L1Loss(0.7, reduction)(x, y, t["w1"]), t[f"l1_w1_{reduction}"], "L1, 1-channel weight")
    close(MSELoss(0.7, reduction)(x, y, t["w3"]), t[f"mse_w3_{reduction}"], "MSE, 3-channel weight")
    close(CharbonnierLoss(0.7, reduction, eps=1e-6)(x, y, t["w1"]), t[f"charb_w1_{reduction}"], "Charbonnier")


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_weighted_tv_matches_basicsr(reduction: str) -> None:
    t = fixture("pixel")
    tv = WeightedTVLoss(0.7, reduction)
    close(tv(t["x"]), t[f"tv_{reduction}"], "TV")
    close(tv(t["x"], t["y"]), t[f"tv_{reduction}"], "TV (target ignored)")
    close(tv(t["x"], weight=t["w1"]), t[f"tv_w1_{reduction}"], "TV, 1-channel weight")
    close(tv(t["x"], weight=t["w3"]), t[f"tv_w3_{reduction}"], "TV, 3-channel weight")
    with pytest.raises(ValueError, match="'mean' or 'sum'"):
        WeightedTVLoss(reduction="none")


def test_luma_chroma_match_basicsr_rgb2ycbcr() -> None:
    t = fixture("pixel")
    close(LumaLoss()(t["x"], t["y"]), t["luma_l1"], "luma L1")
    close(ChromaLoss()(t["x"], t["y"]), t["chroma_l1"], "chroma L1")
    with pytest.raises(ValueError, match="NCHW RGB"):
        LumaLoss()(t["x"][:, :1], t["y"][:, :1])


def test_huber_against_formula() -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 3, 8, 8, generator=g), torch.randn(2, 3, 8, 8, generator=g)
    d = (x - y).double().abs().numpy()
    delta = 0.5
    want = np.where(d < delta, 0.5 * d**2, delta * (d - 0.5 * delta)).mean() * 0.3
    close(HuberLoss(0.3, delta=delta)(x, y), torch.tensor(want, dtype=torch.float32), "Huber")
    with pytest.raises(ValueError, match="delta"):
        HuberLoss(delta=0)


# ---------------------------------------------------------------- edges (float64 numpy references)
def _sobel_np(img: np.ndarray, pad: str) -> tuple[np.ndarray, np.ndarray]:
    """Sobel responses of one 2-D float64 image, same size ('edge' or 'constant' padding)."""
    p = np.pad(img, 1, mode="edge" if pad == "replicate" else "constant")
    kx = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], dtype=np.float64)
    h, w = img.shape
    gx, gy = np.zeros_like(img), np.zeros_like(img)
    for i in range(3):
        for j in range(3):
            gx += kx[i, j] * p[i:i + h, j:j + w]
            gy += kx[j, i] * p[i:i + h, j:j + w]
    return gx, gy


def test_sobel_loss_against_numpy() -> None:
    t = fixture("pixel")
    x, y = t["x"].double().numpy(), t["y"].double().numpy()
    total = 0.0
    for n in range(x.shape[0]):
        for c in range(x.shape[1]):
            (ax, ay), (bx, by) = _sobel_np(x[n, c], "replicate"), _sobel_np(y[n, c], "replicate")
            total += (np.abs(ax - bx) + np.abs(ay - by)).sum()
    close(SobelLoss(reduction="sum")(t["x"], t["y"]), torch.tensor(total, dtype=torch.float32), "Sobel",
          rtol=1e-5, atol=1e-3)  # a sum of 1536 terms of size ~1
    ramp = torch.arange(8.0).view(1, 1, 1, 8).expand(1, 1, 8, 8)
    assert SobelLoss(reduction="none")(ramp, torch.zeros_like(ramp))[0, 0, 3, 3] == 8.0  # 1+2+1 per side


def test_gradient_variance_loss_against_numpy() -> None:
    t = fixture("pixel")
    x, y = t["x"].double().numpy(), t["y"].double().numpy()
    gray = np.array([0.299, 0.587, 0.114]).reshape(1, 3, 1, 1)
    gx, gy = (x * gray).sum(1), (y * gray).sum(1)
    p = 4
    terms = []
    for n in range(x.shape[0]):
        (ax, ay), (bx, by) = _sobel_np(gx[n], "zeros"), _sobel_np(gy[n], "zeros")
        for i in range(0, 16, p):
            for j in range(0, 16, p):
                va, vb = (float(a[i:i + p, j:j + p].var(ddof=1)) for a in (ax, bx))
                wa, wb = (float(a[i:i + p, j:j + p].var(ddof=1)) for a in (ay, by))
                terms.append((va - vb) ** 2 + (wa - wb) ** 2)
    close(GradientVarianceLoss(patch_size=p)(t["x"], t["y"]), torch.tensor(np.mean(terms), dtype=torch.float32),
          "gradient variance")
    with pytest.raises(ValueError, match="multiples of patch_size"):
        GradientVarianceLoss(patch_size=5)(t["x"], t["y"])


# ---------------------------------------------------------------- colour
def test_oklab_matches_published_values() -> None:
    """sRGB primaries and white in Oklab as Ottosson (and CSS Color 4) give them."""
    rgb = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [1.0, 1.0, 1.0]]).view(4, 3, 1, 1)
    want = torch.tensor([[0.627955, 0.224863, 0.125846], [0.866440, -0.233888, 0.179498],
                         [0.452014, -0.032457, -0.311528], [1.0, 0.0, 0.0]])
    torch.testing.assert_close(srgb_to_oklab(rgb).view(4, 3), want, rtol=0, atol=2e-4)
    black = torch.zeros(1, 3, 2, 2, requires_grad=True)
    OklabLoss()(black, torch.full((1, 3, 2, 2), 0.5)).backward()
    assert torch.isfinite(black.grad).all()


# ---------------------------------------------------------------- frequency
def test_fft_loss_against_numpy() -> None:
    t = fixture("pixel")
    fx = np.fft.fft2(t["x"].double().numpy(), norm="ortho")
    fy = np.fft.fft2(t["y"].double().numpy(), norm="ortho")
    amp = np.abs(np.abs(fx) - np.abs(fy)).mean()
    phase = (1 - np.cos(np.angle(fx) - np.angle(fy))).mean()
    close(FFTLoss()(t["x"], t["y"]), torch.tensor(amp, dtype=torch.float32), "FFT amplitude")
    close(FFTLoss(0.5, amplitude_weight=0.0, phase_weight=1.0)(t["x"], t["y"]),
          torch.tensor(0.5 * phase, dtype=torch.float32), "FFT phase")
    with pytest.raises(ValueError, match="not both 0"):
        FFTLoss(amplitude_weight=0.0)


def test_focal_frequency_loss_matches_reference() -> None:
    t = fixture("ffl")
    close(FFLoss()(t["x"], t["y"]), t["default"], "FFL")
    close(FFLoss(alpha=2.0, patch_factor=2, log_matrix=True)(t["x"], t["y"]), t["alpha2_patch2_log"], "FFL patches")
    close(FFLoss(0.5, ave_spectrum=True, batch_matrix=True)(t["x"], t["y"]), t["ave_batch"], "FFL batch")
    with pytest.raises(ValueError, match="patch_factor=3"):
        FFLoss(patch_factor=3)(t["x"], t["y"])


# ---------------------------------------------------------------- GAN (BasicSR)
def test_multiscale_gan_loss_matches_basicsr() -> None:
    t = fixture("gan")
    outputs = [t["s0"], [t["n0"], t["s1"]]]
    for gan_type in ("vanilla", "lsgan", "wgan", "wgan_softplus", "hinge"):
        loss = MultiScaleGANLoss(gan_type, real_label_val=0.9, fake_label_val=0.1, loss_weight=0.3)
        for real in (True, False):
            for disc in (True, False):
                close(loss(outputs, real, is_disc=disc), t[f"ms_{gan_type}_{int(real)}{int(disc)}"],
                      f"MultiScaleGANLoss {gan_type} real={real} disc={disc}")
        close(loss(t["s0"], True), GANLoss(gan_type, 0.9, 0.1, 0.3)(t["s0"], True), "single tensor")
    with pytest.raises(ValueError, match="empty"):
        MultiScaleGANLoss("vanilla")([], True)


@pytest.mark.parametrize("gan_type", ["vanilla", "lsgan"])
def test_relativistic_average_matches_esrgan(gan_type: str) -> None:
    t = fixture("gan")
    gan = GANLoss(gan_type, loss_weight=0.005)
    close(relativistic_generator_loss(gan, t["real_d"], t["fake_d"]), t[f"ra_g_{gan_type}"], "RA generator")
    d_real, d_fake = relativistic_discriminator_loss(gan, t["real_d"], t["fake_d"])
    close(d_real, t[f"ra_d_real_{gan_type}"], "RA discriminator (real)")
    close(d_fake, t[f"ra_d_fake_{gan_type}"], "RA discriminator (fake)")


def _tiny_discriminator(t: dict[str, torch.Tensor]) -> nn.Module:
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.LeakyReLU(0.2), nn.Conv2d(4, 1, 3))
    net.load_state_dict({k[2:]: v for k, v in t.items() if k.startswith("d.")})
    return net


def test_r1_and_gradient_penalty_match_basicsr() -> None:
    t = fixture("gan")
    net = _tiny_discriminator(t)
    real = t["real"].clone().requires_grad_(True)
    r1 = r1_penalty(net(real), real)
    close(r1, t["r1"], "R1")
    r1.backward()  # the penalty is differentiable (graph kept)
    assert torch.isfinite(net[0].weight.grad).all() and net[0].weight.grad.abs().sum() > 0
    gp = gradient_penalty_loss(net, t["real"], t["fake"], alpha=t["gp_alpha"])
    close(gp, t["gp"], "gradient penalty")
    close(gradient_penalty_loss(net, t["real"], t["fake"], weight=t["gp_weight"], alpha=t["gp_w_alpha"]),
          t["gp_w"], "weighted gradient penalty")
    assert torch.isfinite(gradient_penalty_loss(net, t["real"], t["fake"]))  # alpha drawn on the data's device


# ---------------------------------------------------------------- common behaviour
PIXEL_ROLE = {
    "HuberLoss": {}, "WeightedTVLoss": {}, "SSIMLoss": {}, "MSSSIMLoss": {"win_size": 3, "weights": [0.5, 0.5]},
    "MSSSIML1Loss": {"win_size": 3, "weights": [0.5, 0.5]}, "SobelLoss": {}, "GradientVarianceLoss": {},
    "LumaLoss": {}, "ChromaLoss": {}, "OklabLoss": {}, "FFTLoss": {"phase_weight": 1.0}, "FFLoss": {},
}
FP32_UNDER_AUTOCAST = ("SSIMLoss", "MSSSIMLoss", "MSSSIML1Loss", "LumaLoss", "ChromaLoss", "OklabLoss", "FFTLoss",
                       "FFLoss")


def _pair() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(9)
    x = torch.rand(2, 3, 32, 32, generator=g)
    return x, (x + 0.1 * torch.randn(2, 3, 32, 32, generator=g)).clamp(0, 1)


@pytest.mark.parametrize("name", sorted(PIXEL_ROLE))
def test_registered_pixel_role_finite_gradients_and_reductions(name: str) -> None:
    cls = LOSS_REGISTRY.get(name)
    assert cls.role == "pixel"
    x, y = _pair()
    pred = x.clone().requires_grad_(True)
    loss = build_loss({"type": name, "loss_weight": 2.0, **PIXEL_ROLE[name]}, "train.pixel_opt")
    value = loss(pred, y)
    assert value.shape == () and torch.isfinite(value) and value > 0
    value.backward()
    assert torch.isfinite(pred.grad).all() and pred.grad.abs().sum() > 0
    if name != "WeightedTVLoss":
        none = cls(reduction="none", **PIXEL_ROLE[name])(x, y)
        close(cls(reduction="sum", **PIXEL_ROLE[name])(x, y), none.sum(), f"{name} sum", rtol=1e-5, atol=1e-4)
        close(cls(**PIXEL_ROLE[name])(x, y), none.mean(), f"{name} mean")
        close(value, 2 * none.mean(), f"{name} loss_weight")
    with pytest.raises(ValueError, match="reduction"):
        cls(reduction="median", **PIXEL_ROLE[name])


@pytest.mark.parametrize("name", FP32_UNDER_AUTOCAST)
def test_fp32_inside_bf16_autocast(name: str) -> None:
    x, y = _pair()
    loss = LOSS_REGISTRY.get(name)(**PIXEL_ROLE[name])
    want = loss(x, y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = loss(x, y)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)  # same fp32 kernels, in and out of autocast


def test_bad_arguments_are_clear() -> None:
    cases: list[tuple[Any, dict[str, Any], str]] = [
        (SSIMLoss, {"win_size": 4}, "positive odd"), (MSSSIMLoss, {"weights": []}, "weights is empty"),
        (MSSSIML1Loss, {"alpha": 1.5}, r"alpha must be in \[0, 1\]"), (SobelLoss, {"criterion": "l3"}, "l1, l2"),
        (OklabLoss, {"criterion": "fro"}, "charbonnier"), (GradientVarianceLoss, {"patch_size": 1}, "patch_size"),
        (FFLoss, {"patch_factor": 0}, "patch_factor"),
    ]
    for cls, kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            cls(**kwargs)
    x, y = _pair()
    with pytest.raises(ValueError, match="does not fit"):
        L1Loss()(x, y, torch.ones(2, 2, 32, 32))
    with pytest.raises(ValueError, match="takes no weight"):
        FFLoss()(x, y, torch.ones_like(x))


def test_per_image_weight() -> None:
    x, y = _pair()
    per = SSIMLoss(reduction="none")(x, y)
    w = torch.tensor([1.0, 3.0])
    close(SSIMLoss()(x, y, w), (per * w).sum() / w.sum(), "weighted SSIM mean")


@pytest.mark.parametrize("name", sorted(PIXEL_ROLE))
def test_pixel_opt_validates(name: str, tmp_path: Path) -> None:
    gt = tmp_path / "gt"
    gt.mkdir()
    opt = {
        "name": "tiny", "scale": 2,
        "datasets": {"train": {"type": "PairedImageDataset", "dataroot_gt": str(gt), "lq_from_gt": True,
                               "gt_size": 32, "batch_size_per_gpu": 4}},
        "network_g": {"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "upscale": 2},
        "train": {"total_iter": 10, "optim_g": {"type": "Adam", "lr": 1e-3},
                  "pixel_opt": {"type": name, "loss_weight": 0.5, **PIXEL_ROLE[name]}},
    }
    out = validate_options(opt, is_train=True, root=tmp_path)["train"]["pixel_opt"]
    assert out["type"] == name and out["loss_weight"] == 0.5
    assert math.isclose(build_loss(out, "train.pixel_opt").loss_weight, 0.5)


# ---------------------------------------------------------------- perceptual (BasicSR, vgg19_bn)
PERCEPTUAL_CASES = {
    "l1": {"perceptual_weight": 2.0, "style_weight": 0.5, "criterion": "l1"},
    "l2_range": {"perceptual_weight": 1.0, "style_weight": 1.0, "criterion": "l2", "range_norm": True},
    "fro_nonorm": {"perceptual_weight": 0.5, "style_weight": 2.0, "criterion": "fro", "use_input_norm": False},
}
PERCEPTUAL_LAYERS = {"bn1_1": 0.2, "relu1_1": 0.4, "bn1_2": 0.3, "relu1_2": 1.0}  # pre- and post-activation


def vgg19_bn_fixture() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(the fixture's tensors, its vgg19_bn state dict with the int8 conv weights scaled back)."""
    t = fixture("perceptual_bn")
    sd = {k: v for k, v in t.items() if k.startswith("features.") and not k.endswith(".q")}
    for k, v in t.items():
        if k.endswith(".weight.q"):
            sd[k[:-2]] = v.float() * ((6 / (9 * v.shape[1])) ** 0.5 / 127)
    return t, sd


@pytest.mark.parametrize("case", sorted(PERCEPTUAL_CASES))
def test_perceptual_vgg19_bn_matches_basicsr(case: str) -> None:
    t, sd = vgg19_bn_fixture()
    loss = PerceptualLoss(PERCEPTUAL_LAYERS, vgg_type="vgg19_bn", vgg_state_dict=sd, **PERCEPTUAL_CASES[case])
    percep, style = loss(t["x"], t["y"])
    assert percep is not None and style is not None
    close(percep, t[f"percep_{case}"], f"perceptual ({case})", rtol=1e-5, atol=1e-5)
    close(style, t[f"style_{case}"], f"style ({case})", rtol=1e-5, atol=1e-5)


def test_perceptual_charbonnier_and_autocast() -> None:
    t, sd = vgg19_bn_fixture()
    loss = PerceptualLoss({"relu1_2": 1.0}, vgg_type="vgg19_bn", criterion="charbonnier", eps=1e-6,
                          vgg_state_dict=sd)
    fx, fy = loss.vgg(t["x"]), loss.vgg(t["y"])
    want = torch.sqrt((fx["relu1_2"] - fy["relu1_2"]) ** 2 + 1e-6).mean()
    percep, style = loss(t["x"], t["y"])
    close(percep, want, "charbonnier perceptual")
    assert style is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low, _ = loss(t["x"], t["y"])
    assert low.dtype == torch.float32 and torch.isclose(low, want, rtol=0.05)  # bf16 features, fp32 distance
    with pytest.raises(ValueError, match="l1, l2, charbonnier or fro"):
        PerceptualLoss({"relu1_2": 1.0}, criterion="l3", vgg_state_dict=sd)
    with pytest.raises(ValueError, match=r"unknown VGG19-BN layer\(s\) \['bn6_1'\]"):
        PerceptualLoss({"bn6_1": 1.0}, vgg_type="vgg19_bn", vgg_state_dict=sd)
    with pytest.raises(KeyError, match="VGG19-BN weights lack 'features.1.running_mean'"):
        PerceptualLoss({"bn1_1": 1.0}, vgg_type="vgg19_bn",
                       vgg_state_dict={k: v for k, v in sd.items() if k != "features.1.running_mean"})


def test_vgg19_bn_stand_in_loads() -> None:
    sd = vgg19_stand_in(vgg_type="vgg19_bn")
    assert "features.1.running_var" in sd and "features.49.weight" in sd
    PerceptualLoss({"relu5_4": 1.0}, vgg_type="vgg19_bn", vgg_state_dict=sd)
    assert VGG19_BN_NAMES.index("relu5_4") == 51


# ---------------------------------------------------------------- learned (lpips package, DISTS authors' code)
METRIC_FIX = ROOT / "tests" / "fixtures" / "metrics"


def _seeded(name: str, key: str) -> dict[str, torch.Tensor]:
    """The seeded weights the metric fixtures were made with (tools/fixtures/make_metric_fixtures.py)."""
    from make_metric_fixtures import seeded_state_dict  # noqa: PLC0415 - tools/fixtures (tests/conftest.py)

    manifest = json.loads((METRIC_FIX / "manifest.json").read_text())
    return seeded_state_dict(manifest[name][key])


def _metric_pair(name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    data = load_file(str(METRIC_FIX / f"{name}.safetensors"))
    ref = data["dist"] if "dist" in data else data["score"]
    return data["x"].float() / 255, data["y"].float() / 255, ref


@pytest.mark.parametrize("net", ["alex", "vgg"])
def test_lpips_loss_matches_lpips_package(net: str) -> None:
    x, y, ref = _metric_pair(f"lpips_{net}")
    sds = [_seeded(f"lpips_{net}", "backbone_shapes"), _seeded(f"lpips_{net}", "head_shapes")]
    loss = LPIPSLoss(reduction="none", net=net, weight_state_dicts=sds)
    assert loss.role == "learned"
    close(loss(x, y), ref, f"LPIPS({net}) loss")
    pred = x.clone().requires_grad_(True)
    LPIPSLoss(0.5, net=net, weight_state_dicts=sds)(pred, y).backward()
    assert torch.isfinite(pred.grad).all() and pred.grad.abs().sum() > 0
    assert not any(p.requires_grad for p in loss.parameters())


def test_dists_loss_matches_dists_package() -> None:
    x, y, ref = _metric_pair("dists")
    sds = [_seeded("dists", "vgg_shapes"), _seeded("dists", "head_shapes")]
    loss = DISTSLoss(reduction="none", weight_state_dicts=sds)
    close(loss(x, y), ref, "DISTS loss")
    close(DISTSLoss(2.0, weight_state_dicts=sds)(x, y), 2 * ref.mean(), "DISTS loss mean")
    pred = x.clone().requires_grad_(True)
    DISTSLoss(weight_state_dicts=sds)(pred, y).backward()
    assert torch.isfinite(pred.grad).all() and pred.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="needs weight_state_dicts"):
        DISTSLoss()
    with pytest.raises(ValueError, match="needs weight_state_dicts"):
        LPIPSLoss(net="vgg")


def _contextual_np(x: np.ndarray, y: np.ndarray, h: float, eps: float = 1e-5) -> np.ndarray:
    """Contextual similarity per image in float64, written from the paper's equations."""
    out = []
    for a, b in zip(x, y):
        mu = b.reshape(b.shape[0], -1).mean(1, keepdims=True)
        fa, fb = a.reshape(a.shape[0], -1) - mu, b.reshape(b.shape[0], -1) - mu
        fa, fb = fa / np.linalg.norm(fa, axis=0, keepdims=True), fb / np.linalg.norm(fb, axis=0, keepdims=True)
        d = 1 - fa.T @ fb  # (Px, Py)
        rel = d / (d.min(axis=1, keepdims=True) + eps)
        w = np.exp((1 - rel) / h)
        cx = w / w.sum(axis=1, keepdims=True)
        out.append(cx.max(axis=0).mean())
    return np.array(out)


def test_contextual_loss_against_numpy() -> None:
    g = torch.Generator().manual_seed(11)
    fx, fy = torch.randn(2, 8, 5, 6, generator=g), torch.randn(2, 8, 5, 6, generator=g)
    want = _contextual_np(fx.double().numpy(), fy.double().numpy(), 0.3)
    close(contextual_similarity(fx, fy, 0.3), torch.tensor(want, dtype=torch.float32), "contextual similarity")
    sd = vgg19_stand_in()
    layers = {"relu2_1": 1.0, "conv3_1": 0.5}
    loss = ContextualLoss(layers, vgg_state_dict=sd)
    assert loss.role == "learned"
    x, y = _pair()
    x, y = x[..., :16, :16], y[..., :16, :16]
    fa, fb = loss.vgg(x), loss.vgg(y)
    manual = sum(-torch.log(contextual_similarity(fa[k], fb[k])) * w for k, w in layers.items())
    close(loss(x, y), manual.mean(), "contextual loss")
    pred = x.clone().requires_grad_(True)
    value = loss(pred, y)
    value.backward()
    assert torch.isfinite(pred.grad).all() and loss(x, x) < value
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert loss(x, y).dtype == torch.float32
        torch.testing.assert_close(loss(x, y), value.detach(), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="needs vgg_state_dict"):
        ContextualLoss()
    with pytest.raises(ValueError, match="band_width"):
        ContextualLoss(band_width=0, vgg_state_dict=sd)


def test_gan_and_perceptual_opts_validate(tmp_path: Path) -> None:
    gt = tmp_path / "gt"
    gt.mkdir()
    vgg = tmp_path / "vgg19_bn.pth"
    vgg.write_bytes(b"x")
    opt = {
        "name": "tiny", "scale": 2, "model_type": "ESRGANModel",
        "datasets": {"train": {"type": "PairedImageDataset", "dataroot_gt": str(gt), "lq_from_gt": True,
                               "gt_size": 32, "batch_size_per_gpu": 4}},
        "network_g": {"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "upscale": 2},
        "network_d": {"type": "VGGStyleDiscriminator", "num_in_ch": 3, "num_feat": 4},
        "train": {"total_iter": 10, "optim_g": {"type": "Adam", "lr": 1e-3}, "optim_d": {"type": "Adam", "lr": 1e-3},
                  "gan_opt": {"type": "MultiScaleGANLoss", "gan_type": "hinge", "loss_weight": 0.1},
                  "perceptual_opt": {"type": "PerceptualLoss", "vgg_type": "vgg19_bn", "criterion": "charbonnier",
                                     "layer_weights": {"bn5_4": 1.0}, "vgg_weights_path": str(vgg)}},
    }
    train = validate_options(opt, is_train=True, root=tmp_path)["train"]
    assert train["gan_opt"]["type"] == "MultiScaleGANLoss" and train["perceptual_opt"]["eps"] == 1e-12

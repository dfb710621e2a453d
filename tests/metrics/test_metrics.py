"""PSNR / SSIM: BasicSR's definitions in numpy, and device-side torch twins that agree with them."""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import ROOT

from anysr.errors import DataError, OptionError
from anysr.metrics import TORCH_METRICS, calculate_psnr, calculate_ssim, psnr_torch, ssim_torch
from anysr.metrics.psnr_ssim import gaussian_window
from anysr.ops.imresize import imresize
from anysr.registry import METRIC_REGISTRY

DATASETS = ROOT / "datasets"


def _q(x: np.ndarray) -> np.ndarray:
    return np.clip(np.round(x), 0, 255).astype(np.uint8)


def _bicubic_pair(path: Path, scale: int) -> tuple[np.ndarray, np.ndarray]:
    """(SR, GT): the classic bicubic baseline of a real image, uint8 as saved files."""
    hr = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    h, w = hr.shape[:2]
    hr = hr[: h - h % scale, : w - w % scale]
    return _q(imresize(_q(imresize(hr, 1 / scale)), scale)), hr


def _tensor(img: np.ndarray) -> torch.Tensor:
    """uint8 BGR (or gray) numpy -> 1x3xHxW RGB float tensor on [0, 1] (gray replicated)."""
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=2)
    return torch.from_numpy(np.ascontiguousarray(img[..., ::-1])).permute(2, 0, 1)[None].float() / 255


def _naive_ssim(a: np.ndarray, b: np.ndarray) -> float:
    """SSIM from its definition, window by window, with two-pass variances (slow; tiny images only)."""
    win = gaussian_window()
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    vals = []
    for i in range(a.shape[0] - 10):
        for j in range(a.shape[1] - 10):
            pa, pb = a[i:i + 11, j:j + 11], b[i:i + 11, j:j + 11]
            ma, mb = (win * pa).sum(), (win * pb).sum()
            va, vb = (win * (pa - ma) ** 2).sum(), (win * (pb - mb) ** 2).sum()
            cov = (win * (pa - ma) * (pb - mb)).sum()
            vals.append((2 * ma * mb + c1) * (2 * cov + c2) / ((ma**2 + mb**2 + c1) * (va + vb + c2)))
    return float(np.mean(vals))


# ------------------------------------------------------------------------------------------ numpy
def test_psnr_known_values() -> None:
    a = np.full((8, 8, 3), 100, dtype=np.uint8)
    b = a.copy()
    assert calculate_psnr(a, b, 0) == float("inf")
    b[...] = 101
    assert calculate_psnr(a, b, 0) == pytest.approx(10 * math.log10(255**2), abs=1e-12)  # mse = 1
    b[2:6, 2:6] = 110  # changes only inside the border, so crop_border=2 sees mse = 100 there
    assert calculate_psnr(a, b, 2) == pytest.approx(10 * math.log10(255**2 / 100), abs=1e-12)
    chw_a, chw_b = a.transpose(2, 0, 1), b.transpose(2, 0, 1)
    assert calculate_psnr(chw_a, chw_b, 2, input_order="CHW") == calculate_psnr(a, b, 2)


def test_psnr_y_channel_and_gray() -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)
    b = rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)
    ya = 16 + (a[..., 2] * 65.481 + a[..., 1] * 128.553 + a[..., 0] * 24.966) / 255
    yb = 16 + (b[..., 2] * 65.481 + b[..., 1] * 128.553 + b[..., 0] * 24.966) / 255
    expected = 10 * math.log10(255**2 / np.mean((ya - yb)[1:-1, 1:-1] ** 2))
    assert calculate_psnr(a, b, 1, test_y_channel=True) == pytest.approx(expected, abs=1e-9)
    g, h = a[..., 0], b[..., 0]  # a gray image is its own Y
    assert calculate_psnr(g, h, 1, test_y_channel=True) == calculate_psnr(g, h, 1)
    assert calculate_psnr(g, h, 1) == pytest.approx(
        10 * math.log10(255**2 / np.mean((g.astype(float) - h)[1:-1, 1:-1] ** 2)), abs=1e-12)


def test_ssim_matches_the_definition() -> None:
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (20, 18), dtype=np.uint8).astype(np.float64)
    b = np.clip(a + rng.normal(0, 20, a.shape), 0, 255).round()
    assert calculate_ssim(a, b, 0) == pytest.approx(_naive_ssim(a, b), abs=1e-12)
    assert calculate_ssim(a, a, 0) == pytest.approx(1.0, abs=1e-12)
    colour = np.stack([a, b, a], axis=-1)
    other = np.stack([b, a, a], axis=-1)
    per_channel = [_naive_ssim(colour[..., c], other[..., c]) for c in range(3)]
    assert calculate_ssim(colour, other, 0) == pytest.approx(np.mean(per_channel), abs=1e-12)


def test_gaussian_window() -> None:
    win = gaussian_window()
    assert win.shape == (11, 11) and win.sum() == pytest.approx(1.0, abs=1e-12)
    g = np.exp(-((np.arange(11) - 5) ** 2) / (2 * 1.5**2))
    assert np.allclose(win, np.outer(g, g) / np.outer(g, g).sum(), rtol=0, atol=1e-15)


def test_metrics_are_registered_under_basicsr_names() -> None:
    assert METRIC_REGISTRY.get("calculate_psnr") is calculate_psnr
    assert METRIC_REGISTRY.get("psnr") is calculate_psnr
    assert METRIC_REGISTRY.get("calculate_ssim") is calculate_ssim
    assert METRIC_REGISTRY.get("ssim") is calculate_ssim
    assert METRIC_REGISTRY.get("calculate_psnr_pt") is psnr_torch
    assert TORCH_METRICS["psnr"] is psnr_torch and TORCH_METRICS["calculate_ssim"] is ssim_torch
    # BasicSR passes the whole metric option dict as keyword arguments.
    a = np.zeros((16, 16, 3), dtype=np.uint8)
    assert calculate_psnr(a, a + 1, crop_border=0, type="calculate_psnr", better="higher") > 48


def test_numpy_metric_errors_name_the_problem() -> None:
    a = np.zeros((16, 16, 3), dtype=np.uint8)
    with pytest.raises(DataError, match=r"calculate_psnr: image shapes differ: \(16, 16, 3\) vs \(16, 15,"):
        calculate_psnr(a, a[:, :15], 0)
    with pytest.raises(OptionError, match=r"input_order: must be 'HWC' or 'CHW', got 'NHWC'"):
        calculate_ssim(a, a, 0, input_order="NHWC")
    with pytest.raises(DataError, match=r"crop_border=8 leaves nothing of a 16x16 image; lower crop_border"):
        calculate_psnr(a, a, 8)
    with pytest.raises(OptionError, match=r"crop_border: must be >= 0, got -1"):
        calculate_psnr(a, a, -1)
    with pytest.raises(DataError, match=r"calculate_ssim: a 10x10 image \(after crop_border\) is smaller "
                                        r"than the 11x11 window"):
        calculate_ssim(a, a, 3)
    with pytest.raises(DataError, match=r"expected an HWC, CHW or 2-D image, got shape \(1, 16, 16, 3\)"):
        calculate_psnr(a[None], a[None], 0)


# ------------------------------------------------------------------------------------------ torch
@pytest.fixture(scope="module")
def real_pairs() -> list[tuple[np.ndarray, np.ndarray]]:
    return [
        _bicubic_pair(DATASETS / "Set5" / "HR" / "butterfly.png", 2),
        _bicubic_pair(DATASETS / "Set5" / "HR" / "head.png", 4),
        _bicubic_pair(DATASETS / "Set14" / "HR" / "face.png", 3),
        _bicubic_pair(DATASETS / "Set14" / "HR" / "bridge.png", 3),  # grayscale
    ]


@pytest.mark.parametrize("y", [True, False])
def test_torch_metrics_agree_with_numpy(real_pairs: list[tuple[np.ndarray, np.ndarray]], y: bool) -> None:
    for (sr, gt), border in zip(real_pairs, (2, 4, 3, 3)):
        gray = torch.tensor([gt.ndim == 2])
        p = psnr_torch(_tensor(sr), _tensor(gt), border, y, gray)
        s = ssim_torch(_tensor(sr), _tensor(gt), border, y, gray)
        assert p.shape == (1,) and s.shape == (1,) and p.dtype == torch.float32
        assert abs(p.item() - calculate_psnr(sr, gt, border, test_y_channel=y)) < 1e-4
        assert abs(s.item() - calculate_ssim(sr, gt, border, test_y_channel=y)) < 1e-6


def test_torch_metrics_batch_with_a_gray_image(real_pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
    (sr_c, gt_c), (sr_g, gt_g) = real_pairs[0], real_pairs[3]
    size = 200
    sr = torch.cat([_tensor(sr_c[:size, :size]), _tensor(sr_g[:size, :size])])
    gt = torch.cat([_tensor(gt_c[:size, :size]), _tensor(gt_g[:size, :size])])
    gray = torch.tensor([False, True])
    p = psnr_torch(sr, gt, 3, True, gray)
    s = ssim_torch(sr, gt, 3, True, gray)
    assert p.shape == (2,) and s.shape == (2,)
    c_sr, c_gt, g_sr, g_gt = sr_c[:size, :size], gt_c[:size, :size], sr_g[:size, :size], gt_g[:size, :size]
    assert abs(p[0].item() - calculate_psnr(c_sr, c_gt, 3, test_y_channel=True)) < 1e-4
    assert abs(p[1].item() - calculate_psnr(g_sr, g_gt, 3, test_y_channel=True)) < 1e-4
    assert abs(s[0].item() - calculate_ssim(c_sr, c_gt, 3, test_y_channel=True)) < 1e-6
    assert abs(s[1].item() - calculate_ssim(g_sr, g_gt, 3, test_y_channel=True)) < 1e-6
    # Not on Y: a gray image counts once (channel 0), a colour one averages its channels.
    p_rgb = psnr_torch(sr, gt, 3, False, gray)
    s_rgb = ssim_torch(sr, gt, 3, False, gray)
    assert abs(p_rgb[0].item() - calculate_psnr(c_sr, c_gt, 3)) < 1e-4
    assert abs(p_rgb[1].item() - calculate_psnr(g_sr, g_gt, 3)) < 1e-4
    assert abs(s_rgb[0].item() - calculate_ssim(c_sr, c_gt, 3)) < 1e-6
    assert abs(s_rgb[1].item() - calculate_ssim(g_sr, g_gt, 3)) < 1e-6
    # Without the flag the replicated gray image would be measured through studio-swing Y instead.
    assert abs(psnr_torch(sr, gt, 3, True)[1].item() - p[1].item()) > 1e-3


def test_torch_metrics_identical_and_unflagged_defaults() -> None:
    x = torch.rand(2, 3, 24, 24)
    x = (x * 255).round() / 255
    assert torch.isinf(psnr_torch(x, x, 2)).all()
    assert torch.allclose(ssim_torch(x, x, 2, True), torch.ones(2))
    assert psnr_torch(x[0], x[0].flip(-1), 0).shape == (1,)  # CHW is one image
    one = x[:, :1]  # a 1-channel tensor is gray: its Y is itself
    other = x[:, 1:2]
    assert torch.allclose(psnr_torch(one, other, 2, True), psnr_torch(one, other, 2, False))
    assert torch.allclose(ssim_torch(one, other, 2, True), ssim_torch(one, other, 2, False))


def test_torch_metrics_do_not_sync_with_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("host sync inside a torch metric")

    sr = (torch.rand(2, 3, 32, 32) * 255).round() / 255
    gt = (torch.rand(2, 3, 32, 32) * 255).round() / 255
    gray = torch.tensor([False, True])
    for name in ("item", "tolist", "numpy", "__bool__", "__float__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, boom)
    p = psnr_torch(sr, gt, 2, True, gray)
    s = ssim_torch(sr, gt, 2, True, gray)
    q = psnr_torch(sr, gt, 2, False, gray)
    monkeypatch.undo()
    assert torch.isfinite(p).all() and torch.isfinite(s).all() and torch.isfinite(q).all()


def test_torch_metric_errors_name_the_problem() -> None:
    x = torch.zeros(1, 3, 16, 16)
    with pytest.raises(DataError, match=r"psnr_torch: expected two NCHW tensors of the same shape, got "
                                        r"\(1, 3, 16, 16\) and \(1, 3, 16, 15\)"):
        psnr_torch(x, x[..., :15])
    with pytest.raises(DataError, match=r"ssim_torch: crop_border=8 leaves nothing of a 16x16 image"):
        ssim_torch(x, x, 8)
    with pytest.raises(DataError, match=r"ssim_torch: a 10x10 image \(after crop_border\) is smaller "
                                        r"than the 11x11 window"):
        ssim_torch(x, x, 3)
    with pytest.raises(DataError, match=r"test_y_channel needs RGB tensors with 3 channels \(or 1 for "
                                        r"gray\), got 2"):
        psnr_torch(x[:, :2], x[:, :2], 0, True)
    with pytest.raises(OptionError, match=r"crop_border: must be >= 0, got -2"):
        psnr_torch(x, x, -2)
    with pytest.raises(DataError, match=r"psnr_torch: expected float tensors on \[0, 1\], got torch\.uint8 "
                                        r"and torch\.uint8; divide uint8 images by 255 first"):
        psnr_torch(x.to(torch.uint8), x.to(torch.uint8))


def test_half_precision_inputs_are_measured_in_float32() -> None:
    x = (torch.rand(1, 3, 24, 24) * 255).round() / 255
    y = (torch.rand(1, 3, 24, 24) * 255).round() / 255
    for fn in (psnr_torch, ssim_torch):
        ref = fn(x, y, 2, True)
        half = fn(x.to(torch.bfloat16), y.to(torch.bfloat16), 2, True)
        assert half.dtype == torch.float32
        assert torch.allclose(half, ref, atol=1e-6)  # bf16 keeps k/255 within 0.5/255: snapping is exact

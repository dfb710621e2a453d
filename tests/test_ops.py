"""MATLAB-exact bicubic imresize and colour conversions, checked against values derived by hand; the autocast-off
context."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from anysr.errors import DataError, OptionError
from anysr.ops.autocast import autocast_off
from anysr.ops.color import (
    bgr2ycbcr,
    full_range_luma,
    rgb2ycbcr,
    rgb2ycbcr_torch,
    to_y_channel,
    ycbcr2bgr,
    ycbcr2rgb,
)
from anysr.ops.imresize import cubic, imresize, imresize_torch, output_length, resize_taps, resize_weights

DATASETS = Path(__file__).resolve().parents[1] / "datasets"

# Keys' cubic (a = -0.5) at the quarter points used by x2 resizing: 0.25, 0.75, 1.25, 1.75.
K25, K75, K125, K175 = 0.8671875, 0.2265625, -0.0703125, -0.0234375


def _nchw(img: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).unsqueeze(0)


def _hwc(t: torch.Tensor) -> np.ndarray:
    return t[0].permute(1, 2, 0).detach().numpy()


# ------------------------------------------------------------------------------------------ imresize
def test_cubic_kernel_values() -> None:
    x = np.array([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, -0.5, -1.5])
    expected = [1.0, K25, 0.5625, K75, 0.0, K125, -0.0625, K175, 0.0, 0.0, 0.5625, -0.0625]
    assert np.allclose(cubic(x), expected, atol=0, rtol=0)


@pytest.mark.parametrize(("length", "scale", "expected"), [
    (10, 0.25, 3), (255, 1 / 3, 85), (7, 0.5, 4), (5, 2, 10), (33, 3, 99), (1, 0.25, 1), (512, 1 / 3, 171),
])
def test_output_length_is_matlab_ceil(length: int, scale: float, expected: int) -> None:
    assert output_length(length, scale) == expected
    assert resize_weights(length, scale).shape == (expected, length)


def test_upscale_x2_border_weights_use_symmetric_padding() -> None:
    w = resize_weights(6, 2)
    # Output 1 sits at input coordinate 0.75 (1-based): taps at 0 and -1 mirror onto pixels 1 and 2.
    assert np.allclose(w[0], [K75 + K25, K125 + K175, 0, 0, 0, 0], rtol=0, atol=1e-15)
    assert np.allclose(w[0], [1.09375, -0.09375, 0, 0, 0, 0], rtol=0, atol=1e-15)
    # Output 2 at 1.25: tap 0 mirrors onto pixel 1.
    assert np.allclose(w[1], [K125 + K25, K75, K175, 0, 0, 0], rtol=0, atol=1e-15)
    # The last row mirrors the first one (the grid is symmetric).
    assert np.allclose(w[-1], w[0][::-1], rtol=0, atol=1e-15)


def test_row_vector_x2_known_values() -> None:
    # imresize([10 20 30 40], 2), worked out by hand: output 3 sits at 1.75 and reads taps 0..3 with
    # weights K175, K75, K25, K125, tap 0 mirroring onto pixel 1 (10): -0.234375 + 2.265625 + 17.34375
    # - 2.109375 = 17.265625. Outputs 4 and 5 (at 2.25, 2.75) see no padding and lie on the ramp; the
    # second half mirrors the first (out[7 - i] = 50 - out[i]).
    row = np.array([[10.0, 20.0, 30.0, 40.0]])
    out = imresize(row, 2)
    expected = [9.0625, 11.796875, 17.265625, 22.5, 27.5, 32.734375, 38.203125, 40.9375]
    assert out.shape == (2, 8)
    assert np.allclose(out, [expected, expected], rtol=0, atol=1e-12)


def test_downscale_x2_interior_weights_match_the_stretched_kernel() -> None:
    # Antialiased x1/2: kernel 0.5 * cubic(x / 2) sampled at half-pixel offsets +-0.5, +-1.5, +-2.5, +-3.5.
    direct = 0.5 * np.array([K175, K125, K75, K25, K25, K75, K125, K175])
    rng = np.random.default_rng(0)
    x = rng.random(40)
    out = imresize(x[:, None], 0.5)[:, 0]
    assert out.shape == (20,)
    for i in range(2, 18):  # outputs whose support lies inside the signal
        assert out[i] == pytest.approx(float(direct @ x[2 * i - 3: 2 * i + 5]), abs=1e-13)
    src, w = resize_taps(40, 0.5)
    assert np.allclose(w[5], direct, rtol=0, atol=1e-15)
    assert list(src[5]) == list(range(7, 15))


@pytest.mark.parametrize("scale", [2, 3, 4, 0.5, 1 / 3, 0.25, 0.7, 1.5])
def test_weights_sum_to_one_and_indices_stay_inside(scale: float) -> None:
    for n in (1, 2, 5, 17, 64):
        src, w = resize_taps(n, scale)
        assert np.allclose(w.sum(axis=1), 1.0, rtol=0, atol=1e-12)
        assert src.min() >= 0 and src.max() < n
        assert np.allclose(resize_weights(n, scale).sum(axis=1), 1.0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("scale", [2, 3, 4, 0.5, 1 / 3, 0.25])
def test_constant_image_stays_constant(scale: float) -> None:
    img = np.full((13, 19, 3), 77, dtype=np.uint8)
    out = imresize(img, scale)
    assert out.dtype == np.float64
    assert np.allclose(out, 77.0, rtol=0, atol=1e-10)


def test_upscaling_reproduces_quadratics_in_the_interior() -> None:
    # Keys' kernel with a = -0.5 is exact for polynomials up to degree 2 (away from the mirrored borders).
    n = 24
    t = np.arange(1, n + 1, dtype=np.float64)
    signal = 0.3 * t**2 - 2.0 * t + 5.0
    out = imresize(signal[:, None], 2)[:, 0]
    u = np.arange(1, 2 * n + 1) / 2 + 0.25  # MATLAB's output centres in input coordinates (1-based)
    inside = slice(6, 2 * n - 6)
    assert np.allclose(out[inside], (0.3 * u**2 - 2.0 * u + 5.0)[inside], rtol=0, atol=1e-10)


def test_scale_one_is_identity() -> None:
    img = np.random.default_rng(1).random((9, 7, 3))
    assert np.allclose(imresize(img, 1), img, rtol=0, atol=1e-15)


def test_dtypes_shapes_and_value_range() -> None:
    rng = np.random.default_rng(2)
    u8 = rng.integers(0, 256, (16, 12, 3), dtype=np.uint8)
    out = imresize(u8, 0.5)
    assert out.shape == (8, 6, 3) and out.dtype == np.float64
    assert np.allclose(out, imresize(u8.astype(np.float64), 0.5))
    f32 = u8.astype(np.float32) / 255
    out32 = imresize(f32, 0.5)
    assert out32.dtype == np.float32
    assert np.allclose(out32 * 255, out, atol=1e-3)
    gray = u8[..., 0]
    assert imresize(gray, 3).shape == (48, 36)
    assert np.allclose(imresize(gray, 3), imresize(u8, 3)[..., 0])
    # Not rounded, not clipped: overshoot near edges survives.
    step = np.zeros((8, 8), dtype=np.uint8)
    step[:, 4:] = 255
    up = imresize(step, 2)
    assert up.max() > 255 and up.min() < 0


@pytest.mark.parametrize("scale", [2, 3, 4, 0.5, 1 / 3, 0.25])
def test_torch_matches_numpy(scale: float) -> None:
    rng = np.random.default_rng(3)
    img = rng.random((23, 17, 3)).astype(np.float32)
    ref = imresize(img.astype(np.float64), scale)
    out = imresize_torch(_nchw(img), scale)
    assert out.dtype == torch.float32
    assert np.abs(_hwc(out) - ref).max() < 1e-5
    chw = imresize_torch(_nchw(img)[0], scale)
    assert chw.dim() == 3 and torch.equal(chw, out[0])


def test_torch_on_a_real_image_and_integer_input() -> None:
    hr = cv2.imread(str(DATASETS / "Set5" / "HR" / "butterfly.png"), cv2.IMREAD_UNCHANGED)
    ref = imresize(hr, 0.25)
    out = imresize_torch(_nchw(hr).float() / 255, 0.25)
    assert np.abs(_hwc(out) * 255 - ref).max() < 255 * 1e-5
    as_int = imresize_torch(_nchw(hr), 0.25)  # uint8 tensor: computed in float32 on the 0-255 scale
    assert as_int.dtype == torch.float32
    assert np.abs(_hwc(as_int) - ref).max() < 1e-3


def test_torch_is_differentiable() -> None:
    x = torch.rand(1, 2, 6, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: imresize_torch(t, 0.5), (x,))
    assert torch.autograd.gradcheck(lambda t: imresize_torch(t, 2), (x,))


def test_imresize_is_fast_on_512() -> None:
    img = np.random.default_rng(4).random((512, 512, 3)).astype(np.float32)
    start = time.perf_counter()
    imresize(img, 0.5)
    imresize(img, 1 / 3)
    imresize_torch(_nchw(img), 0.25)
    assert time.perf_counter() - start < 5.0


def test_imresize_errors_name_the_culprit() -> None:
    with pytest.raises(OptionError, match=r"scale: imresize needs a positive finite scale factor, got 0"):
        imresize(np.zeros((4, 4)), 0)
    with pytest.raises(OptionError, match=r"scale: .*got nan"):
        imresize_torch(torch.zeros(1, 1, 4, 4), float("nan"))
    with pytest.raises(DataError, match=r"imresize: expected an HW or HWC image, got shape \(1, 4, 4, 3\)"):
        imresize(np.zeros((1, 4, 4, 3)), 2)
    with pytest.raises(DataError, match=r"imresize_torch: expected an NCHW or CHW tensor, got shape \(4,"):
        imresize_torch(torch.zeros(4, 4), 2)
    with pytest.raises(DataError, match=r"cannot resize an image axis of length 0"):
        resize_weights(0, 2)


# --------------------------------------------------------------------------------------------- colour
def test_rgb2ycbcr_known_values() -> None:
    px = np.array([[[255, 255, 255], [0, 0, 0], [255, 0, 0], [0, 255, 0], [0, 0, 255]]], dtype=np.uint8)
    ycc = rgb2ycbcr(px)
    assert ycc.dtype == np.uint8
    # white, black, red, green, blue from MATLAB's matrix: Y = 16 + 65.481 R + 128.553 G + 24.966 B, etc.
    assert ycc[0].tolist() == [[235, 128, 128], [16, 128, 128], [81, 90, 240], [145, 54, 34], [41, 240, 110]]
    y = rgb2ycbcr(px.astype(np.float32) / 255, y_only=True)
    assert y.dtype == np.float32 and y.shape == (1, 5)
    assert np.allclose(y * 255, [235.0, 16.0, 81.481, 144.553, 40.966], atol=1e-4)


def test_bgr_variants_and_round_trips() -> None:
    rng = np.random.default_rng(5)
    rgb = rng.random((6, 7, 3))
    assert np.allclose(bgr2ycbcr(rgb[..., ::-1]), rgb2ycbcr(rgb))
    assert np.allclose(bgr2ycbcr(rgb[..., ::-1], y_only=True), rgb2ycbcr(rgb, y_only=True))
    assert np.allclose(ycbcr2rgb(rgb2ycbcr(rgb)), rgb, atol=1e-12)
    assert np.allclose(ycbcr2bgr(rgb2ycbcr(rgb)), rgb[..., ::-1], atol=1e-12)
    u8 = rng.integers(0, 256, (6, 7, 3), dtype=np.uint8)
    back = ycbcr2rgb(rgb2ycbcr(u8)).astype(int)
    assert np.abs(back - u8).max() <= 2  # two uint8 roundings on the way


def test_to_y_channel_gray_is_its_own_y() -> None:
    gray = np.array([[0, 17], [128, 255]], dtype=np.uint8)
    y = to_y_channel(gray)
    assert y.dtype == np.float64 and y.tolist() == [[0.0, 17.0], [128.0, 255.0]]
    assert to_y_channel(gray[..., None]).tolist() == y.tolist()
    bgr = np.stack([gray] * 3, axis=-1)
    y3 = to_y_channel(bgr)
    # A colour image goes through studio-swing Y (16-235), unrounded.
    assert np.allclose(y3, 16 + gray * (65.481 + 128.553 + 24.966) / 255, atol=1e-9)
    assert np.allclose(full_range_luma(bgr), gray, atol=1e-9)


def test_rgb2ycbcr_torch_matches_numpy() -> None:
    rng = np.random.default_rng(6)
    rgb = rng.random((5, 4, 3)).astype(np.float32)
    t = _nchw(rgb)
    assert np.allclose(_hwc(rgb2ycbcr_torch(t, y_only=False)), rgb2ycbcr(rgb), atol=1e-6)
    y = rgb2ycbcr_torch(t)
    assert y.shape == (1, 1, 5, 4)
    assert np.allclose(y[0, 0].numpy(), rgb2ycbcr(rgb, y_only=True), atol=1e-6)
    assert rgb2ycbcr_torch(t[0]).shape == (1, 5, 4)


def test_colour_errors_name_the_problem() -> None:
    with pytest.raises(DataError, match=r"rgb2ycbcr: expected a uint8 image or a float image in \[0, 1\], "
                                        r"got dtype uint16; convert it"):
        rgb2ycbcr(np.zeros((2, 2, 3), dtype=np.uint16))
    with pytest.raises(DataError, match=r"bgr2ycbcr: expected an HWC image with 3 channels, got shape \(2,"):
        bgr2ycbcr(np.zeros((2, 2), dtype=np.uint8))
    with pytest.raises(DataError, match=r"to_y_channel: expected an HWC image with 3 channels, got shape"):
        to_y_channel(np.zeros((2, 2, 4), dtype=np.uint8))
    with pytest.raises(DataError, match=r"rgb2ycbcr_torch: expected an NCHW or CHW RGB tensor, got shape"):
        rgb2ycbcr_torch(torch.zeros(1, 1, 4, 4))


# ----------------------------------------------------------------------------- autocast_off

def test_autocast_off_keeps_the_inputs_dtype_under_autocast() -> None:
    a = torch.rand(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.bfloat16
        for where in (a, a.device, "cpu"):  # a tensor, a device or a device type
            with autocast_off(where):
                assert not torch.is_autocast_enabled("cpu")
                assert (a @ a).dtype == torch.float32
            assert torch.is_autocast_enabled("cpu")


def test_autocast_off_is_a_no_op_without_autocast_or_where_there_is_none() -> None:
    assert isinstance(autocast_off(torch.zeros(1)), contextlib.nullcontext)  # autocast not on
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert isinstance(autocast_off(torch.zeros(1, device="meta")), contextlib.nullcontext)  # 'meta' has none
        assert isinstance(autocast_off("cpu"), torch.autocast)

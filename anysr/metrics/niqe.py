"""NIQE (Natural Image Quality Evaluator), the no-reference score of Mittal, Soundararajan and Bovik (2012).

Numbers equal BasicSR 1.4.2's ``calculate_niqe`` (itself a port of the official MATLAB release) to about 1e-12
on the bundled Set5 / Set14 images: BasicSR works in float32, and its roundings are reproduced where they
matter (the grid search for the AGGD shapes turns an ulp into a 1e-3 change). Lower is better. Per image:

1. the Y channel of MATLAB's BT.601 ``rgb2ycbcr`` (or the full-range gray level), rounded to integers;
2. crop to whole 96 x 96 blocks;
3. at two scales (the image, then its MATLAB-bicubic half): MSCN coefficients
   ``(I - mu) / (sigma + 1)`` with a 7 x 7 Gaussian local mean / deviation (edge pixels replicated), and per
   block 18 features from asymmetric generalised Gaussian fits of the coefficients and of their products with
   the four neighbours (right, below, diagonal, anti-diagonal; wrapping round the block);
4. a multivariate Gaussian fitted to the 36-d block features, compared with the pristine model shipped in
   ``anysr/metrics/data/niqe_pris_params.npz``:
   ``sqrt((mu_p - mu_d)^T pinv((C_p + C_d) / 2) (mu_p - mu_d))``.

Everything is numpy (and OpenCV for the gray conversion); no scipy.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from anysr.errors import DataError, OptionError
from anysr.metrics.info import NIQE_INFO
from anysr.ops.imresize import resize_taps

__all__ = ["calculate_niqe", "niqe", "niqe_features", "pristine_params", "METRIC_INFO", "BETTER"]

METRIC_INFO = NIQE_INFO
BETTER = METRIC_INFO.better

BLOCK_SIZE = 96
_DATA = Path(__file__).resolve().parent / "data" / "niqe_pris_params.npz"
# Neighbour offsets (rows, columns) of the pairwise products: right, below, down-right, down-left.
_NEIGHBOURS = ((0, 1), (1, 0), (1, 1), (1, -1))


@lru_cache(maxsize=1)
def pristine_params() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pristine model ``(mu (1, 36), cov (36, 36), gaussian window (7, 7))``, float64, read-only."""
    if not _DATA.is_file():
        raise DataError(f"NIQE pristine parameters missing: {_DATA}; reinstall anysr (package data)")
    with np.load(_DATA) as npz:
        out = tuple(np.array(npz[k], dtype=np.float64) for k in ("mu_pris_param", "cov_pris_param",
                                                                  "gaussian_window"))
    for a in out:
        a.setflags(write=False)
    return out  # type: ignore[return-value]


@lru_cache(maxsize=1)
def _shape_table() -> tuple[np.ndarray, np.ndarray]:
    """Candidate AGGD shapes 0.2, 0.201, ..., 10 and their ratio Gamma(2/a)^2 / (Gamma(1/a) Gamma(3/a))."""
    shapes = np.arange(0.2, 10.001, 0.001)
    inv = np.reciprocal(shapes)
    gamma = np.vectorize(math.gamma, otypes=[np.float64])
    ratio = gamma(inv * 2.0) ** 2 / (gamma(inv) * gamma(inv * 3.0))
    shapes.setflags(write=False)
    ratio.setflags(write=False)
    return shapes, ratio


def _side_std(values: np.ndarray) -> np.floating:
    if not values.size:
        return np.float32(np.nan)
    return np.sqrt(np.mean(values * values))


def _aggd_fit(x: np.ndarray) -> tuple[float, float, float]:
    """Moment-matching fit of an asymmetric generalised Gaussian: ``(shape, left scale, right scale)``.

    ``x`` is float32 and the moments are float32 (numpy's pairwise sums), as in BasicSR: the shape is a
    grid search, and a moment rounded differently can move it by one grid step. A sample without negative
    (or positive) values gives NaN scales and the first grid shape, as the MATLAB code does.
    """
    x = x.ravel()
    std_l = _side_std(x[x < 0])
    std_r = _side_std(x[x > 0])
    with np.errstate(divide="ignore", invalid="ignore"):
        g = std_l / std_r
        r_hat = np.mean(np.abs(x)) ** 2 / np.mean(x * x)
        r_norm = r_hat * (g ** 3 + 1) * (g + 1) / (g ** 2 + 1) ** 2
    shapes, ratio = _shape_table()
    # An all-NaN distance vector selects index 0 (numpy's argmin and MATLAB's min agree there).
    pos = 0 if np.isnan(r_norm) else int(np.argmin((ratio - r_norm) ** 2))
    alpha = float(shapes[pos])
    k = math.sqrt(math.gamma(1.0 / alpha) / math.gamma(3.0 / alpha))
    return alpha, float(std_l) * k, float(std_r) * k


def _block_features(block: np.ndarray) -> list[float]:
    """The 18 NIQE features of one block of (float32) MSCN coefficients."""
    alpha, bl, br = _aggd_fit(block)
    feats = [alpha, (bl + br) / 2.0]
    for shift in _NEIGHBOURS:
        prod = block * np.roll(block, shift, axis=(0, 1))
        alpha, bl, br = _aggd_fit(prod)
        mean = (br - bl) * math.gamma(2.0 / alpha) / math.gamma(1.0 / alpha)
        feats += [alpha, mean, bl, br]
    return feats


def _filter_replicate(img: np.ndarray, window: np.ndarray) -> np.ndarray:
    """``img`` convolved with ``window`` (odd size) in float64, borders extended by repeating the edge pixels."""
    kh, kw = window.shape
    rh, rw = kh // 2, kw // 2
    padded = np.pad(np.asarray(img, dtype=np.float64), ((rh, rh), (rw, rw)), mode="edge")
    flipped = window[::-1, ::-1]
    h, w = img.shape
    out = np.zeros((h, w), dtype=np.float64)
    for i in range(kh):
        for j in range(kw):
            out += flipped[i, j] * padded[i:i + h, j:j + w]
    return out


def _mscn(img: np.ndarray, window: np.ndarray) -> np.ndarray:
    """Mean-subtracted contrast-normalised coefficients of a float32 image.

    The local moments are rounded to float32 before ``E[x^2] - E[x]^2`` is formed in float32, as BasicSR
    does (scipy filters a float32 image into a float32 result): in smooth regions that cancellation decides
    the local deviation, and so the features, to the third digit.
    """
    x = np.asarray(img, dtype=np.float32)
    mu = _filter_replicate(x, window).astype(np.float32)
    second = _filter_replicate(x * x, window).astype(np.float32)
    sigma = np.sqrt(np.abs(second - mu * mu))
    return (x - mu) / (sigma + np.float32(1.0))


def _half_size(img: np.ndarray) -> np.ndarray:
    """MATLAB ``imresize(img, 0.5)`` of a float32 image, rounded as BasicSR's float32 torch version rounds.

    The taps are ``anysr.ops.imresize``'s (mirrored indices, normalised bicubic weights) cast to float32;
    each output row, then each output column, is one float32 matrix-vector product, so the sums are rounded
    as in BasicSR (a float64 resize rounded once differs by an ulp in about half the pixels, and that is
    enough to move the grid search of a few AGGD shapes by one step).
    """
    x = torch.from_numpy(np.ascontiguousarray(img, dtype=np.float32))
    rows_src, rows_w = resize_taps(x.shape[0], 0.5)
    cols_src, cols_w = resize_taps(x.shape[1], 0.5)
    rs, rw = torch.from_numpy(np.array(rows_src)), torch.from_numpy(np.array(rows_w, dtype=np.float32))
    cs, cw = torch.from_numpy(np.array(cols_src)), torch.from_numpy(np.array(cols_w, dtype=np.float32))
    with torch.no_grad():
        half_h = torch.stack([x[rs[i]].t().mv(rw[i]) for i in range(rs.shape[0])])
        out = torch.stack([half_h[:, cs[j]].mv(cw[j]) for j in range(cs.shape[0])], dim=1)
    return out.numpy()


def niqe_features(img: np.ndarray, window: np.ndarray, block_size_h: int = BLOCK_SIZE,
                  block_size_w: int = BLOCK_SIZE) -> np.ndarray:
    """Per-block features ``(num_blocks, 36)`` of a 2-D image on the 0-255 scale (scale 1, then scale 1/2)."""
    nbh, nbw = img.shape[0] // block_size_h, img.shape[1] // block_size_w
    x = np.asarray(img, dtype=np.float32)[:nbh * block_size_h, :nbw * block_size_w]
    per_scale = []
    for scale in (1, 2):
        coeffs = _mscn(x, window)
        bh, bw = block_size_h // scale, block_size_w // scale
        # Blocks column by column (MATLAB's order).
        per_scale.append(np.array([_block_features(coeffs[r * bh:(r + 1) * bh, c * bw:(c + 1) * bw])
                                   for c in range(nbw) for r in range(nbh)], dtype=np.float64))
        if scale == 1:
            x = _half_size(x / np.float32(255.0)) * np.float32(255.0)
    return np.concatenate(per_scale, axis=1)


def niqe(img: np.ndarray, mu_pris_param: np.ndarray, cov_pris_param: np.ndarray, gaussian_window: np.ndarray,
         block_size_h: int = BLOCK_SIZE, block_size_w: int = BLOCK_SIZE) -> float:
    """NIQE of a 2-D (gray or Y) image on the 0-255 scale against the given pristine model.

    The image is taken in float32 (``calculate_niqe`` hands over integers, which float32 holds exactly).
    """
    arr = np.asarray(img)
    if arr.ndim != 2:
        raise DataError(f"niqe: expected a 2-D gray or Y image, got shape {arr.shape}")
    nbh, nbw = arr.shape[0] // block_size_h, arr.shape[1] // block_size_w
    if nbh * nbw < 2:
        raise DataError(f"niqe: a {arr.shape[0]}x{arr.shape[1]} image holds {nbh * nbw} whole "
                        f"{block_size_h}x{block_size_w} block(s); NIQE needs at least two (e.g. "
                        f"{2 * block_size_h}x{block_size_w}): use a larger image or a smaller crop_border")
    feats = niqe_features(arr, np.asarray(gaussian_window, dtype=np.float64), block_size_h, block_size_w)
    mu_d = np.nanmean(feats, axis=0)
    complete = feats[~np.isnan(feats).any(axis=1)]
    if complete.shape[0] < 2:
        raise DataError(f"niqe: fewer than two blocks of the {arr.shape[0]}x{arr.shape[1]} image have finite "
                        "features (flat regions); NIQE is undefined for it")
    cov_d = np.cov(complete, rowvar=False)
    diff = np.asarray(mu_pris_param, dtype=np.float64).reshape(-1) - mu_d
    inv = np.linalg.pinv((np.asarray(cov_pris_param, dtype=np.float64) + cov_d) / 2.0)
    return float(math.sqrt(float(diff @ inv @ diff)))


def _to_plane(img: np.ndarray, input_order: str, convert_to: str) -> np.ndarray:
    arr = np.asarray(img)
    if input_order == "HW":
        if arr.ndim != 2:
            raise DataError(f"calculate_niqe: input_order 'HW' needs a 2-D image, got shape {arr.shape}")
        return arr.astype(np.float32)
    if input_order not in ("HWC", "CHW"):
        raise OptionError(f"input_order: must be 'HWC', 'CHW' or 'HW', got {input_order!r}")
    if convert_to not in ("y", "gray"):
        raise OptionError(f"convert_to: must be 'y' or 'gray', got {convert_to!r}")
    if arr.ndim == 2:
        return arr.astype(np.float32)
    if arr.ndim != 3:
        raise DataError(f"calculate_niqe: expected an HWC, CHW or 2-D image, got shape {arr.shape}")
    if input_order == "CHW":
        arr = arr.transpose(1, 2, 0)
    if arr.shape[2] == 1:
        return arr[..., 0].astype(np.float32)
    if arr.shape[2] != 3:
        raise DataError(f"calculate_niqe: expected 1 or 3 channels (BGR), got shape {arr.shape}")
    unit = arr.astype(np.float32) / np.float32(255.0)
    if convert_to == "gray":
        return cv2.cvtColor(unit, cv2.COLOR_BGR2GRAY) * np.float32(255.0)
    # MATLAB's Y; the float32 steps keep the later rounding to integers identical to BasicSR's.
    y = (unit @ np.array([24.966, 128.553, 65.481]) + 16.0) / 255.0
    return y.astype(np.float32) * np.float32(255.0)


def calculate_niqe(img: np.ndarray, crop_border: int, input_order: str = "HWC", convert_to: str = "y",
                   **kwargs: Any) -> float:
    """NIQE of one image (lower is better), BasicSR's ``calculate_niqe``.

    ``img``: uint8-range (0-255) BGR image, HWC or CHW, or a 2-D gray image (``input_order='HW'`` takes a
    2-D image as it is). ``convert_to``: ``'y'`` (MATLAB BT.601 luma) or ``'gray'`` (OpenCV's full-range
    gray). ``crop_border`` pixels are shaved from each edge first. Needs at least two whole 96 x 96 blocks.
    """
    plane = _to_plane(img, input_order, convert_to)
    cb = int(crop_border)
    if cb < 0:
        raise OptionError(f"crop_border: must be >= 0, got {crop_border}")
    if cb:
        if plane.shape[0] <= 2 * cb or plane.shape[1] <= 2 * cb:
            raise DataError(f"calculate_niqe: crop_border={cb} leaves nothing of a {plane.shape[0]}x"
                            f"{plane.shape[1]} image; lower crop_border")
        plane = plane[cb:-cb, cb:-cb]
    mu, cov, window = pristine_params()
    return niqe(np.round(plane).astype(np.float64), mu, cov, window)

"""Tensor operators of BSRGAN-style blind degradations (Zhang et al. 2021; KAIR's ``utils_blindsr.py``).

Each equals the numpy / OpenCV / SciPy operation KAIR calls, to float tolerance, on (..., C, H, W) float tensors:

* :func:`resize_cv2`: ``cv2.resize`` of a float image with ``INTER_LINEAR``, ``INTER_CUBIC`` or ``INTER_AREA``
  (OpenCV's own coefficient tables, applied as two matrix products; no antialiasing where OpenCV has none).
* :func:`convolve_mirror`: ``scipy.ndimage.convolve(img, k[..., None], mode='mirror')`` (a true convolution,
  borders mirrored without repeating the edge, any border width).
* :func:`gaussian_noise_3ch`, :func:`speckle_noise_3ch`: additive / multiplicative Gaussian noise whose 3 channels
  are ``field @ transform`` (colour: sigma times the identity; gray: one field for every channel; correlated: the
  3x3 transform ``numpy.random.multivariate_normal`` uses), clipped to [0, 1].
* :func:`poisson_noise_kair`: KAIR's ``add_Poisson_noise`` (8-bit levels first, colour or luma Poisson noise).

Random fields come from a :class:`NoiseFields` (a ``torch.Generator`` behind :class:`GeneratorFields`), so the
same seed gives the same fields on every machine; tests replay a reference's fields through the same interface.
What the operators are called with is decided in :mod:`anysr.data.degradation.bsrgan`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from anysr.errors import DataError

__all__ = ["CV2_MODES", "cv2_resize_matrix", "resize_cv2", "mirror_indices", "convolve_mirror", "NoiseFields",
           "GeneratorFields", "gaussian_noise_3ch", "speckle_noise_3ch", "poisson_noise_kair", "LUMA_RGB"]

CV2_MODES = ("linear", "cubic", "area")  # cv2.INTER_LINEAR (1), INTER_CUBIC (2), INTER_AREA (3)
LUMA_RGB = (0.299, 0.587, 0.114)  # KAIR's add_Poisson_noise gray weights (RGB order)
_CUBIC_A = -0.75  # OpenCV's bicubic coefficient


# ------------------------------------------------------------------------------------------- cv2.resize
def _linear_taps(n_in: int, n_out: int, scale: float, area_mode: bool) -> tuple[np.ndarray, np.ndarray]:
    dx = np.arange(n_out, dtype=np.float64)
    if area_mode:  # INTER_AREA when enlarging: OpenCV's bilinear variant
        sx = np.floor(dx * scale)
        fx = (dx + 1) - (sx + 1) * (n_out / n_in)
        fx = np.where(fx <= 0, 0.0, fx - np.floor(fx))
    else:
        f = ((dx + 0.5) * scale - 0.5).astype(np.float32).astype(np.float64)
        sx = np.floor(f)
        fx = f - sx
    idx = np.stack([sx, sx + 1], 1).astype(np.int64)
    return idx, np.stack([1 - fx, fx], 1)


def _cubic_taps(n_out: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    dx = np.arange(n_out, dtype=np.float64)
    f = ((dx + 0.5) * scale - 0.5).astype(np.float32).astype(np.float64)
    sx = np.floor(f)
    x = f - sx
    a = _CUBIC_A
    w0 = ((a * (x + 1) - 5 * a) * (x + 1) + 8 * a) * (x + 1) - 4 * a
    w1 = ((a + 2) * x - (a + 3)) * x * x + 1
    w2 = ((a + 2) * (1 - x) - (a + 3)) * (1 - x) * (1 - x) + 1
    idx = np.stack([sx - 1, sx, sx + 1, sx + 2], 1).astype(np.int64)
    return idx, np.stack([w0, w1, w2, 1 - w0 - w1 - w2], 1)


def _area_matrix(n_in: int, n_out: int, scale: float) -> np.ndarray:
    m = np.zeros((n_out, n_in))
    for d in range(n_out):  # OpenCV's computeResizeAreaTab
        f1 = d * scale
        f2 = f1 + scale
        cell = min(scale, n_in - f1)
        s2 = min(math.floor(f2), n_in - 1)
        s1 = min(math.ceil(f1), s2)
        if s1 - f1 > 1e-3:
            m[d, s1 - 1] += (s1 - f1) / cell
        m[d, s1:s2] += 1.0 / cell
        if f2 - s2 > 1e-3:
            m[d, s2] += min(f2 - s2, 1.0, cell) / cell
    return m


@functools.lru_cache(maxsize=256)
def cv2_resize_matrix(n_in: int, n_out: int, mode: str, area_down: bool = True) -> np.ndarray:
    """The (n_out, n_in) float64 matrix of one axis of ``cv2.resize`` (``mode`` in :data:`CV2_MODES`).

    ``area_down``: for ``area``, whether OpenCV uses its box-area tables (both axes shrink or keep their size);
    otherwise it uses its bilinear variant for enlarging on both axes.
    """
    if mode not in CV2_MODES:
        raise DataError(f"resize_cv2: unknown mode {mode!r}; choose from {', '.join(CV2_MODES)}")
    if n_in < 1 or n_out < 1:
        raise DataError(f"resize_cv2: sizes must be >= 1, got {n_in} -> {n_out}")
    scale = 1.0 / (n_out / n_in)
    if mode == "area" and area_down:
        return _area_matrix(n_in, n_out, scale)
    idx, w = _cubic_taps(n_out, scale) if mode == "cubic" else _linear_taps(n_in, n_out, scale, mode == "area")
    m = np.zeros((n_out, n_in))
    np.add.at(m, (np.repeat(np.arange(n_out), idx.shape[1]), np.clip(idx, 0, n_in - 1).ravel()), w.ravel())
    return m


def resize_cv2(x: Tensor, size: tuple[int, int], mode: str) -> Tensor:
    """``cv2.resize`` of a float (..., C, H, W) tensor to ``size`` = (H', W') with ``mode`` (linear, cubic, area).

    OpenCV copies an image resized to its own size; so does this. No clipping (cubic overshoots as OpenCV's)."""
    h, w = (int(v) for v in x.shape[-2:])
    oh, ow = (int(v) for v in size)
    if (oh, ow) == (h, w):
        return x.clone()
    area_down = oh <= h and ow <= w
    my = torch.from_numpy(cv2_resize_matrix(h, oh, mode, area_down)).to(device=x.device, dtype=x.dtype)
    mx = torch.from_numpy(cv2_resize_matrix(w, ow, mode, area_down)).to(device=x.device, dtype=x.dtype)
    return torch.matmul(torch.matmul(my, x), mx.t())


# ------------------------------------------------------------------------------------------- convolution
def mirror_indices(n: int, pad: int) -> np.ndarray:
    """Source indices of ``range(-pad, n + pad)`` under SciPy's ``mirror`` extension (d c b | a b c d | c b a)."""
    i = np.arange(-pad, n + pad)
    if n == 1:
        return np.zeros_like(i)
    period = 2 * (n - 1)
    j = np.mod(i, period)
    return np.where(j >= n, period - j, j)


def convolve_mirror(x: Tensor, kernel: np.ndarray | Tensor) -> Tensor:
    """``scipy.ndimage.convolve`` of every channel of a (..., C, H, W) tensor with the odd 2-D ``kernel``,
    ``mode='mirror'`` (for any border width, so small images are fine). Same shape out."""
    k = torch.as_tensor(np.ascontiguousarray(kernel) if isinstance(kernel, np.ndarray) else kernel)
    if k.dim() != 2 or k.shape[0] % 2 == 0 or k.shape[1] % 2 == 0:
        raise DataError(f"convolve_mirror: expected an odd 2-D kernel, got shape {tuple(k.shape)}")
    kh, kw = k.shape
    lead, (h, w) = x.shape[:-2], x.shape[-2:]
    planes = x.reshape(1, -1, h, w)
    rows = torch.from_numpy(mirror_indices(h, kh // 2)).to(x.device)
    cols = torch.from_numpy(mirror_indices(w, kw // 2)).to(x.device)
    padded = planes.index_select(2, rows).index_select(3, cols)
    weight = torch.flip(k, (0, 1)).to(device=x.device, dtype=x.dtype)  # convolution = correlation, flipped
    weight = weight.reshape(1, 1, kh, kw).expand(planes.shape[1], 1, kh, kw)
    out = F.conv2d(padded, weight, groups=planes.shape[1])
    return out.reshape(*lead, h, w)


# ------------------------------------------------------------------------------------------------- noise
class NoiseFields(Protocol):
    """Where the random fields come from: standard normal fields of a shape, Poisson counts of given rates."""

    def normal(self, shape: Sequence[int]) -> Tensor: ...

    def poisson(self, rate: Tensor) -> Tensor: ...


class GeneratorFields:
    """:class:`NoiseFields` from one ``torch.Generator`` (CPU): the same seed gives the same fields anywhere."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def normal(self, shape: Sequence[int]) -> Tensor:
        return torch.randn(tuple(int(v) for v in shape), generator=self.generator, dtype=torch.float64)

    def poisson(self, rate: Tensor) -> Tensor:
        return torch.poisson(rate.to(torch.float64), generator=self.generator)


def _field_3ch(x: Tensor, fields: NoiseFields, sigma: float, gray: bool, transform: np.ndarray | None) -> Tensor:
    if x.shape[-3] != 3:
        raise DataError(f"BSRGAN noise expects 3 channels, got shape {tuple(x.shape)}")
    h, w = x.shape[-2:]
    if transform is not None:  # correlated: rows of z (H*W, 3) times the 3x3 transform
        z = fields.normal((h, w, 3))
        t = torch.from_numpy(np.asarray(transform, dtype=np.float64))
        noise = (z @ t).permute(2, 0, 1)
    elif gray:
        noise = float(sigma) * fields.normal((h, w, 1)).permute(2, 0, 1)
    else:
        noise = float(sigma) * fields.normal((h, w, 3)).permute(2, 0, 1)
    return noise.to(torch.float32).to(device=x.device, dtype=x.dtype)


def gaussian_noise_3ch(x: Tensor, fields: NoiseFields, *, sigma: float, gray: bool = False,
                       transform: np.ndarray | None = None) -> Tensor:
    """KAIR's ``add_Gaussian_noise`` with its draws given: ``x + noise`` clipped to [0, 1], for a (3, H, W) image.

    ``transform`` (3x3) gives correlated colour noise (``field @ transform``); else ``gray`` (one field for the
    three channels) or colour noise of std ``sigma`` (0-1 scale). The noise is rounded to float32 as KAIR's."""
    return (x + _field_3ch(x, fields, sigma, gray, transform)).clamp(0, 1)


def speckle_noise_3ch(x: Tensor, fields: NoiseFields, *, sigma: float, gray: bool = False,
                      transform: np.ndarray | None = None) -> Tensor:
    """KAIR's ``add_speckle_noise``: ``x + x * noise`` (x clipped first), clipped to [0, 1]; noise as
    :func:`gaussian_noise_3ch`."""
    x = x.clamp(0, 1)
    return (x + x * _field_3ch(x, fields, sigma, gray, transform)).clamp(0, 1)


def poisson_noise_kair(x: Tensor, fields: NoiseFields, *, vals: float, gray: bool) -> Tensor:
    """KAIR's ``add_Poisson_noise`` for a (3, H, W) RGB image: rounded to 8-bit levels, then Poisson counts of
    rate ``level * vals`` divided by ``vals`` (colour), or the luma's Poisson noise added to every channel (gray);
    clipped to [0, 1]."""
    q = (x.to(torch.float64) * 255.0).round().clamp(0, 255) / 255.0
    if not gray:
        out = (fields.poisson((q * vals).cpu()).to(torch.float32).to(torch.float64) / vals)
    else:
        luma = torch.tensor(LUMA_RGB, dtype=torch.float64, device=q.device).reshape(3, 1, 1)
        g = ((q * luma).sum(-3, keepdim=True) * 255.0).round().clamp(0, 255) / 255.0
        counts = fields.poisson((g * vals).cpu()).to(torch.float32).to(torch.float64)
        out = q + (counts.to(q.device) / vals - g)
    return out.to(q.device).clamp(0, 1).to(x.dtype)

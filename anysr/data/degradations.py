"""Degradations that make a low-quality input from a ground-truth image on the fly.

Two families live here, both numpy and both run in the data-loader workers:

* ``bicubic_degrade*``: MATLAB bicubic downscaling for the classic paired setting.
* Real-ESRGAN's blur kernels (Wang et al. 2021, as BasicSR 1.4.2 defines them): isotropic / anisotropic
  Gaussian, generalized Gaussian, plateau, the circular low-pass ("sinc") kernel, their random mixture, and
  ``sample_degradation_kernels``, the per-sample draw of ``RealESRGANDataset`` (first-order kernel,
  second-order kernel, final sinc kernel). OpenCV JPEG (``jpeg_cv2``) is the real codec for workers.

The torch operators a model runs on the device (per-sample filtering, USM, noise, resize, DiffJPEG and the
whole second-order pipeline) are in :mod:`anysr.ops.degrade` and :mod:`anysr.ops.diffjpeg`.

Randomness comes only from the ``numpy.random.Generator`` passed in (a per-sample, counter-based one in the
dataset), never from the global RNGs, so a sample depends on nothing but its generator. Draws follow
BasicSR's order and meaning, so the distributions are BasicSR's.

BasicSR option keys (``datasets.train``) and where they go:

============================================  =================================================================
``kernel_list`` / ``kernel_list2``            ``BlurSettings.kernel_list`` of ``first`` / ``second``
``kernel_prob`` / ``kernel_prob2``            ``BlurSettings.kernel_prob``
``blur_sigma`` / ``blur_sigma2``              ``BlurSettings.blur_sigma`` (sigma_x and sigma_y range)
``betag_range`` / ``betag_range2``            ``BlurSettings.betag_range`` (generalized Gaussian shape)
``betap_range`` / ``betap_range2``            ``BlurSettings.betap_range`` (plateau shape)
``sinc_prob`` / ``sinc_prob2``                ``BlurSettings.sinc_prob``
``final_sinc_prob``                           ``final_sinc_prob`` of ``sample_degradation_kernels``
``blur_kernel_size`` / ``blur_kernel_size2``  read but unused by BasicSR 1.4.2, which hard-codes sizes 7..21
                                              padded to 21: pass ``max_kernel_size=21`` to reproduce it
============================================  =================================================================
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from anysr.errors import DataError, OptionError
from anysr.ops.imresize import imresize, resize_weights

__all__ = [
    "KERNEL_TYPES", "BlurSettings", "KernelParams", "bicubic_degrade", "bicubic_degrade_window", "bessel_j1",
    "kernel_grid", "sigma_matrix", "bivariate_gaussian", "bivariate_generalized_gaussian", "bivariate_plateau",
    "circular_lowpass_kernel", "pulse_kernel", "make_kernel", "draw_mixed_kernel_params", "random_mixed_kernels",
    "draw_degradation_kernel_params", "sample_degradation_kernels", "jpeg_cv2", "random_jpeg_cv2",
]

# LQ pixels of context kept around a patch so that degrading the patch equals cropping the degraded image.
_MARGIN_CACHE: dict[int, int] = {}


def bicubic_degrade(gt: np.ndarray, scale: int) -> np.ndarray:
    """MATLAB ``imresize(gt, 1/scale)`` (bicubic, antialiased) rounded and clipped to uint8.

    ``gt`` is a uint8 HW or HWC image whose height and width should be multiples of ``scale`` (mod-crop it
    first; otherwise MATLAB's ``ceil`` output size no longer pairs with the GT).
    """
    if not isinstance(scale, int) or scale < 1:
        raise OptionError(f"bicubic_degrade: scale must be a positive integer, got {scale!r}")
    if gt.dtype != np.uint8:
        raise DataError(f"bicubic_degrade: expected a uint8 image, got {gt.dtype}")
    if scale == 1:
        return gt.copy()
    out = imresize(gt, 1.0 / scale)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def _context_margin(scale: int) -> int:
    """LQ pixels on each side whose GT footprint covers the bicubic support of a patch's border pixels."""
    if scale not in _MARGIN_CACHE:
        # Measure the reach of the kernel from the actual weight matrix (robust to kernel changes).
        n = 16 * scale
        w = resize_weights(n, 1.0 / scale)
        row = w[n // scale // 2]
        nz = np.nonzero(row)[0]
        centre = (n // scale // 2 + 0.5) * scale - 0.5
        reach = max(centre - nz[0], nz[-1] - centre)
        _MARGIN_CACHE[scale] = int(math.ceil((reach + 1) / scale)) + 1
    return _MARGIN_CACHE[scale]


def bicubic_degrade_window(gt: np.ndarray, scale: int, top: int, left: int, size: int) -> np.ndarray:
    """The ``size`` x ``size`` LQ patch at LQ position (top, left) of ``bicubic_degrade(gt, scale)``.

    Only a window of ``gt`` around the patch (plus the kernel's reach) is resized, so the result is
    exactly that crop of the whole degraded image at a fraction of the cost. ``gt`` must have height and
    width divisible by ``scale``.
    """
    h, w = gt.shape[:2]
    if h % scale or w % scale:
        raise DataError(f"bicubic_degrade_window: GT {h}x{w} is not mod-cropped to scale {scale}")
    h_lq, w_lq = h // scale, w // scale
    if top < 0 or left < 0 or top + size > h_lq or left + size > w_lq:
        raise DataError(f"bicubic_degrade_window: patch ({top}, {left}, {size}) outside the {h_lq}x{w_lq} LQ")
    m = _context_margin(scale)
    t0, l0 = max(0, top - m), max(0, left - m)
    t1, l1 = min(h_lq, top + size + m), min(w_lq, left + size + m)
    window = gt[t0 * scale: t1 * scale, l0 * scale: l1 * scale, ...]
    lq = bicubic_degrade(np.ascontiguousarray(window), scale)
    return np.ascontiguousarray(lq[top - t0: top - t0 + size, left - l0: left - l0 + size, ...])


# ----------------------------------------------------------------------------------- Real-ESRGAN blur kernels
KERNEL_TYPES = ("iso", "aniso", "generalized_iso", "generalized_aniso", "plateau_iso", "plateau_aniso")
_SHAPED = {"generalized_iso", "generalized_aniso", "plateau_iso", "plateau_aniso"}  # the ones with a beta
_SMALLEST_KERNEL = 7  # BasicSR draws kernel sizes 7, 9, ..., 21


def _check_odd(kernel_size: int, fn: str, name: str = "kernel_size") -> int:
    if isinstance(kernel_size, bool) or int(kernel_size) != kernel_size or kernel_size < 1 or kernel_size % 2 == 0:
        raise OptionError(f"{fn}: {name} must be a positive odd integer, got {kernel_size!r}")
    return int(kernel_size)


def _check_range(rng_: Sequence[float], fn: str, name: str) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in rng_)
    except (TypeError, ValueError):
        raise OptionError(f"{fn}: {name} must be a pair [low, high] of numbers, got {rng_!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        raise OptionError(f"{fn}: {name} must be a finite range with low <= high, got {[lo, hi]}")
    return lo, hi


def kernel_grid(kernel_size: int) -> np.ndarray:
    """(K, K, 2) float64 pixel offsets from the centre: ``[..., 0]`` is x (column), ``[..., 1]`` is y (row)."""
    k = _check_odd(kernel_size, "kernel_grid")
    ax = np.arange(k, dtype=np.float64) - (k - 1) / 2
    return np.stack(np.meshgrid(ax, ax), axis=-1)


def sigma_matrix(sig_x: float, sig_y: float, theta: float) -> np.ndarray:
    """The 2x2 covariance ``R diag(sig_x^2, sig_y^2) R^T`` with ``R`` the rotation by ``theta`` radians."""
    c, s = math.cos(theta), math.sin(theta)
    rot = np.array([[c, -s], [s, c]], dtype=np.float64)
    return rot @ np.diag([sig_x * sig_x, sig_y * sig_y]) @ rot.T


def _quadratic_form(kernel_size: int, sig_x: float, sig_y: float, theta: float, isotropic: bool) -> np.ndarray:
    """``p^T Sigma^-1 p`` at every kernel offset ``p`` (the squared Mahalanobis distance)."""
    if sig_x <= 0 or (not isotropic and sig_y <= 0):
        raise OptionError(f"blur kernel: sigmas must be positive, got sig_x={sig_x}, sig_y={sig_y}")
    cov = np.diag([sig_x * sig_x] * 2) if isotropic else sigma_matrix(sig_x, sig_y, theta)
    p = kernel_grid(kernel_size)
    return np.einsum("...i,ij,...j->...", p, np.linalg.inv(cov), p)


def _normalised(k: np.ndarray) -> np.ndarray:
    return k / np.sum(k)


def bivariate_gaussian(kernel_size: int, sig_x: float, sig_y: float | None = None, theta: float = 0.0,
                       isotropic: bool = True) -> np.ndarray:
    """Normalised Gaussian kernel ``exp(-q / 2)``; isotropic uses ``sig_x`` only (``sig_y``/``theta`` ignored)."""
    q = _quadratic_form(kernel_size, sig_x, sig_x if sig_y is None else sig_y, theta, isotropic)
    return _normalised(np.exp(-0.5 * q))


def bivariate_generalized_gaussian(kernel_size: int, sig_x: float, sig_y: float | None, theta: float, beta: float,
                                   isotropic: bool = True) -> np.ndarray:
    """Normalised generalized Gaussian ``exp(-q^beta / 2)`` (``beta = 1`` is the Gaussian)."""
    q = _quadratic_form(kernel_size, sig_x, sig_x if sig_y is None else sig_y, theta, isotropic)
    return _normalised(np.exp(-0.5 * np.power(q, beta)))


def bivariate_plateau(kernel_size: int, sig_x: float, sig_y: float | None, theta: float, beta: float,
                      isotropic: bool = True) -> np.ndarray:
    """Normalised plateau kernel ``1 / (1 + q^beta)``."""
    q = _quadratic_form(kernel_size, sig_x, sig_x if sig_y is None else sig_y, theta, isotropic)
    return _normalised(1.0 / (np.power(q, beta) + 1.0))


def bessel_j1(x: np.ndarray | float) -> np.ndarray:
    """Bessel function of the first kind of order one, float64, to about 1e-15 absolute.

    Uses ``J1(x) = (1 / 2 pi) * integral over one period of cos(t - x sin t) dt``: the integrand is smooth and
    periodic, so the midpoint rule on ``n`` nodes is exact up to aliased terms ``J_{1 +- n}(x)``, which vanish
    once ``n`` exceeds ``|x|`` by a few dozen.
    """
    x = np.asarray(x, dtype=np.float64)
    n = 64 + 2 * int(math.ceil(float(np.max(np.abs(x), initial=0.0))))
    t = (np.arange(n, dtype=np.float64) + 0.5) * (2.0 * math.pi / n)
    return np.cos(t - x[..., None] * np.sin(t)).mean(axis=-1)


def circular_lowpass_kernel(cutoff: float, kernel_size: int, pad_to: int = 0) -> np.ndarray:
    """The 2-D circularly symmetric ideal low-pass ("sinc") kernel, normalised, float64.

    ``cutoff`` is the cut-off frequency in radians (pi is the Nyquist limit); the kernel is
    ``cutoff * J1(cutoff * r) / (2 pi r)`` at distance ``r`` from the centre (``cutoff^2 / (4 pi)`` at r = 0).
    With ``pad_to`` larger than ``kernel_size`` it is zero-padded to ``pad_to`` x ``pad_to`` (odd).
    """
    k = _check_odd(kernel_size, "circular_lowpass_kernel")
    pad_to = int(pad_to or 0)
    if pad_to > k and pad_to % 2 == 0:
        raise OptionError(f"circular_lowpass_kernel: pad_to must be odd (or 0), got {pad_to}")
    offsets = np.arange(k) - k // 2
    r2 = offsets[:, None] ** 2 + offsets[None, :] ** 2  # integers: few distinct radii, J1 once per radius
    radii2, where = np.unique(r2, return_inverse=True)
    r = np.sqrt(radii2.astype(np.float64))
    safe_r = np.where(r == 0, 1.0, r)
    values = np.where(r == 0, cutoff * cutoff / (4 * math.pi), cutoff * bessel_j1(cutoff * r) / (2 * math.pi * safe_r))
    kernel = _normalised(values[where.reshape(k, k)])
    if pad_to > k:
        m = (pad_to - k) // 2
        kernel = np.pad(kernel, ((m, m), (m, m)))
    return kernel


def pulse_kernel(size: int) -> np.ndarray:
    """The identity kernel: a one at the centre of a ``size`` x ``size`` float64 array of zeros."""
    k = _check_odd(size, "pulse_kernel", "size")
    out = np.zeros((k, k), dtype=np.float64)
    out[k // 2, k // 2] = 1.0
    return out


@dataclass(frozen=True)
class KernelParams:
    """One drawn kernel: its ``kind`` (a ``KERNEL_TYPES`` entry, ``'sinc'`` or ``'pulse'``) and parameters.

    ``sigma_y == sigma_x`` and ``rotation == 0`` for the isotropic kinds, ``beta`` is NaN for the Gaussians,
    ``omega_c`` (the sinc cut-off) is NaN except for ``'sinc'``; ``pad_to`` is the final (zero-padded) size.
    """

    kind: str
    size: int
    pad_to: int
    sigma_x: float = math.nan
    sigma_y: float = math.nan
    rotation: float = math.nan
    beta: float = math.nan
    omega_c: float = math.nan


def make_kernel(params: KernelParams) -> np.ndarray:
    """The float64 kernel that ``params`` describes, zero-padded to ``params.pad_to``."""
    kind, k = params.kind, params.size
    iso = kind.endswith("_iso") or kind == "iso"
    if kind in ("iso", "aniso"):
        kernel = bivariate_gaussian(k, params.sigma_x, params.sigma_y, params.rotation, isotropic=iso)
    elif kind in ("generalized_iso", "generalized_aniso"):
        kernel = bivariate_generalized_gaussian(k, params.sigma_x, params.sigma_y, params.rotation, params.beta,
                                                isotropic=iso)
    elif kind in ("plateau_iso", "plateau_aniso"):
        kernel = bivariate_plateau(k, params.sigma_x, params.sigma_y, params.rotation, params.beta, isotropic=iso)
    elif kind == "sinc":
        kernel = circular_lowpass_kernel(params.omega_c, k)
    elif kind == "pulse":
        kernel = pulse_kernel(k)
    else:
        raise OptionError(f"make_kernel: unknown kernel kind {kind!r}; expected one of "
                          f"{', '.join(KERNEL_TYPES)}, sinc, pulse")
    if params.pad_to > k:
        m = (params.pad_to - k) // 2
        kernel = np.pad(kernel, ((m, m), (m, m)))
    return kernel


def _categorical(rng: np.random.Generator, weights: Sequence[float]) -> int:
    """Index drawn with probability proportional to ``weights`` (one uniform, as ``random.choices`` uses)."""
    cum = np.cumsum(np.asarray(weights, dtype=np.float64))
    return min(int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), len(cum) - 1)


def _beta(rng: np.random.Generator, beta_range: tuple[float, float]) -> float:
    # BasicSR's shape draw: a fair coin picks [low, 1] or [1, high] (so beta = 1 splits the mass in halves).
    if rng.random() < 0.5:
        return float(rng.uniform(beta_range[0], 1.0))
    return float(rng.uniform(1.0, beta_range[1]))


def _check_kernel_list(kernel_list: Sequence[str], kernel_prob: Sequence[float], fn: str) -> None:
    bad = [k for k in kernel_list if k not in KERNEL_TYPES]
    if bad:
        raise OptionError(f"{fn}: unknown kernel type(s) {bad} in kernel_list; choose from {list(KERNEL_TYPES)}")
    if len(kernel_list) == 0 or len(kernel_list) != len(kernel_prob):
        raise OptionError(f"{fn}: kernel_list ({len(kernel_list)} entries) and kernel_prob ({len(kernel_prob)}) "
                          "must be non-empty and of equal length")
    if any(not math.isfinite(p) or p < 0 for p in kernel_prob) or sum(kernel_prob) <= 0:
        raise OptionError(f"{fn}: kernel_prob must be non-negative with a positive sum, got {list(kernel_prob)}")


def draw_mixed_kernel_params(rng: np.random.Generator, kernel_list: Sequence[str], kernel_prob: Sequence[float],
                             kernel_size: int, sigma_x_range: Sequence[float], sigma_y_range: Sequence[float],
                             rotation_range: Sequence[float] = (-math.pi, math.pi),
                             betag_range: Sequence[float] = (0.5, 8), betap_range: Sequence[float] = (0.5, 8),
                             pad_to: int = 0) -> KernelParams:
    """Draw one kernel of BasicSR's ``random_mixed_kernels``: its type, then its parameters, from ``rng``.

    Order of draws: type (weights ``kernel_prob``), sigma_x, then for the anisotropic kinds sigma_y and the
    rotation, then for generalized/plateau kinds a fair coin choosing ``[low, 1]`` or ``[1, high]`` of
    ``betag_range`` / ``betap_range`` and beta uniform in it. All uniforms as ``numpy``'s ``uniform(lo, hi)``.
    """
    fn = "draw_mixed_kernel_params"
    _check_kernel_list(kernel_list, kernel_prob, fn)
    k = _check_odd(kernel_size, fn)
    kind = kernel_list[_categorical(rng, kernel_prob)]
    sx_lo, sx_hi = _check_range(sigma_x_range, fn, "sigma_x_range")
    sigma_x = float(rng.uniform(sx_lo, sx_hi))
    sigma_y, rotation = sigma_x, 0.0
    if kind.endswith("aniso"):
        sigma_y = float(rng.uniform(*_check_range(sigma_y_range, fn, "sigma_y_range")))
        rotation = float(rng.uniform(*_check_range(rotation_range, fn, "rotation_range")))
    beta = math.nan
    if kind.startswith("generalized"):
        beta = _beta(rng, _check_range(betag_range, fn, "betag_range"))
    elif kind.startswith("plateau"):
        beta = _beta(rng, _check_range(betap_range, fn, "betap_range"))
    return KernelParams(kind, k, max(k, int(pad_to or 0)), sigma_x, sigma_y, rotation, beta)


def random_mixed_kernels(rng: np.random.Generator, kernel_list: Sequence[str], kernel_prob: Sequence[float],
                         kernel_size: int = 21, sigma_x_range: Sequence[float] = (0.6, 5),
                         sigma_y_range: Sequence[float] = (0.6, 5),
                         rotation_range: Sequence[float] = (-math.pi, math.pi),
                         betag_range: Sequence[float] = (0.5, 8), betap_range: Sequence[float] = (0.5, 8),
                         noise_range: Sequence[float] | None = None) -> np.ndarray:
    """BasicSR's ``random_mixed_kernels`` with an explicit generator: a random kernel, float64, normalised.

    ``noise_range`` (unused by Real-ESRGAN) multiplies the Gaussian and generalized kernels by uniform noise
    in that range before renormalising; plateau kernels get none, as in BasicSR.
    """
    params = draw_mixed_kernel_params(rng, kernel_list, kernel_prob, kernel_size, sigma_x_range, sigma_y_range,
                                      rotation_range, betag_range, betap_range)
    kernel = make_kernel(params)
    if noise_range is not None and not params.kind.startswith("plateau"):
        lo, hi = _check_range(noise_range, "random_mixed_kernels", "noise_range")
        kernel = _normalised(kernel * rng.uniform(lo, hi, size=kernel.shape))
    return kernel


@dataclass(frozen=True)
class BlurSettings:
    """The kernel distribution of one degradation stage (the BasicSR keys are in the module docstring).

    ``sinc_prob`` is the chance of a sinc kernel instead of a ``kernel_list`` one; ``blur_sigma`` is the range
    of both sigmas; rotations are uniform in [-pi, pi] as in BasicSR.
    """

    kernel_list: tuple[str, ...]
    kernel_prob: tuple[float, ...]
    blur_sigma: tuple[float, float]
    betag_range: tuple[float, float]
    betap_range: tuple[float, float]
    sinc_prob: float

    def __post_init__(self) -> None:
        fn = "BlurSettings"
        object.__setattr__(self, "kernel_list", tuple(self.kernel_list))
        object.__setattr__(self, "kernel_prob", tuple(float(p) for p in self.kernel_prob))
        _check_kernel_list(self.kernel_list, self.kernel_prob, fn)
        for name in ("blur_sigma", "betag_range", "betap_range"):
            object.__setattr__(self, name, _check_range(getattr(self, name), fn, name))
        if self.blur_sigma[0] <= 0:
            raise OptionError(f"{fn}: blur_sigma must be positive, got {list(self.blur_sigma)}")
        if not 0.0 <= float(self.sinc_prob) <= 1.0:
            raise OptionError(f"{fn}: sinc_prob must be a probability in [0, 1], got {self.sinc_prob!r}")

    @classmethod
    def from_basicsr(cls, opt: Mapping[str, object], stage: int = 1) -> BlurSettings:
        """Read ``kernel_list``, ``kernel_prob``, ``blur_sigma``, ``betag_range``, ``betap_range``, ``sinc_prob``
        (with suffix ``2`` for ``stage=2``) from a BasicSR ``datasets.train`` section; a missing key is an error."""
        suffix = {1: "", 2: "2"}.get(stage)
        if suffix is None:
            raise OptionError(f"BlurSettings.from_basicsr: stage must be 1 or 2, got {stage!r}")
        keys = ("kernel_list", "kernel_prob", "blur_sigma", "betag_range", "betap_range", "sinc_prob")
        missing = [k + suffix for k in keys if k + suffix not in opt]
        if missing:
            raise OptionError(f"datasets.train: missing Real-ESRGAN key(s) {', '.join(missing)}")
        return cls(*(opt[k + suffix] for k in keys))  # type: ignore[arg-type]


def _draw_stage(rng: np.random.Generator, settings: BlurSettings, max_kernel_size: int) -> KernelParams:
    size = 2 * int(rng.integers(_SMALLEST_KERNEL // 2, max_kernel_size // 2 + 1)) + 1
    if rng.random() < settings.sinc_prob:
        # BasicSR's cut-off range: small kernels cannot represent the lowest cut-offs.
        low = math.pi / 3 if size < 13 else math.pi / 5
        return KernelParams("sinc", size, max_kernel_size, omega_c=float(rng.uniform(low, math.pi)))
    return draw_mixed_kernel_params(rng, settings.kernel_list, settings.kernel_prob, size, settings.blur_sigma,
                                    settings.blur_sigma, (-math.pi, math.pi), settings.betag_range,
                                    settings.betap_range, pad_to=max_kernel_size)


def draw_degradation_kernel_params(rng: np.random.Generator, *, first: BlurSettings, second: BlurSettings,
                                   final_sinc_prob: float, max_kernel_size: int) -> dict[str, KernelParams]:
    """The parameters behind :func:`sample_degradation_kernels` (same draws from ``rng``, same order).

    Per stage: a kernel size uniform in 7, 9, ..., ``max_kernel_size``; a ``sinc_prob`` coin; then either the
    sinc cut-off (uniform in [pi/3, pi] for sizes below 13, [pi/5, pi] otherwise) or a mixed kernel
    (:func:`draw_mixed_kernel_params`). Finally a ``final_sinc_prob`` coin; on heads a size and a cut-off in
    [pi/3, pi], on tails the pulse (identity). Every kernel is zero-padded to ``max_kernel_size``.
    """
    fn = "draw_degradation_kernel_params"
    k = _check_odd(max_kernel_size, fn, "max_kernel_size")
    if k < _SMALLEST_KERNEL:
        raise OptionError(f"{fn}: max_kernel_size must be at least {_SMALLEST_KERNEL}, got {k}")
    if not 0.0 <= float(final_sinc_prob) <= 1.0:
        raise OptionError(f"{fn}: final_sinc_prob must be a probability in [0, 1], got {final_sinc_prob!r}")
    out = {"kernel1": _draw_stage(rng, first, k), "kernel2": _draw_stage(rng, second, k)}
    if rng.random() < final_sinc_prob:
        size = 2 * int(rng.integers(_SMALLEST_KERNEL // 2, k // 2 + 1)) + 1
        out["sinc_kernel"] = KernelParams("sinc", size, k, omega_c=float(rng.uniform(math.pi / 3, math.pi)))
    else:
        out["sinc_kernel"] = KernelParams("pulse", k, k)
    return out


def sample_degradation_kernels(rng: np.random.Generator, *, first: BlurSettings, second: BlurSettings,
                               final_sinc_prob: float, max_kernel_size: int) -> dict[str, np.ndarray]:
    """The per-sample kernels of ``RealESRGANDataset``: ``kernel1``, ``kernel2``, ``sinc_kernel``.

    Each is a float32 ``max_kernel_size`` x ``max_kernel_size`` array (computed in float64, then cast, as
    BasicSR does); draws as :func:`draw_degradation_kernel_params` describes. Batch them and hand them to
    :func:`anysr.ops.degrade.second_order_degrade`.
    """
    params = draw_degradation_kernel_params(rng, first=first, second=second, final_sinc_prob=final_sinc_prob,
                                            max_kernel_size=max_kernel_size)
    return {name: make_kernel(p).astype(np.float32) for name, p in params.items()}


# ------------------------------------------------------------------------------------------- real JPEG codec
def jpeg_cv2(img: np.ndarray, quality: int) -> np.ndarray:
    """Encode ``img`` as JPEG with OpenCV at ``quality`` (0-100) and decode it again.

    ``img`` is uint8, HW or HWC with 3 channels in OpenCV's BGR order (as anysr reads images); the chroma
    conversion assumes that order. The result has the same shape and dtype. BasicSR's ``add_jpg_compression``
    on ``img / 255`` gives the same pixels (it rounds to uint8 before encoding).
    """
    arr = np.asarray(img)
    if arr.dtype != np.uint8:
        raise DataError(f"jpeg_cv2: expected a uint8 image, got {arr.dtype}; round and clip to uint8 first")
    if not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[2] in (1, 3))):
        raise DataError(f"jpeg_cv2: expected an HW or HWC (1 or 3 channels) image, got shape {arr.shape}")
    if isinstance(quality, bool) or int(quality) != quality or not 0 <= quality <= 100:
        raise OptionError(f"jpeg_cv2: quality must be an integer in [0, 100], got {quality!r}")
    ok, buf = cv2.imencode(".jpg", arr, [int(cv2.IMWRITE_JPEG_QUALITY), int(quality)])
    if not ok:
        raise DataError(f"jpeg_cv2: OpenCV could not encode an image of shape {arr.shape}")
    out = cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)
    return out.reshape(arr.shape)


def random_jpeg_cv2(img: np.ndarray, rng: np.random.Generator, quality_range: Sequence[int]) -> np.ndarray:
    """:func:`jpeg_cv2` at an integer quality drawn uniformly from ``quality_range`` (both ends included)."""
    lo, hi = _check_range(quality_range, "random_jpeg_cv2", "quality_range")
    quality = int(rng.integers(math.ceil(lo), math.floor(hi) + 1))
    return jpeg_cv2(img, quality)

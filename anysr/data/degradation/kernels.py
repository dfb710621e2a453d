"""Blur kernels of the blind degradation models and their random draws (numpy, in the data-loader workers).

Real-ESRGAN's kernels as BasicSR 1.4.2 defines them (Wang et al. 2021): isotropic / anisotropic Gaussian,
generalized Gaussian, plateau, the circular low-pass ("sinc") kernel, the pulse (identity), and their random
mixture (:func:`draw_mixed_kernel_params`, :func:`random_mixed_kernels`). A drawn kernel is a
:class:`KernelParams`; :func:`make_kernel` builds its array. Draws follow BasicSR's order and meaning, from the
``numpy.random.Generator`` passed in only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from anysr.data.degradation.draws import categorical, check_range
from anysr.errors import OptionError

__all__ = [
    "KERNEL_TYPES", "KernelParams", "bessel_j1", "kernel_grid", "sigma_matrix", "bivariate_gaussian",
    "bivariate_generalized_gaussian", "bivariate_plateau", "circular_lowpass_kernel", "pulse_kernel", "make_kernel",
    "check_odd_size", "check_kernel_list", "draw_mixed_kernel_params", "random_mixed_kernels",
]

KERNEL_TYPES = ("iso", "aniso", "generalized_iso", "generalized_aniso", "plateau_iso", "plateau_aniso")


def check_odd_size(kernel_size: int, fn: str, name: str = "kernel_size") -> int:
    """``kernel_size`` as an int if it is a positive odd integer, else an OptionError naming ``fn`` and ``name``."""
    if isinstance(kernel_size, bool) or int(kernel_size) != kernel_size or kernel_size < 1 or kernel_size % 2 == 0:
        raise OptionError(f"{fn}: {name} must be a positive odd integer, got {kernel_size!r}")
    return int(kernel_size)


def kernel_grid(kernel_size: int) -> np.ndarray:
    """(K, K, 2) float64 pixel offsets from the centre: ``[..., 0]`` is x (column), ``[..., 1]`` is y (row)."""
    k = check_odd_size(kernel_size, "kernel_grid")
    ax = np.arange(k, dtype=np.float64) - (k - 1) / 2
    return np.stack(np.meshgrid(ax, ax), axis=-1)


def sigma_matrix(sig_x: float, sig_y: float, theta: float, dtype: type = np.float64) -> np.ndarray:
    """The 2x2 covariance ``R diag(sig_x^2, sig_y^2) R^T`` with ``R`` the rotation by ``theta`` radians, computed
    in ``dtype`` (float32: mmagic's kernels, RealBasicVSR's)."""
    c, s = math.cos(theta), math.sin(theta)
    rot = np.array([[c, -s], [s, c]], dtype=dtype)
    return rot @ np.diag(np.array([sig_x * sig_x, sig_y * sig_y], dtype=dtype)) @ rot.T


def _quadratic_form(kernel_size: int, sig_x: float, sig_y: float, theta: float, isotropic: bool,
                    cov_dtype: type = np.float64) -> np.ndarray:
    """``p^T Sigma^-1 p`` at every kernel offset ``p`` (the squared Mahalanobis distance; the covariance in
    ``cov_dtype``, the rest in float64)."""
    if sig_x <= 0 or (not isotropic and sig_y <= 0):
        raise OptionError(f"blur kernel: sigmas must be positive, got sig_x={sig_x}, sig_y={sig_y}")
    cov = np.diag(np.array([sig_x * sig_x] * 2, dtype=cov_dtype)) if isotropic \
        else sigma_matrix(sig_x, sig_y, theta, cov_dtype)
    p = kernel_grid(kernel_size)
    return np.einsum("...i,ij,...j->...", p, np.linalg.inv(cov), p)


def _normalised(k: np.ndarray) -> np.ndarray:
    return k / np.sum(k)


def bivariate_gaussian(kernel_size: int, sig_x: float, sig_y: float | None = None, theta: float = 0.0,
                       isotropic: bool = True, cov_dtype: type = np.float64) -> np.ndarray:
    """Normalised Gaussian kernel ``exp(-q / 2)``; isotropic uses ``sig_x`` only (``sig_y``/``theta`` ignored)."""
    q = _quadratic_form(kernel_size, sig_x, sig_x if sig_y is None else sig_y, theta, isotropic, cov_dtype)
    return _normalised(np.exp(-0.5 * q))


def bivariate_generalized_gaussian(kernel_size: int, sig_x: float, sig_y: float | None, theta: float, beta: float,
                                   isotropic: bool = True, cov_dtype: type = np.float64) -> np.ndarray:
    """Normalised generalized Gaussian ``exp(-q^beta / 2)`` (``beta = 1`` is the Gaussian)."""
    q = _quadratic_form(kernel_size, sig_x, sig_x if sig_y is None else sig_y, theta, isotropic, cov_dtype)
    return _normalised(np.exp(-0.5 * np.power(q, beta)))


def bivariate_plateau(kernel_size: int, sig_x: float, sig_y: float | None, theta: float, beta: float,
                      isotropic: bool = True, cov_dtype: type = np.float64) -> np.ndarray:
    """Normalised plateau kernel ``1 / (1 + q^beta)``."""
    q = _quadratic_form(kernel_size, sig_x, sig_x if sig_y is None else sig_y, theta, isotropic, cov_dtype)
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
    k = check_odd_size(kernel_size, "circular_lowpass_kernel")
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
    k = check_odd_size(size, "pulse_kernel", "size")
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



def _beta(rng: np.random.Generator, beta_range: tuple[float, float]) -> float:
    # BasicSR's shape draw: a fair coin picks [low, 1] or [1, high] (so beta = 1 splits the mass in halves).
    if rng.random() < 0.5:
        return float(rng.uniform(beta_range[0], 1.0))
    return float(rng.uniform(1.0, beta_range[1]))



def check_kernel_list(kernel_list: Sequence[str], kernel_prob: Sequence[float], fn: str) -> None:
    """An OptionError naming ``fn`` unless ``kernel_list`` holds ``KERNEL_TYPES`` with as many usable weights."""
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
    check_kernel_list(kernel_list, kernel_prob, fn)
    k = check_odd_size(kernel_size, fn)
    kind = kernel_list[categorical(rng, kernel_prob)]
    sx_lo, sx_hi = check_range(sigma_x_range, fn, "sigma_x_range")
    sigma_x = float(rng.uniform(sx_lo, sx_hi))
    sigma_y, rotation = sigma_x, 0.0
    if kind.endswith("aniso"):
        sigma_y = float(rng.uniform(*check_range(sigma_y_range, fn, "sigma_y_range")))
        rotation = float(rng.uniform(*check_range(rotation_range, fn, "rotation_range")))
    beta = math.nan
    if kind.startswith("generalized"):
        beta = _beta(rng, check_range(betag_range, fn, "betag_range"))
    elif kind.startswith("plateau"):
        beta = _beta(rng, check_range(betap_range, fn, "betap_range"))
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
        lo, hi = check_range(noise_range, "random_mixed_kernels", "noise_range")
        kernel = _normalised(kernel * rng.uniform(lo, hi, size=kernel.shape))
    return kernel


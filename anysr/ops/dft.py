"""The 2-D discrete Fourier transform of real images as matrix products: XLA has no FFT kernel that stays on the
device (``aten::_fft_r2c`` / ``_fft_c2c`` fall back to the CPU) and no complex reductions, so the losses that read
spectra (focal frequency, FFT, FDL) take real and imaginary parts from cos / sin matrices, one path on every device.

The matrices come from float64 twiddles with the circle's symmetries exact (quadrants and octants share their values
bit for bit), so coefficients that are real or imaginary in exact arithmetic come out so (``torch.fft`` gives the
same zeros in float32), and phases of negative real coefficients are +pi as ``torch.angle`` gives them.
"""

from __future__ import annotations

import math

import torch

__all__ = ["dft2", "dft_matrices"]

_CACHE: dict[tuple[int, str, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}


def _twiddles(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of ``2 pi m / n``, m = 0..n-1, in float64, the symmetries exact."""
    m = torch.arange(n, dtype=torch.int64)
    if n % 4:
        r = torch.minimum(m, n - m)
        a = r.double() * (2 * math.pi / n)
        sin = torch.sin(a) * torch.where(m <= n - m, 1.0, -1.0).double()
        sin[(2 * m) % n == 0] = 0.0
        return torch.cos(a), sin
    quarter = n // 4
    q, j = m // quarter, m % quarter
    swap = 8 * j > n  # past the octant: cos and sin of the complement
    jj = torch.where(swap, quarter - j, j)
    a = jj.double() * (2 * math.pi / n)
    c0, s0 = torch.cos(a), torch.sin(a)
    diag = 8 * jj == n
    c0 = torch.where(diag, math.sqrt(0.5), c0)
    s0 = torch.where(diag, math.sqrt(0.5), s0)
    c, s = torch.where(swap, s0, c0), torch.where(swap, c0, s0)
    cos = torch.stack((c, -s, -c, s)).gather(0, q[None])[0]  # rotated by q quarter turns
    sin = torch.stack((s, c, -s, -c)).gather(0, q[None])[0]
    return cos, sin


def dft_matrices(n: int, device: torch.device, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of ``2 pi k j / n`` (n x n, symmetric) on ``device`` in ``dtype``, cached per size."""
    key = (n, str(device), dtype)
    if key not in _CACHE:
        idx = torch.arange(n, dtype=torch.int64)
        cos, sin = _twiddles(n)
        m = (idx[:, None] * idx[None, :]) % n
        _CACHE[key] = (cos[m].to(device, dtype), sin[m].to(device, dtype))
    return _CACHE[key]


def dft2(x: torch.Tensor, norm: str = "backward") -> tuple[torch.Tensor, torch.Tensor]:
    """Real and imaginary parts of ``torch.fft.fft2(x, norm=norm)`` of real ``x`` over its last two dims (``norm``
    ``backward``: unscaled; ``ortho``: divided by sqrt(H W))."""
    ch, sh = dft_matrices(x.shape[-2], x.device, x.dtype)
    cw, sw = dft_matrices(x.shape[-1], x.device, x.dtype)
    xc, xs = x @ cw, x @ sw
    re, im = ch @ xc - sh @ xs, -(ch @ xs + sh @ xc)
    if norm == "ortho":
        scale = 1 / math.sqrt(x.shape[-2] * x.shape[-1])
        return re * scale, im * scale
    if norm != "backward":
        raise ValueError(f"norm must be 'backward' or 'ortho', got {norm!r}")
    return re, im

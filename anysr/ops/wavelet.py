"""A one-level 2-D stationary (undecimated) wavelet transform with periodic borders, and neosr's wavelet-guided view
of an image (the high-frequency bands of its luma) that ``train.wavelet_guided`` shows the discriminator.

The filters are the wavelets' published coefficients (no PyWavelets at run time); the transform is two grouped
convolutions (rows, then columns) on a periodically extended input, so it has static shapes, one graph per input
shape on XLA and works at any image size (the extension wraps as often as the filter needs).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.ops.autocast import autocast_off

# Decomposition low-pass filters (PyWavelets' ``dec_lo``); the high-pass filter follows from it (quadrature mirror).
DEC_LO: dict[str, tuple[float, ...]] = {
    "db1": (0.7071067811865476, 0.7071067811865476),
    "sym19": (
        5.487732768215838e-07, -6.463651303345963e-07, -1.1880518269823984e-05, 8.873312173729286e-06,
        0.0001155392333357879, -4.612039600210587e-05, -0.000635764515004334, 0.00015915804768084938,
        0.0021214250281823303, -0.0011607032572062486, -0.005122205002583014, 0.007968438320613306,
        0.01579743929567463, -0.02265199337824595, -0.046635983534938946, 0.0070155738571741596,
        0.008954591173043624, -0.06752505804029409, 0.10902582508127781, 0.578144945338605,
        0.7195555257163943, 0.2582661692372836, -0.17659686625203097, -0.11624173010739675,
        0.09363084341589714, 0.08407267627924504, -0.016908234861345205, -0.02770989693131125,
        0.004319351874894969, 0.008262236955528255, -0.0006179223277983108, -0.0017049602611649971,
        0.00012930767650701415, 0.0002762187768573407, -1.6821387029373716e-05, -2.8151138661550245e-05,
        2.0623170632395688e-06, 1.7509367995348687e-06,
    ),
}
DEC_LO["haar"] = DEC_LO["db1"]

# neosr's wavelet-guided view: BT.601 luma on [0, 1] input (16 + 65.481 R + 128.553 G + 24.966 B) and the weights
# of its LH, HL, HH bands.
_LUMA = (65.481, 128.553, 24.966)
_BAND_WEIGHTS = (0.035, 0.025, 0.02)


def wavelet_filters(wavelet: str, normalise_low: bool = False) -> tuple[list[float], list[float]]:
    """The decomposition filters ``(dec_lo, dec_hi)`` of ``wavelet`` (``db1`` / ``haar``, ``sym19``), as PyWavelets
    gives them; ``normalise_low``: ``dec_lo`` divided by its sum (neosr's wavelet-guided filters)."""
    if wavelet not in DEC_LO:
        raise ValueError(f"wavelet: {wavelet!r} is not known; use one of {', '.join(sorted(DEC_LO))}")
    lo = list(DEC_LO[wavelet])
    n = len(lo)
    hi = [(-1.0 if k % 2 == 0 else 1.0) * lo[n - 1 - k] for k in range(n)]
    if normalise_low:
        total = 0.0
        for v in lo:  # summed in order, in double precision (as Python's sum)
            total += v
        lo = [v / total for v in lo]
    return lo, hi


def _periodic(x: torch.Tensor, before: int, after: int, dim: int) -> torch.Tensor:
    """``x`` extended periodically along ``dim`` by ``before`` / ``after`` samples (any amount: indices wrap)."""
    n = x.shape[dim]
    idx = torch.remainder(torch.arange(-before, n + after, device=x.device), n)
    return x.index_select(dim, idx)


class SWT2d(nn.Module):
    """One level of the 2-D stationary wavelet transform with periodic borders: ``(N, C, H, W)`` to
    ``(N, C, 4, H, W)``, the bands in PyWavelets' ``swt2`` order (approximation, then the row-low / column-high,
    row-high / column-low and diagonal details; neosr's LL, LH, HL, HH). A band sample ``i`` sums
    ``f[L - 1 - k] * x[(i + k - L // 2 + 1) mod n]`` over the filter's taps (rows first, then columns), as neosr's
    ``SWTForward`` (pytorch_wavelets) aligns it. The filters are buffers (not saved with a state dict)."""

    def __init__(self, wavelet: str = "db1", normalise_low: bool = False) -> None:
        super().__init__()
        lo, hi = wavelet_filters(wavelet, normalise_low)
        taps = torch.tensor([lo[::-1], hi[::-1]], dtype=torch.float64).float()  # (2, L): correlation form
        self.register_buffer("taps", taps, persistent=False)
        self.length = len(lo)

    def _filter(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        c = x.shape[1]
        half = self.length // 2
        shape = (2 * c, 1, self.length, 1) if dim == 2 else (2 * c, 1, 1, self.length)
        weight = self.taps.to(x.dtype).repeat(c, 1).reshape(shape)  # (lo, hi) per channel
        return F.conv2d(_periodic(x, half - 1, half, dim), weight, groups=c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:
            raise ValueError(f"SWT2d takes NCHW images, got shape {tuple(x.shape)}")
        n, c, h, w = x.shape
        bands = self._filter(self._filter(x, 3), 2)  # per channel: (lo, hi) rows, each split (lo, hi) in columns
        return bands.reshape(n, c, 4, h, w)


class WaveletGuide(nn.Module):
    """neosr's ``wavelet_guided`` view of RGB images on [0, 1]: the weighted LH, HL, HH bands (0.035, 0.025, 0.02)
    of the one-level SWT (``wavelet``, default neosr's sym19 with its low-pass filter normalised to sum 1) of the
    BT.601 luma ``16 + 65.481 R + 128.553 G + 24.966 B``: ``(N, 3, H, W)`` to ``(N, 3, H, W)``. Differentiable."""

    def __init__(self, wavelet: str = "sym19") -> None:
        super().__init__()
        self.swt = SWT2d(wavelet, normalise_low=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != 3:
            raise ValueError(f"the wavelet-guided view takes NCHW RGB images, got shape {tuple(x.shape)}")
        r, g, b = _LUMA
        with autocast_off(x):  # in float32, as neosr's (its transform casts its inputs to float32)
            x = x.float()
            y = 16.0 + (x[:, 0:1] * r + x[:, 1:2] * g + x[:, 2:] * b)
            bands = self.swt(y)[:, 0]  # (N, 4, H, W)
            return torch.cat([bands[:, k + 1:k + 2] * wk for k, wk in enumerate(_BAND_WEIGHTS)], dim=1)

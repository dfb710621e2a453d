"""Frequency losses: amplitude / phase distance of the 2-D FFT, and the focal frequency loss (Jiang et al.,
"Focal Frequency Loss for Image Reconstruction and Synthesis", ICCV 2021). Spectra in fp32 (autocast off), as
matrix products (``anysr.ops.dft``: no CPU fallback on XLA)."""

from __future__ import annotations

import torch

from anysr.losses.pixel import _PixelLoss
from anysr.ops.autocast import autocast_off
from anysr.ops.dft import dft2
from anysr.registry import LOSS_REGISTRY

_EPS = 1e-12


@LOSS_REGISTRY.register()
class FFTLoss(_PixelLoss):
    """``amplitude_weight * |(|P| - |T|)| + phase_weight * (1 - cos(angle P - angle T))`` per frequency, where
    P, T are the orthonormal 2-D FFTs of each channel; reduced over all frequencies. The phase term has no wrap
    and a finite gradient where an amplitude is 0."""

    def __init__(self, loss_weight: float = 1.0, reduction: str = "mean", amplitude_weight: float = 1.0,
                 phase_weight: float = 0.0) -> None:
        super().__init__(loss_weight, reduction)
        if amplitude_weight < 0 or phase_weight < 0 or amplitude_weight + phase_weight == 0:
            raise ValueError(f"amplitude_weight and phase_weight must be >= 0 and not both 0, got "
                             f"{amplitude_weight} and {phase_weight}")
        self.amplitude_weight = float(amplitude_weight)
        self.phase_weight = float(phase_weight)

    def forward(self, pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        with autocast_off(pred):
            pr, pi = dft2(pred.float(), "ortho")
            tr, ti = dft2(target.float(), "ortho")
            amp_p = torch.sqrt(pr**2 + pi**2 + _EPS)
            amp_t = torch.sqrt(tr**2 + ti**2 + _EPS)
            loss = self.amplitude_weight * (amp_p - amp_t).abs()
            if self.phase_weight > 0:
                cos = (pr * tr + pi * ti) / (amp_p * amp_t)
                loss = loss + self.phase_weight * (1 - cos)
        return self.loss_weight * self._reduce(loss, weight)


@LOSS_REGISTRY.register()
class FFLoss(_PixelLoss):
    """Focal frequency loss: the squared distance of the orthonormal FFTs of each channel (of each of
    ``patch_factor``^2 patches), weighted per frequency by the detached ``|distance| ** alpha`` scaled to [0, 1]
    (by its maximum per image / patch / channel, or over the whole batch with ``batch_matrix``; ``log_matrix``
    takes log(1 + w) first). ``ave_spectrum`` compares batch-mean spectra. ``weight`` is not supported.
    """

    def __init__(self, loss_weight: float = 1.0, reduction: str = "mean", alpha: float = 1.0,
                 patch_factor: int = 1, ave_spectrum: bool = False, log_matrix: bool = False,
                 batch_matrix: bool = False) -> None:
        super().__init__(loss_weight, reduction)
        if patch_factor < 1:
            raise ValueError(f"patch_factor must be >= 1, got {patch_factor}")
        self.alpha = float(alpha)
        self.patch_factor = int(patch_factor)
        self.ave_spectrum = bool(ave_spectrum)
        self.log_matrix = bool(log_matrix)
        self.batch_matrix = bool(batch_matrix)

    def _spectrum(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Real and imaginary parts of the orthonormal DFT of each channel of each patch (batch-averaged with
        ``ave_spectrum``)."""
        n, c, h, w = x.shape
        f = self.patch_factor
        if h % f or w % f:
            raise ValueError(f"{type(self).__name__}: {h}x{w} images do not split into patch_factor={f} patches "
                             "per side")
        ph, pw = h // f, w // f
        re, im = dft2(x.reshape(n, c, f, ph, f, pw).permute(0, 2, 4, 1, 3, 5).reshape(n, f * f, c, ph, pw), "ortho")
        if self.ave_spectrum:
            re, im = re.mean(0, keepdim=True), im.mean(0, keepdim=True)
        return re, im

    def focal(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The unreduced loss: each frequency's squared distance times its detached focal weight."""
        pr, pi = self._spectrum(pred)
        tr, ti = self._spectrum(target)
        dist = (pr - tr) ** 2 + (pi - ti) ** 2
        with torch.no_grad():
            m = torch.sqrt(dist) ** self.alpha
            if self.log_matrix:
                m = torch.log(m + 1.0)
            top = m.amax() if self.batch_matrix else m.amax(dim=(-2, -1), keepdim=True)
            m = torch.nan_to_num(m / top, nan=0.0).clamp(0.0, 1.0)
        return m * dist

    def forward(self, pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        if weight is not None:
            raise ValueError("FFLoss takes no weight")
        with autocast_off(pred):
            loss = self.focal(pred.float(), target.float())
        return self.loss_weight * self._reduce(loss)

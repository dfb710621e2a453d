"""DUnet: traiNNer-redux's U-Net discriminator (the-database, traiNNer-redux, 2024; no paper).

A per-pixel discriminator: a 3x3 stem, three stride-2 encoder stages (spectral-normalised conv + Mish, the
width doubling each time), three decoder stages that upsample by 2 with a learned DySample point sampler and
halve the width with a spectral-normalised conv, each added to the encoder map of its size, then a head of two
spectral-normalised 3x3 convs (no bias, Mish) and a plain 3x3 conv to one logit per pixel.

Module names, constructor arguments (``num_in_ch``, ``num_feat``) and the spectral-norm parametrisation
(``torch.nn.utils.parametrizations.spectral_norm``'s keys: ``parametrizations.weight.original`` / ``._u`` /
``._v``) are traiNNer-redux's, so its ``net_d`` checkpoints load with ``strict=True``.

Size requirement: the skip additions need sides divisible by 8. Such inputs run exactly as traiNNer-redux runs
them; other sizes (which traiNNer-redux rejects) are padded at the bottom/right to the next multiple of 8
(reflect, then edge) and the logit map cropped back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrizations, parametrize

from anysr.archs.arch_util import ArchArgumentError, pad_to_multiple
from anysr.archs.plksr_arch import DySample
from anysr.archs.recognition.layouts import register_layout
from anysr.registry import ARCH_REGISTRY

_LEVELS = 3  # encoder stages; the input side must be a multiple of 2**_LEVELS


class _SpectralNorm(parametrizations._SpectralNorm):
    """torch's parametrised spectral norm (the same power iteration, buffers ``_u`` / ``_v`` and keys) with
    sigma = sum(u * W v): ``torch.vdot``, which torch's uses, has no ONNX export nor XLA lowering."""

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        if weight.ndim == 1:
            return super().forward(weight)
        mat = self._reshape_weight_to_matrix(weight)
        if self.training:
            self._power_method(mat, self.n_power_iterations)
        u = self._u.clone(memory_format=torch.contiguous_format)
        v = self._v.clone(memory_format=torch.contiguous_format)
        return weight / (u * torch.mv(mat, v)).sum()


def spectral_norm(conv: nn.Conv2d) -> nn.Conv2d:
    """``conv`` with its weight spectrally normalised (one power iteration per training forward)."""
    parametrize.register_parametrization(conv, "weight", _SpectralNorm(conv.weight))
    return conv


class Down(nn.Sequential):
    """Halve the resolution and double the width: spectral-normalised 3x3 stride-2 conv, Mish."""

    def __init__(self, dim: int) -> None:
        super().__init__(spectral_norm(nn.Conv2d(dim, dim * 2, 3, 2, 1)), nn.Mish(inplace=True))


class Up(nn.Sequential):
    """Double the resolution (DySample, 4 groups, no end conv) and halve the width (spectral-normalised 3x3)."""

    def __init__(self, dim: int) -> None:
        super().__init__(DySample(dim, dim, 2, 4, end_convolution=False),
                         spectral_norm(nn.Conv2d(dim, dim // 2, 3, 1, 1)))


@ARCH_REGISTRY.register()
class DUnet(nn.Module):
    """traiNNer-redux's DUnet discriminator: an image (``num_in_ch`` channels) to a one-channel logit map of
    its size. ``num_feat``: the stem width (a multiple of 2 so that the narrowest DySample's 4 groups divide
    ``2 * num_feat``)."""

    tile_multiple = 2**_LEVELS

    def __init__(self, num_in_ch: int = 3, num_feat: int = 64) -> None:
        super().__init__()
        if num_in_ch < 1:
            raise ArchArgumentError("num_in_ch", f"must be >= 1, got {num_in_ch}")
        if num_feat < 2 or num_feat % 2:
            raise ArchArgumentError("num_feat", f"must be an even number >= 2 (DySample splits 2 x num_feat "
                                                f"channels into 4 groups), got {num_feat}")
        f = num_feat
        self.in_to_dim = nn.Conv2d(num_in_ch, f, 3, 1, 1)
        self.e_x1 = Down(f)
        self.e_x2 = Down(f * 2)
        self.e_x3 = Down(f * 4)
        self.up1 = Up(f * 8)
        self.up2 = Up(f * 4)
        self.up3 = Up(f * 2)
        self.end_conv = nn.Sequential(
            spectral_norm(nn.Conv2d(f, f, 3, 1, 1, bias=False)),
            nn.Mish(inplace=True),
            spectral_norm(nn.Conv2d(f, f, 3, 1, 1, bias=False)),
            nn.Mish(inplace=True),
            nn.Conv2d(f, 1, 3, 1, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        x, _, _ = pad_to_multiple(x, self.tile_multiple)
        s0 = self.in_to_dim(x)
        s1 = self.e_x1(s0)
        s2 = self.e_x2(s1)
        y = self.up1(self.e_x3(s2)) + s2
        y = self.up2(y) + s1
        y = self.up3(y) + s0
        return self.end_conv(y)[..., :h, :w]


# neosr's ``dunet`` is the same network with torch's old spectral-norm hooks: ``weight_orig`` / ``weight_u`` /
# ``weight_v`` (the same tensors and shapes as the parametrisation's ``original`` / ``0._u`` / ``0._v``)
_OLD_SN = {"weight_orig": "parametrizations.weight.original", "weight_u": "parametrizations.weight.0._u",
           "weight_v": "parametrizations.weight.0._v"}


def _is_old_spectral_norm_dunet(sd: Mapping[str, Any]) -> bool:
    return "in_to_dim.weight" in sd and "e_x1.0.weight_orig" in sd and "end_conv.4.weight" in sd


def _from_old_spectral_norm(sd: Mapping[str, Any]) -> dict[str, Any]:
    """``<module>.weight_orig`` / ``weight_u`` / ``weight_v`` to the parametrisation's names; others kept."""
    out: dict[str, Any] = {}
    for k, v in sd.items():
        module, _, leaf = k.rpartition(".")
        out[f"{module}.{_OLD_SN[leaf]}" if module and leaf in _OLD_SN else k] = v
    return out


register_layout("DUnet", "neosr's dunet layout (old spectral-norm weight_orig / weight_u / weight_v names)",
                _is_old_spectral_norm_dunet, _from_old_spectral_norm)

__all__ = ["DUnet"]

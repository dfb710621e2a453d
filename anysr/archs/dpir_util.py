"""Layer-string building blocks of Kai Zhang's KAIR / DPIR networks (DnCNN, DRUNet, FBCNN).

The authors describe a stage by a string of letters, one layer each (``"CBR"``: conv, batch norm, ReLU), and
flatten consecutive stages into one ``nn.Sequential``; a stage of a single layer is kept as that layer (no
container). The state-dict keys of released checkpoints follow from that layout, so it is reproduced exactly
here: ``layers`` turns a string into modules, ``chain`` flattens and unwraps as the authors' helper does.

Letters: ``C`` conv, ``T`` transposed conv, ``B`` batch norm (momentum 0.9, eps 1e-4), ``I`` instance norm,
``R``/``r`` ReLU, ``L``/``l`` LeakyReLU (slope 0.2), ``2``/``3``/``4`` PixelShuffle, ``U``/``u``/``v`` nearest
upsampling x2/x3/x4, ``M``/``A`` max / average pooling.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError, NearestUpsample

ACTIVATION_LETTERS = frozenset("BIRrLl")
DOWNSAMPLE_MODES = ("avgpool", "maxpool", "strideconv")
UPSAMPLE_MODES = ("upconv", "pixelshuffle", "convtranspose")


def _one_layer(letter: str, cin: int, cout: int, kernel_size: int, stride: int, padding: int, bias: bool,
               slope: float) -> nn.Module:
    if letter == "C":
        return nn.Conv2d(cin, cout, kernel_size, stride, padding, bias=bias)
    if letter == "T":
        return nn.ConvTranspose2d(cin, cout, kernel_size, stride, padding, bias=bias)
    if letter == "B":
        return nn.BatchNorm2d(cout, momentum=0.9, eps=1e-4, affine=True)
    if letter == "I":
        return nn.InstanceNorm2d(cout, affine=True)
    if letter in "Rr":
        return nn.ReLU(inplace=letter == "R")
    if letter in "Ll":
        return nn.LeakyReLU(slope, inplace=letter == "L")
    if letter in "234":
        return nn.PixelShuffle(int(letter))
    if letter in "Uuv":
        return NearestUpsample("Uuv".index(letter) + 2)
    if letter == "M":
        return nn.MaxPool2d(kernel_size, stride)
    if letter == "A":
        return nn.AvgPool2d(kernel_size, stride)
    raise ArchArgumentError("act_mode", f"unknown layer letter {letter!r}")


def layers(mode: str, cin: int = 64, cout: int = 64, kernel_size: int = 3, stride: int = 1, padding: int = 1,
           bias: bool = True, slope: float = 0.2) -> list[nn.Module]:
    """One module per letter of ``mode`` (see the module docstring); norms take ``cout`` channels."""
    return [_one_layer(t, cin, cout, kernel_size, stride, padding, bias, slope) for t in mode]


def _stage(part: nn.Module | Iterable[nn.Module]) -> nn.Module:
    """A list of layers as one stage: the layer itself when there is one, else an ``nn.Sequential``."""
    if isinstance(part, nn.Module):
        return part
    mods = list(part)
    return mods[0] if len(mods) == 1 else nn.Sequential(*mods)


def chain(*parts: nn.Module | Iterable[nn.Module]) -> nn.Module:
    """The stages ``parts`` (modules, or lists of layers) as the authors' ``sequential`` lays them out: a single
    stage comes back as it is; several are flattened (an ``nn.Sequential`` contributes its children) into one
    ``nn.Sequential``. This decides the state-dict keys."""
    stages = [_stage(p) for p in parts]
    if len(stages) == 1:
        return stages[0]
    flat: list[nn.Module] = []
    for stage in stages:
        flat.extend(stage.children() if isinstance(stage, nn.Sequential) else [stage])
    return nn.Sequential(*flat)


def check_act_mode(act_mode: str) -> None:
    """Raise ArchArgumentError unless ``act_mode`` is norm / activation letters with at least one activation."""
    if not isinstance(act_mode, str) or not act_mode or set(act_mode) - ACTIVATION_LETTERS or not (
            set(act_mode) & set("RrLl")):
        raise ArchArgumentError("act_mode", f"expected norm / activation letters from 'B', 'I', 'R', 'L' with "
                                f"at least one activation (e.g. 'R', 'BR', 'L'), got {act_mode!r}")


class ResBlock(nn.Module):
    """``x + res(x)``, ``res`` built from a layer string such as ``"CRC"`` (channels kept)."""

    def __init__(self, channels: int, mode: str = "CRC", bias: bool = True) -> None:
        super().__init__()
        if mode[0] in "RL":  # an activation first must not overwrite the block's input
            mode = mode[0].lower() + mode[1:]
        self.res = chain(layers(mode, channels, channels, bias=bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.res(x)


def downsample(kind: str, cin: int, cout: int, bias: bool) -> list[nn.Module]:
    """Halve the size: a 2x2 stride-2 conv, or a 2x2 pool followed by a 3x3 conv."""
    if kind == "strideconv":
        return layers("C", cin, cout, 2, 2, 0, bias)
    if kind == "avgpool":
        return [nn.AvgPool2d(2, 2), *layers("C", cin, cout, 3, 1, 1, bias)]
    if kind == "maxpool":
        raise ArchArgumentError("downsample_mode", "the authors' 'maxpool' downsampler is followed by an unpadded "
                                "3x3 conv, so its features cannot meet the skip connections (no checkpoint can "
                                "exist); 'avgpool' has the same keys")
    raise ArchArgumentError("downsample_mode", f"expected one of {', '.join(DOWNSAMPLE_MODES)}, got {kind!r}")


def upsample(kind: str, cin: int, cout: int, bias: bool) -> list[nn.Module]:
    """Double the size: 2x2 stride-2 transposed conv, conv + PixelShuffle, or nearest upsampling + conv."""
    if kind == "convtranspose":
        return layers("T", cin, cout, 2, 2, 0, bias)
    if kind == "pixelshuffle":
        return layers("C2", cin, cout * 4, 3, 1, 1, bias)
    if kind == "upconv":
        return layers("UC", cin, cout, 3, 1, 1, bias)
    raise ArchArgumentError("upsample_mode", f"expected one of {', '.join(UPSAMPLE_MODES)}, got {kind!r}")


def append_noise_map(x: torch.Tensor, in_nc: int, level: float | torch.Tensor) -> torch.Tensor:
    """``x`` with a constant noise-level channel appended when it has ``in_nc - 1`` channels (DPIR's denoisers
    read the noise standard deviation, in [0, 1] units, as their last input channel); unchanged with ``in_nc``.

    ``level``: a float or a tensor broadcastable to (batch, 1, 1, 1)."""
    if x.shape[1] == in_nc:
        return x
    if x.shape[1] != in_nc - 1:
        raise ValueError(f"expected {in_nc - 1} image channels (+ the noise map) or {in_nc}, got {x.shape[1]}")
    b, _, h, w = x.shape
    if isinstance(level, torch.Tensor):
        noise = level.to(device=x.device, dtype=x.dtype).reshape(-1, 1, 1, 1).expand(b, 1, h, w)
    else:
        noise = torch.full((b, 1, h, w), float(level), device=x.device, dtype=x.dtype)
    return torch.cat([x, noise], dim=1)


__all__ = ["ResBlock", "append_noise_map", "chain", "check_act_mode", "downsample", "layers", "upsample"]

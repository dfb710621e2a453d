"""KBNet: kernel basis network for image restoration (Zhang et al., "KBNet: Kernel Basis Network for Image
Restoration", 2023), the U-Net variant ``KBNet_s``.

Module names and constructor arguments follow spandrel 0.4.2's ``KBNet_s``, so released checkpoints (denoising,
deraining, deblurring) load with ``strict=True`` and give the same output. A NAFNet-like U-Net: a 3x3 stem, encoder
stages of KB blocks each followed by a stride-2 2x2 conv, middle blocks, decoder stages after a 1x1 conv and a
pixel shuffle plus the encoder's map, a 3x3 conv back to the image, plus the input.

A KB block applies *kernel basis attention* (KBA): every pixel mixes its ``k x k`` neighbourhood with a per-pixel
kernel, a blend (by ``nset`` predicted coefficients) of ``nset`` learned grouped kernels and biases; the result is
gated by a depth-wise branch and channel attention, then a gated feed-forward follows. Here KBA is plain tensor
algebra (the neighbourhoods from padded slices rather than ``unfold``, autograd instead of the reference's
hand-written backward): the same numbers, and it runs on XLA and exports to ONNX.

Size requirement: none. The input is zero-padded at the bottom / right to ``2 ** len(enc_blk_nums)`` (as the
reference pads) and the output cropped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, LayerNorm2d
from anysr.archs.recognise import NotThisFamily, StateShapes, register_recogniser
from anysr.registry import ARCH_REGISTRY


class SimpleGate(nn.Module):
    """The first half of the channels times the second."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=1)
        return a * b


def neighbourhoods(x: torch.Tensor, k: int) -> torch.Tensor:
    """(b, c, h, w) -> (b, c, k*k, h, w): each pixel's zero-padded ``k x k`` neighbourhood, row-major (the values and
    order of ``F.unfold(x, k, padding=k // 2)``)."""
    h, w = x.shape[-2:]
    p = k // 2
    padded = F.pad(x, (p, p, p, p))
    return torch.stack([padded[:, :, i:i + h, j:j + w] for i in range(k) for j in range(k)], dim=2)


def kernel_basis_attention(x: torch.Tensor, att: torch.Tensor, k: int, groups: int, bias: torch.Tensor,
                           weight: torch.Tensor) -> torch.Tensor:
    """Per pixel, ``sum_s att_s * (W_s * neighbourhood + b_s)`` with grouped kernels ``W_s``.

    ``x``: (b, c, h, w); ``att``: (b, nset, h, w) coefficients; ``bias``: (1, nset, c); ``weight``: (1, nset,
    c * (c / groups) * k * k), each set's kernel as (group, output channel, input channel, tap).
    """
    b, c, h, w = x.shape
    nset, cg, taps = att.shape[1], c // groups, k * k
    coeff = att.reshape(b, nset, h * w).transpose(1, 2)  # (b, hw, nset)
    kernels = (coeff @ weight).reshape(b, h * w, groups, cg, cg * taps)
    patches = neighbourhoods(x, k).reshape(b, groups, cg * taps, h * w).permute(0, 3, 1, 2).unsqueeze(-1)
    out = (kernels @ patches).reshape(b, h * w, c) + coeff @ bias
    return out.transpose(1, 2).reshape(b, c, h, w)


class KBBlock_s(nn.Module):  # noqa: N801 - the original's module name
    """KB block: ``y = x + beta * conv3(KBA-gated(norm1(x)))``, then ``y + gamma * conv5(gate(conv4(norm2(y))))``."""

    def __init__(self, c: int, DW_Expand: int = 2, FFN_Expand: int = 2, nset: int = 32, k: int = 3,  # noqa: N803
                 gc: int = 4, lightweight: bool = False) -> None:
        super().__init__()
        self.k, self.c, self.nset = k, c, nset
        dw_ch, ffn_ch = int(c * DW_Expand), int(FFN_Expand * c)
        self.g = c // gc
        self.w = nn.Parameter(torch.zeros(1, nset, c * c // self.g * k**2))
        self.b = nn.Parameter(torch.zeros(1, nset, c))
        nn.init.kaiming_uniform_(self.w, a=math.sqrt(5))
        bound = 1 / math.sqrt(nn.init._calculate_fan_in_and_fan_out(self.w)[0])
        nn.init.uniform_(self.b, -bound, bound)
        self.norm1 = LayerNorm2d(c)
        self.norm2 = LayerNorm2d(c)
        self.sca = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(c, c, 1))
        if lightweight:
            self.conv11 = nn.Sequential(nn.Conv2d(c, c, 1), nn.Conv2d(c, c, 3, 1, 1, groups=c))
        else:
            self.conv11 = nn.Sequential(nn.Conv2d(c, c, 1), nn.Conv2d(c, c, 5, 1, 2, groups=c // 4))
        self.conv1 = nn.Conv2d(c, c, 1)
        self.conv21 = nn.Conv2d(c, c, 3, 1, 1, groups=c)
        interc = min(c, 32)
        self.conv2 = nn.Sequential(nn.Conv2d(c, interc, 3, 1, 1, groups=interc), SimpleGate(),
                                   nn.Conv2d(interc // 2, nset, 1))
        self.conv211 = nn.Conv2d(c, nset, 1)
        self.conv3 = nn.Conv2d(dw_ch // 2, c, 1)
        self.conv4 = nn.Conv2d(c, ffn_ch, 1)
        self.conv5 = nn.Conv2d(ffn_ch // 2, c, 1)
        self.ga1 = nn.Parameter(torch.full((1, c, 1, 1), 1e-2))
        self.attgamma = nn.Parameter(torch.full((1, nset, 1, 1), 1e-2))
        self.sg = SimpleGate()
        self.beta = nn.Parameter(torch.full((1, c, 1, 1), 1e-2))
        self.gamma = nn.Parameter(torch.full((1, c, 1, 1), 1e-2))

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        x = self.norm1(inp)
        sca = self.sca[1](x.mean(dim=(2, 3), keepdim=True))  # the adaptive pool as a mean: the same numbers
        x1 = self.conv11(x)
        att = self.conv2(x) * self.attgamma + self.conv211(x)
        uf = self.conv21(self.conv1(x))
        x = kernel_basis_attention(uf, att, self.k, self.g, self.b, self.w) * self.ga1 + uf
        y = inp + self.conv3(x * x1 * sca) * self.beta
        return y + self.conv5(self.sg(self.conv4(self.norm2(y)))) * self.gamma


@ARCH_REGISTRY.register()
class KBNet_s(nn.Module):  # noqa: N801 - the original's class name
    """KBNet's U-Net (see the module docstring)."""

    def __init__(self, *, img_channel: int = 3, width: int = 64, middle_blk_num: int = 12,
                 enc_blk_nums: Sequence[int] = (2, 2, 4, 8), dec_blk_nums: Sequence[int] = (2, 2, 2, 2),
                 lightweight: bool = False, ffn_scale: int = 2) -> None:
        super().__init__()
        if len(enc_blk_nums) != len(dec_blk_nums):
            raise ArchArgumentError("dec_blk_nums", f"KBNet_s needs one decoder stage per encoder stage: "
                                    f"enc_blk_nums {list(enc_blk_nums)}, dec_blk_nums {list(dec_blk_nums)}")
        stages = [width * 2**i for i in range(len(enc_blk_nums) + 1)]
        if width < 4 or width % 4 or any(c > 32 and c % 32 for c in stages):
            raise ArchArgumentError("width", f"KBNet_s needs a width that is a multiple of 4 whose stage widths "
                                    f"{stages} are each at most 32 or a multiple of 32 (its grouped convs), not "
                                    f"{width}")
        self.num_in_ch = img_channel
        self.intro = nn.Conv2d(img_channel, width, 3, 1, 1)
        self.ending = nn.Conv2d(width, img_channel, 3, 1, 1)
        self.encoders, self.downs, self.ups, self.decoders = (nn.ModuleList() for _ in range(4))
        chan = width
        for num in enc_blk_nums:
            self.encoders.append(nn.Sequential(*[KBBlock_s(chan, FFN_Expand=ffn_scale, lightweight=lightweight)
                                                 for _ in range(num)]))
            self.downs.append(nn.Conv2d(chan, 2 * chan, 2, 2))
            chan *= 2
        self.middle_blks = nn.Sequential(*[KBBlock_s(chan, FFN_Expand=ffn_scale, lightweight=lightweight)
                                           for _ in range(middle_blk_num)])
        for num in dec_blk_nums:
            self.ups.append(nn.Sequential(nn.Conv2d(chan, chan * 2, 1, bias=False), nn.PixelShuffle(2)))
            chan //= 2
            self.decoders.append(nn.Sequential(*[KBBlock_s(chan, FFN_Expand=ffn_scale, lightweight=lightweight)
                                                 for _ in range(num)]))
        self.padder_size = 2 ** len(self.encoders)
        self.tile_multiple = self.padder_size

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        h, w = inp.shape[-2:]
        m = self.padder_size
        inp = F.pad(inp, (0, (-w) % m, 0, (-h) % m))
        x = self.intro(inp)
        skips = []
        for encoder, down in zip(self.encoders, self.downs, strict=True):
            x = encoder(x)
            skips.append(x)
            x = down(x)
        x = self.middle_blks(x)
        for decoder, up, skip in zip(self.decoders, self.ups, skips[::-1], strict=True):
            x = decoder(up(x) + skip)
        return (self.ending(x) + inp)[:, :, :h, :w]


def _recognise(s: StateShapes) -> dict[str, object]:
    """KBNet_s from its tensors: image channels, width, blocks per stage, the FFN width and the light 3x3 branch."""
    width = s.dim("intro.weight", 0)
    first = next((k for k in s.keys() if k.endswith(".conv4.weight")), None)
    if first is None:
        raise NotThisFamily("no KB block")
    first = first[: -len("conv4.weight")]
    c = s.dim(first + "conv4.weight", 1)
    return {"img_channel": s.dim("intro.weight", 1), "width": width,
            "middle_blk_num": s.count("middle_blks."),
            "enc_blk_nums": [s.count(f"encoders.{i}.") for i in range(s.count("downs."))],
            "dec_blk_nums": [s.count(f"decoders.{i}.") for i in range(s.count("ups."))],
            "lightweight": s.dim(first + "conv11.1.weight", 2) == 3,
            "ffn_scale": s.dim(first + "conv4.weight", 0) // c}


register_recogniser("KBNet_s", _recognise)

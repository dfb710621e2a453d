"""ECBSR: edge-oriented convolution blocks for real-time SR (Zhang, Zhang & Zhang, ACM MM 2021).

Parameter names follow BasicSR 1.4.2's ``ECBSR``, so its checkpoints load with ``strict=True``.

Each edge-oriented convolution block (ECB) sums five branches: a 3x3 conv, a 1x1 conv feeding a 3x3 conv,
and three 1x1 convs feeding a fixed depthwise Sobel-x / Sobel-y / Laplacian filter with a learned per-channel
scale and bias (plus the identity with ``with_idt``). All branches are linear, so they fold into one 3x3 conv:

* in training mode the branches run separately (that is what makes the block train better);
* in eval mode the folded kernel is computed on the fly (as BasicSR does; same output to float rounding);
* ``ECBSR.reparameterize()`` replaces every ECB by its folded conv once and for all: the plain network of
  ``conv3x3`` + activation layers that is exported and deployed. Its state dict has the keys of the ECBSR
  authors' ``PlainSR`` (``backbone.<i>.conv3x3.*``, ``backbone.<i>.act.weight``); build that form directly with
  ``reparameterized=True`` to load such weights.

The 1x1 conv of a sequential branch sees the input zero-padded by one pixel, so the 3x3 filter after it sees
the 1x1 conv's bias on the border; this is what makes the folded conv (zero-padded input) exact at the edges.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits
from anysr.ops.autocast import autocast_off
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

ACTIVATIONS = ("prelu", "relu", "rrelu", "softplus", "linear")
SEQ_TYPES = ("conv1x1-conv3x3", "conv1x1-sobelx", "conv1x1-sobely", "conv1x1-laplacian")

# The fixed 3x3 edge filters of the three 'conv1x1-<edge>' branches.
_EDGE_FILTERS = {
    "conv1x1-sobelx": ((1.0, 0.0, -1.0), (2.0, 0.0, -2.0), (1.0, 0.0, -1.0)),
    "conv1x1-sobely": ((1.0, 2.0, 1.0), (0.0, 0.0, 0.0), (-1.0, -2.0, -1.0)),
    "conv1x1-laplacian": ((0.0, 1.0, 0.0), (1.0, -4.0, 1.0), (0.0, 1.0, 0.0)),
}


def _conv_init(out_ch: int, in_ch: int, k: int) -> tuple[nn.Parameter, nn.Parameter]:
    """Weight and bias initialised as ``nn.Conv2d`` initialises them (Kaiming-uniform, a=sqrt(5))."""
    weight = torch.empty(out_ch, in_ch, k, k)
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    bound = 1.0 / math.sqrt(in_ch * k * k)
    bias = torch.empty(out_ch).uniform_(-bound, bound)
    return nn.Parameter(weight), nn.Parameter(bias)


def _activation(act_type: str, channels: int) -> nn.Module | None:
    if act_type == "prelu":
        return nn.PReLU(num_parameters=channels)
    if act_type == "relu":
        return nn.ReLU(inplace=True)
    if act_type == "rrelu":
        return nn.RReLU(lower=-0.05, upper=0.05)
    if act_type == "softplus":
        return nn.Softplus()
    return None


def _check_act(act_type: str, owner: str) -> None:
    if act_type not in ACTIVATIONS:
        raise ArchArgumentError("act_type", f"{owner}: unknown act_type {act_type!r}; use one of "
                                f"{', '.join(ACTIVATIONS)}")


class SeqConv3x3(nn.Module):
    """A 1x1 conv followed by a 3x3 filter: a learned conv ('conv1x1-conv3x3', ``depth_multiplier`` x
    ``out_channels`` middle channels) or a fixed depthwise edge filter with learned per-channel scale and bias
    ('conv1x1-sobelx', 'conv1x1-sobely', 'conv1x1-laplacian').

    Parameters as BasicSR: ``k0``/``b0`` (1x1 conv), then ``k1``/``b1`` or ``scale``/``bias``/``mask``.
    """

    def __init__(self, seq_type: str, in_channels: int, out_channels: int, depth_multiplier: float = 1) -> None:
        super().__init__()
        if seq_type not in SEQ_TYPES:
            raise ArchArgumentError("seq_type", f"SeqConv3x3: unknown seq_type {seq_type!r}; use one of "
                                    f"{', '.join(SEQ_TYPES)}")
        self.seq_type = seq_type
        self.in_channels = in_channels
        self.out_channels = out_channels
        if seq_type == "conv1x1-conv3x3":
            self.mid_planes = int(out_channels * depth_multiplier)
            self.k0, self.b0 = _conv_init(self.mid_planes, in_channels, 1)
            self.k1, self.b1 = _conv_init(out_channels, self.mid_planes, 3)
        else:
            self.mid_planes = out_channels
            self.k0, self.b0 = _conv_init(out_channels, in_channels, 1)
            self.scale = nn.Parameter(torch.randn(out_channels, 1, 1, 1) * 1e-3)
            self.bias = nn.Parameter(torch.randn(out_channels) * 1e-3)
            edge = torch.tensor(_EDGE_FILTERS[seq_type])
            # A constant (never trained); kept in the state dict under BasicSR's key.
            self.register_buffer("mask", edge.expand(out_channels, 1, 3, 3).clone())

    def _second(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The 3x3 stage as (weight, bias, groups)."""
        if self.seq_type == "conv1x1-conv3x3":
            return self.k1, self.b1, 1
        return self.scale * self.mask, self.bias, self.out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Zero-padding the input before the 1x1 conv puts exactly b0 on the border (see the module docstring).
        y = F.conv2d(F.pad(x, (1, 1, 1, 1)), self.k0, self.b0)
        weight, bias, groups = self._second()
        return F.conv2d(y, weight, bias, groups=groups)

    def rep_params(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The equivalent single 3x3 conv: weight (out, in, 3, 3) and bias (out,)."""
        k0 = self.k0[:, :, 0, 0]  # (mid, in)
        if self.seq_type == "conv1x1-conv3x3":
            weight = torch.einsum("omyx,mi->oiyx", self.k1, k0)
            bias = self.b1 + torch.einsum("omyx,m->o", self.k1, self.b0)
        else:
            edge = (self.scale * self.mask)[:, 0]  # (out, 3, 3), one filter per channel
            weight = edge[:, None] * k0[:, :, None, None]
            bias = self.bias + self.b0 * edge.sum(dim=(1, 2))
        return weight, bias


class ECB(nn.Module):
    """Edge-oriented convolution block: five parallel linear branches (see the module docstring), then
    the activation ``act_type`` ('prelu', 'relu', 'rrelu', 'softplus' or 'linear' = none).

    ``with_idt`` adds the identity when ``in_channels == out_channels`` (ignored otherwise, as in BasicSR).
    """

    def __init__(self, in_channels: int, out_channels: int, depth_multiplier: float, act_type: str = "prelu",
                 with_idt: bool = False) -> None:
        super().__init__()
        _check_act(act_type, "ECB")
        self.depth_multiplier = depth_multiplier
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.act_type = act_type
        self.with_idt = bool(with_idt) and in_channels == out_channels
        self.conv3x3 = nn.Conv2d(in_channels, out_channels, 3, 1, 1)
        self.conv1x1_3x3 = SeqConv3x3("conv1x1-conv3x3", in_channels, out_channels, depth_multiplier)
        self.conv1x1_sbx = SeqConv3x3("conv1x1-sobelx", in_channels, out_channels)
        self.conv1x1_sby = SeqConv3x3("conv1x1-sobely", in_channels, out_channels)
        self.conv1x1_lpl = SeqConv3x3("conv1x1-laplacian", in_channels, out_channels)
        act = _activation(act_type, out_channels)
        if act is not None:
            self.act = act

    def _branches(self) -> Iterator[SeqConv3x3]:
        yield from (self.conv1x1_3x3, self.conv1x1_sbx, self.conv1x1_sby, self.conv1x1_lpl)

    def rep_params(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All branches (and the identity) folded into one 3x3 conv: weight (out, in, 3, 3), bias (out,)."""
        with autocast_off(self.conv3x3.weight):  # kernel folding stays in the weights' dtype
            weight, bias = self.conv3x3.weight, self.conv3x3.bias
            for branch in self._branches():
                w, b = branch.rep_params()
                weight, bias = weight + w, bias + b
            if self.with_idt:
                eye = torch.eye(self.out_channels, dtype=weight.dtype, device=weight.device)
                weight = weight + F.pad(eye[:, :, None, None], (1, 1, 1, 1))
        return weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            y = self.conv3x3(x)
            for branch in self._branches():
                y = y + branch(x)
            if self.with_idt:
                y = y + x
        else:
            weight, bias = self.rep_params()
            y = F.conv2d(x, weight, bias, padding=1)
        return self.act(y) if self.act_type != "linear" else y

    def extra_repr(self) -> str:
        return (f"in={self.in_channels}, out={self.out_channels}, depth_multiplier={self.depth_multiplier}, "
                f"act_type={self.act_type}, with_idt={self.with_idt}")


class PlainConv3x3(nn.Module):
    """One 3x3 conv + activation: an ECB after re-parameterisation (the authors' ``PlainSR`` layer)."""

    def __init__(self, in_channels: int, out_channels: int, act_type: str = "prelu") -> None:
        super().__init__()
        _check_act(act_type, "PlainConv3x3")
        self.act_type = act_type
        self.conv3x3 = nn.Conv2d(in_channels, out_channels, 3, 1, 1)
        act = _activation(act_type, out_channels)
        if act is not None:
            self.act = act

    @classmethod
    @torch.no_grad()
    def from_ecb(cls, ecb: ECB) -> PlainConv3x3:
        """The plain layer computing what ``ecb`` computes in eval mode (same device and dtype)."""
        weight, bias = ecb.rep_params()
        plain = cls(ecb.in_channels, ecb.out_channels, ecb.act_type).to(device=weight.device, dtype=weight.dtype)
        plain.conv3x3.weight.copy_(weight)
        plain.conv3x3.bias.copy_(bias)
        if ecb.act_type == "prelu":
            plain.act.weight.copy_(ecb.act.weight)
        return plain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv3x3(x)
        return self.act(y) if self.act_type != "linear" else y


@ARCH_REGISTRY.register()
class ECBSR(nn.Module):
    """ECBSR: an ECB from the input to ``num_channel`` features, ``num_block`` ECBs, an ECB (no activation) to
    ``num_out_ch * scale**2`` channels, the input added (repeated per sub-pixel), and a PixelShuffle.

    Args (BasicSR's, all required there): num_in_ch, num_out_ch, num_block, num_channel, with_idt (identity
    branch in blocks with equal in/out channels), act_type ('prelu', 'relu', 'rrelu', 'softplus', 'linear'),
    scale (any integer >= 1). reparameterized: build the plain (deployed) form; see ``reparameterize``.
    """

    tile_multiple: int = 1

    def __init__(self, num_in_ch: int, num_out_ch: int, num_block: int, num_channel: int, with_idt: bool,
                 act_type: str, scale: int, reparameterized: bool = False) -> None:
        super().__init__()
        _check_act(act_type, "ECBSR")
        if not isinstance(scale, int) or isinstance(scale, bool) or scale < 1:
            raise ArchArgumentError("scale", f"ECBSR needs an integer scale >= 1, got {scale!r}")
        if num_in_ch != 1 and num_in_ch != num_out_ch:
            raise ArchArgumentError("num_out_ch", f"ECBSR adds the input to the output: num_out_ch must equal "
                                    f"num_in_ch ({num_in_ch}) unless num_in_ch is 1, got {num_out_ch}")
        self.num_in_ch = num_in_ch
        self.num_out_ch = num_out_ch
        self.scale = scale
        self.reparameterized = False
        channels = [num_in_ch] + [num_channel] * (num_block + 1) + [num_out_ch * scale * scale]
        acts = [act_type] * (num_block + 1) + ["linear"]
        self.backbone = nn.Sequential(*(
            ECB(cin, cout, depth_multiplier=2.0, act_type=act, with_idt=with_idt)
            for cin, cout, act in zip(channels[:-1], channels[1:], acts)
        ))
        self.upsampler = nn.PixelShuffle(scale)
        if reparameterized:
            self.reparameterize()

    @torch.no_grad()
    def reparameterize(self) -> ECBSR:
        """Fold every ECB into one 3x3 conv (in place; the output stays the eval-mode output to float rounding).

        Afterwards the state dict holds only ``backbone.<i>.conv3x3.{weight,bias}`` (and ``act.weight`` for
        PReLU), the training branches are gone, and training continues on the plain convs. Returns ``self``.
        """
        if not self.reparameterized:
            self.backbone = nn.Sequential(*(PlainConv3x3.from_ecb(ecb) for ecb in self.backbone))
            self.backbone.train(self.training)
            self.reparameterized = True
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = torch.repeat_interleave(x, self.scale * self.scale, dim=1) if self.num_in_ch > 1 else x
        return self.upsampler(self.backbone(x) + shortcut)


__all__ = ["ECB", "ECBSR", "PlainConv3x3", "SeqConv3x3"]


def _recognise(s: StateShapes) -> list[dict]:
    """ECBSR from its tensors (training form or reparameterised): a chain of ECBs whose last one feeds the
    PixelShuffle; the activation's PReLU weights show 'prelu' (weightless ones look alike: ReLU is proposed).
    ``with_idt`` changes no tensor: BasicSR's published setting (False) is kept."""
    idx = s.indices("backbone.")
    first, last = s.shape("backbone.0.conv3x3.weight"), s.shape(f"backbone.{idx[-1]}.conv3x3.weight")
    cin, width = first[1], first[0]
    common = {"num_in_ch": cin, "num_block": len(idx) - 2, "num_channel": width, "with_idt": False,
              "act_type": "prelu" if "backbone.0.act.weight" in s else "relu",
              "reparameterized": "backbone.0.conv1x1_3x3.k0" not in s}
    return [{"num_out_ch": out, "scale": scale, **common} for out, scale in shuffle_splits(last[0], (cin, 3, 1))]


register_recogniser("ECBSR", _recognise)


# The published models (ECBSR-M4C8 ... M16C64): the Y channel in and out, PReLU, no identity branch.
register_presets("ECBSR", scale_arg="scale", source="ECBSR", presets={
    f"ecbsr_m{m}c{c}": {"num_in_ch": 1, "num_out_ch": 1, "num_block": m, "num_channel": c, "with_idt": False,
                        "act_type": "prelu", "scale": 4}
    for m, c in ((4, 8), (4, 16), (10, 32), (16, 64))
})

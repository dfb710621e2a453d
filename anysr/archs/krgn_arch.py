"""KRGN: a lightweight SR network of dilated grouped-conv blocks (PMRBs) with dense fusion, as neosr trains it.

Module names and constructor arguments follow neosr's ``krgn`` (``krgn_arch.py``), so its checkpoints load with
``strict=True`` and give the same output. A 1x1 mean shift (a learned RGB conv, initially ``x - 0.5 * rgb_range``),
a 3x3 conv, ``n_resgroups`` PMRBs, a fusion of every group's output (1x1, leaky ReLU, 3x3) with a long skip, a conv
+ PixelShuffle head and a second mean shift (initially ``+ 0.5 * rgb_range``).

A PMRB (multi-receptive-field block): three residual groups in a chain (each: three steps
``y = conv3x3(y) + dilated_conv3x3(y)``, grouped by 32, then a shortcut); a 1x1 conv (half width, ``act``) taps the
chain before each group and a 3x3 conv (half width, ``act``) after the last; the four taps are concatenated, fused
by a 1x1 conv with leaky ReLU, gated by contrast-aware channel attention (``sigmoid(mlp(std + mean))`` over the
pixels) and added to the input.

neosr's module also defines a re-parameterised conv (a ``weight`` buffer and a learnable kernel transform) that its
network does not use (the groups hold plain convs): its checkpoints have no such tensors, and training and eval
compute the same (no batch norm, no dropout). The mean shifts are ordinary trainable parameters there (neosr's
``requires_grad = False`` sets an attribute of the module, not of its parameters), so they are here too; they are
built for 3 channels, so the network takes RGB only.
"""

from __future__ import annotations

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

GROUPS = 32  # the residual groups' convs are grouped by 32
ACTS = ("identity", "relu", "lrelu", "prelu")
NEG_SLOPE = 0.05


def activation(act: str) -> nn.Module:
    """neosr's activations: 'lrelu' with slope 0.05, 'prelu' with one parameter starting at 0.05."""
    act = act.lower()
    if act == "relu":
        return nn.ReLU(inplace=True)
    if act == "lrelu":
        return nn.LeakyReLU(NEG_SLOPE, inplace=True)
    if act == "prelu":
        return nn.PReLU(num_parameters=1, init=NEG_SLOPE)
    return nn.Identity()


class MeanShift(nn.Conv2d):
    """A 1x1 RGB conv initialised to ``x + sign * rgb_range * 0.5`` (trainable, as in neosr)."""

    def __init__(self, rgb_range: float, sign: float) -> None:
        super().__init__(3, 3, kernel_size=1)
        with torch.no_grad():
            self.weight.copy_(torch.eye(3).view(3, 3, 1, 1))
            self.bias.fill_(sign * rgb_range * 0.5)


class CCALayer(nn.Module):
    """Contrast-aware channel attention: ``x * sigmoid(mlp(std(x) + mean(x)))`` (statistics over the pixels)."""

    def __init__(self, channel: int, reduction: int = 8) -> None:
        super().__init__()
        self.conv_du = nn.Sequential(
            nn.Conv2d(channel, channel // reduction, 1), nn.LeakyReLU(NEG_SLOPE, inplace=True),
            nn.Conv2d(channel // reduction, channel, 1), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var, mean = torch.var_mean(x, dim=(2, 3), keepdim=True, correction=0)
        return x * self.conv_du(var.sqrt() + mean)


class RCG(nn.Module):
    """Three steps ``y = conv(y) + dilated_conv(y)`` (3x3, grouped by 32), then ``+ x``."""

    def __init__(self, channels: int, dilation: int) -> None:
        super().__init__()
        self.conv_acts = nn.Sequential(*(
            nn.Sequential(nn.Conv2d(channels, channels, 3, 1, d, d, groups=GROUPS))
            for _ in range(3) for d in (1, dilation)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for i in range(0, len(self.conv_acts), 2):
            y = self.conv_acts[i](y) + self.conv_acts[i + 1](y)
        return y + x


class PMRB(nn.Module):
    """Progressive multi-receptive-field block (see the module docstring)."""

    def __init__(self, channels: int, act: str, dilation: int) -> None:
        super().__init__()
        half = channels // 2
        self.blocks = nn.Sequential(*(RCG(channels, dilation) for _ in range(3)))
        self.conv1x1s = nn.Sequential(*(nn.Sequential(nn.Conv2d(channels, half, 1), activation(act))
                                        for _ in range(3)))
        self.conv3x3 = nn.Sequential(nn.Conv2d(channels, half, 3, 1, 1), activation(act))
        self.conv1x1_act = nn.Sequential(nn.Conv2d(2 * channels, channels, 1), nn.LeakyReLU(NEG_SLOPE, inplace=True))
        self.cca = CCALayer(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        taps = []
        y = x
        for tap, group in zip(self.conv1x1s, self.blocks, strict=True):
            taps.append(tap(y))
            y = group(y)
        taps.append(self.conv3x3(y))
        return self.cca(self.conv1x1_act(torch.cat(taps, dim=1))) + x


@ARCH_REGISTRY.register()
class KRGN(nn.Module):
    """KRGN (neosr's ``krgn``); the defaults are the published network.

    Args (neosr's): n_colors (image channels: 3, the mean shifts are RGB), n_feats (width, a multiple of 32),
    n_resgroups (PMRBs), act ('lrelu', 'relu', 'prelu' or 'identity': the PMRBs' taps), scale (integer >= 1),
    rgb_range (the mean shifts' initial 0.5 is of this range), dilation (the second conv of each step).
    """

    def __init__(self, n_colors: int = 3, n_feats: int = 64, n_resgroups: int = 9, act: str = "lrelu",
                 scale: int = 4, rgb_range: float = 1.0, dilation: int = 3) -> None:
        super().__init__()
        if n_colors != 3 or isinstance(n_colors, bool):
            raise ArchArgumentError("n_colors", f"KRGN's mean shifts are RGB: n_colors must be 3, got {n_colors!r}")
        for name, value, low in (("n_feats", n_feats, GROUPS), ("n_resgroups", n_resgroups, 0), ("scale", scale, 1),
                                 ("dilation", dilation, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ArchArgumentError(name, f"KRGN needs an integer {name} >= {low}, got {value!r}")
        if n_feats % GROUPS:
            raise ArchArgumentError("n_feats", f"KRGN's convs are grouped by {GROUPS}: n_feats must be a multiple "
                                    f"of {GROUPS}, got {n_feats}")
        if not isinstance(act, str) or act.lower() not in ACTS:
            raise ArchArgumentError("act", f"KRGN's act is one of {', '.join(ACTS)}, got {act!r}")
        self.scale = scale
        self.in_channels = n_colors
        self.sub_mean = MeanShift(rgb_range, -1.0)
        self.head_conv = nn.Conv2d(n_colors, n_feats, 3, 1, 1)
        self.body = nn.Sequential(*(PMRB(n_feats, act, dilation) for _ in range(n_resgroups)))
        self.features_fusion_module = nn.Sequential(
            nn.Conv2d(n_feats * (n_resgroups + 1), n_feats, 1), nn.LeakyReLU(NEG_SLOPE, inplace=True),
            nn.Conv2d(n_feats, n_feats, 3, 1, 1))
        self.upsampler = nn.Sequential(nn.Conv2d(n_feats, n_colors * scale**2, 3, 1, 1), nn.PixelShuffle(scale))
        self.add_mean = MeanShift(rgb_range, 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head_conv(self.sub_mean(x))
        outs = [x]
        for block in self.body:
            outs.append(block(outs[-1]))
        y = self.features_fusion_module(torch.cat(outs, dim=1)) + x
        return self.add_mean(self.upsampler(y))


__all__ = ["KRGN"]


def _recognise(s: StateShapes) -> list[dict] | None:
    """KRGN from its tensors: the mean shifts, width from the head conv, the PMRBs (their dilation is in no
    tensor: neosr's 3), the taps' activation (a PReLU leaves a parameter; relu and lrelu none: lrelu, the
    default) and the head's scale."""
    if s.shape("sub_mean.weight") != (3, 3, 1, 1) or "add_mean.bias" not in s:
        return None
    n_feats, colors = s.shape("head_conv.weight")[:2]
    groups = s.count("body.")
    args = {"n_colors": colors, "n_feats": n_feats, "n_resgroups": groups}
    if groups and "body.0.conv3x3.1.weight" in s:
        args["act"] = "prelu"
    return [{**args, "scale": sc} for c, sc in shuffle_splits(s.dim("upsampler.0.weight", 0), (colors,))]


register_recogniser("KRGN", _recognise)
# neosr's name: the class defaults (neosr's), the option file's top-level scale
register_presets("KRGN", scale_arg="scale", source="neosr", presets={"krgn": {}})

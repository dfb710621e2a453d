"""RCAN in its authors' layout (Zhang et al., 2018), as spandrel 0.4.2 and traiNNer-redux build it.

anysr's ``RCAN`` (``rcan_arch.py``) is BasicSR's port: the same network under other tensor names
(``conv_first``, ``body.N.residual_group``, ``conv_last``) and arguments (``num_in_ch``, ``num_feat``, ...), which
BasicSR's option files and weights use with ``type: RCAN``. ``RCANOriginal`` keeps the authors' names (``head``,
``body``, ``tail``; ``sub_mean`` / ``add_mean`` with ``norm``) and traiNNer-redux's arguments and defaults, so the
weights spandrel and traiNNer-redux write load with ``strict=True`` and give the same output; traiNNer-redux's
``rcan``, ``rcan_unshuffle`` and ``rcan_l`` name it (the two classes load each other's weights only after renaming).

``unshuffle_mod`` (scale 1 or 2): the input is pixel-unshuffled by ``4 // scale`` and the body runs at a quarter
of the output size with a x4 tail; the input is padded (bottom / right, reflect) to a multiple of that factor and
the output cropped. ``res_scale`` is accepted and unused, as in both references.
"""

from __future__ import annotations

from torch import Tensor, nn

from anysr.archs.arch_util import ArchArgumentError, pad_to_multiple
from anysr.archs.man_arch import MeanShift
from anysr.archs.recognition.recognise import NotThisFamily, StateShapes, register_recogniser
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

ACTIVATIONS = ("relu", "leaky_relu", "elu", "silu", "gelu", "none")


def _activation(name: str) -> nn.Module:
    return {"relu": nn.ReLU, "leaky_relu": lambda: nn.LeakyReLU(0.2), "elu": nn.ELU, "silu": nn.SiLU,
            "gelu": nn.GELU, "none": nn.Identity}[name]()


def _conv(cin: int, cout: int, k: int) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, k, padding=k // 2)


class CALayer(nn.Module):
    """Channel attention: global mean, 1x1 conv down by ``reduction``, ReLU, 1x1 up, sigmoid gate."""

    def __init__(self, channel: int, reduction: int = 16) -> None:
        super().__init__()
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.conv_du = nn.Sequential(nn.Conv2d(channel, channel // reduction, 1), nn.ReLU(),
                                     nn.Conv2d(channel // reduction, channel, 1), nn.Sigmoid())

    def forward(self, x: Tensor) -> Tensor:
        return x * self.conv_du(self.avg_pool(x))


class RCAB(nn.Module):
    """``x + CA(conv(act(conv(x))))``."""

    def __init__(self, n_feat: int, kernel_size: int, reduction: int, act_mode: str) -> None:
        super().__init__()
        self.body = nn.Sequential(_conv(n_feat, n_feat, kernel_size), _activation(act_mode),
                                  _conv(n_feat, n_feat, kernel_size), CALayer(n_feat, reduction))

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x) + x


class ResidualGroup(nn.Module):
    """``n_resblocks`` RCABs and a conv, with a shortcut around them."""

    def __init__(self, n_feat: int, kernel_size: int, reduction: int, act_mode: str, n_resblocks: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*[RCAB(n_feat, kernel_size, reduction, act_mode) for _ in range(n_resblocks)],
                                  _conv(n_feat, n_feat, kernel_size))

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x) + x


class Upsampler(nn.Sequential):
    """3x3 conv + PixelShuffle(2) per factor of two, or one conv + PixelShuffle(3); empty at scale 1."""

    def __init__(self, scale: int, n_feat: int) -> None:
        steps = [3] if scale == 3 else [2] * (scale.bit_length() - 1)
        layers: list[nn.Module] = []
        for s in steps:
            layers += [_conv(n_feat, s * s * n_feat, 3), nn.PixelShuffle(s)]
        super().__init__(*layers)


@ARCH_REGISTRY.register()
class RCANOriginal(nn.Module):
    """RCAN, the authors' layout (traiNNer-redux's ``RCAN``).

    Args: scale: 1, 2, 3 or a power of two. n_resgroups / n_resblocks: groups and blocks per group. n_feats:
    width. n_colors: image channels. rgb_range / norm: with ``norm``, the input is scaled by ``rgb_range`` and
    the DIV2K RGB mean subtracted (added back at the end; RGB only). kernel_size: conv size. reduction: channel
    attention's squeeze. res_scale: unused. act_mode: relu, leaky_relu, elu, silu, gelu or none. unshuffle_mod:
    at scale 1 or 2, run the body on the pixel-unshuffled input (ignored at other scales, as in the references).
    """

    def __init__(self, scale: int = 4, n_resgroups: int = 10, n_resblocks: int = 20, n_feats: int = 64,
                 n_colors: int = 3, rgb_range: float = 255, norm: bool = False, kernel_size: int = 3,
                 reduction: int = 16, res_scale: float = 1, act_mode: str = "relu",
                 unshuffle_mod: bool = False) -> None:
        super().__init__()
        del res_scale
        if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1 or (scale != 3 and scale & (scale - 1)):
            raise ArchArgumentError("scale", f"RCANOriginal supports scale 3 and powers of two, got {scale!r}")
        if act_mode not in ACTIVATIONS:
            raise ArchArgumentError("act_mode", f"RCANOriginal has no activation {act_mode!r}; use one of "
                                    f"{', '.join(ACTIVATIONS)}")
        if n_feats // reduction < 1:
            raise ArchArgumentError("reduction", f"RCANOriginal needs n_feats // reduction >= 1, got n_feats="
                                    f"{n_feats}, reduction={reduction}")
        if norm and n_colors != 3:
            raise ArchArgumentError("norm", f"RCANOriginal's mean shift is RGB (n_colors 3), got n_colors={n_colors}")
        self.scale = scale
        self.rgb_range = float(rgb_range) if norm else 1.0
        self.sub_mean: nn.Module = MeanShift(rgb_range, sign=-1) if norm else nn.Identity()
        self.add_mean: nn.Module = MeanShift(rgb_range, sign=1) if norm else nn.Identity()
        self.downscale_factor = 4 // scale if unshuffle_mod and scale <= 2 else 1
        self.tile_multiple: int = self.downscale_factor
        if self.downscale_factor > 1:
            d = self.downscale_factor
            self.head = nn.Sequential(nn.PixelUnshuffle(d), _conv(n_colors * d * d, n_feats, kernel_size))
        else:
            self.head = nn.Sequential(_conv(n_colors, n_feats, kernel_size))
        self.body = nn.Sequential(*[ResidualGroup(n_feats, kernel_size, reduction, act_mode, n_resblocks)
                                    for _ in range(n_resgroups)], _conv(n_feats, n_feats, kernel_size))
        self.tail = nn.Sequential(Upsampler(4 if self.downscale_factor > 1 else scale, n_feats),
                                  _conv(n_feats, n_colors, kernel_size))

    def forward(self, x: Tensor) -> Tensor:
        h, w = x.shape[-2:]
        x, pad_h, pad_w = pad_to_multiple(x, self.downscale_factor)
        if self.rgb_range != 1.0:
            x = x * self.rgb_range
        x = self.head(self.sub_mean(x))
        x = self.add_mean(self.tail(self.body(x) + x))
        if self.rgb_range != 1.0:
            x = x / self.rgb_range
        return x[..., : h * self.scale, : w * self.scale] if pad_h or pad_w else x


__all__ = ["RCANOriginal"]


# traiNNer-redux's names: "rcan" is its RCAN class with its defaults (a preset, so that it wins over anysr's
# BasicSR ``RCAN`` in other letter case), the others its builders.
register_presets("RCANOriginal", scale_arg="scale", presets={
    "rcan": {},  # 15.59 M parameters at x4
    "rcan_unshuffle": {"unshuffle_mod": True},  # the x4 network below x4: unshuffle by 4 // scale
    "rcan_l": {"n_feats": 96},
})


def _scale(s: StateShapes, n_feats: int) -> int:
    convs = [s.dim(f"tail.0.{i}.weight", 0) for i in s.indices("tail.0.") if f"tail.0.{i}.weight" in s]
    if convs == [9 * n_feats]:
        return 3
    if all(c == 4 * n_feats for c in convs):
        return 2 ** len(convs)
    raise NotThisFamily("tail.0: no sub-pixel upsampler")


def _recognise(s: StateShapes) -> list[dict]:
    """RCANOriginal from its tensors: width, image channels and kernel from the head / tail convs, groups and
    blocks from the body, the squeeze from the attention's bottleneck, the scale from the tail's upsampler (with
    an unshuffling head, from the head's input channels), ``norm`` from the mean-shift convs."""
    n_feats = s.dim("body.0.body.0.body.0.weight", 0)
    n_colors = s.dim("tail.1.weight", 0)
    unshuffle = "head.1.weight" in s
    head = s.shape("head.1.weight" if unshuffle else "head.0.weight")
    scale = _scale(s, n_feats)
    if unshuffle:
        d = round((head[1] / n_colors) ** 0.5)
        if scale != 4 or d not in (2, 4):
            raise NotThisFamily("unshuffled head")
        scale = 4 // d
    hidden = s.dim("body.0.body.0.body.3.conv_du.0.weight", 0)
    common = {"scale": scale, "n_resgroups": s.count("body.") - 1, "n_resblocks": s.count("body.0.body.") - 1,
              "n_feats": n_feats, "n_colors": n_colors, "norm": "sub_mean.weight" in s, "kernel_size": head[-1],
              "unshuffle_mod": unshuffle}
    # n_feats // reduction == hidden: the default 16 first, else the smallest reduction that gives it
    factors = [16] + [f for f in range(n_feats // (hidden + 1) + 1, n_feats // hidden + 1) if f != 16]
    return [{**common, "reduction": f} for f in factors if n_feats // f == hidden][:2]


register_recogniser("RCANOriginal", _recognise)

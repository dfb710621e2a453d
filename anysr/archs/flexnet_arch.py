"""FlexNet and MetaFlexNet: window-attention SR networks with RWKV-style channel mixing by umzi2 / the
traiNNer-redux community (2024).

Module names and constructor arguments follow traiNNer-redux's ``FlexNet`` (``flexnet_arch.py``), so its
checkpoints load with ``strict=True`` and give the same output. A 3x3 stem and a conv shortcut; a pipeline of
transformer groups, each ``t_blocks`` transformer blocks (RMS norm, OmniShift then LMLT's single-head 8x8 window
attention with a depth-wise positional conv on the values, RMS norm, OmniShift then a squared-ReLU channel mix
gated by a sigmoid receptance) and a conv block fusing the group's input and output. The ``linear`` pipeline runs
the groups in a row at full size; the ``meta`` one (MetaFlexNet, the ``metaflexnet`` preset) is a four-level U-Net
of them (pixel-unshuffle down, pixel-shuffle up). The head is a conv + PixelShuffle, nearest upsampling with convs,
or DySample.

OmniShift (a re-parameterisable depth-wise mixer: ``a0 * x + a1 * dw1x1 + a2 * dw3x3 + a3 * dw5x5``) runs as one
5x5 depth-wise conv with the branches folded into its kernel in training (the same function and gradients, one
conv instead of three), and in eval mode as ``conv5x5_reparam``, refolded from the branches on each eval call as the
original refolds on ``eval()``; ``reparameterize()`` freezes the fold for export.

Size requirement: the input is reflect-padded inside forward to a multiple of 8 (linear; 64 for meta: 8x8 windows at
1/8 size) and the output cropped, so any size works; ``tile_multiple`` is that multiple. Attention runs through
``F.scaled_dot_product_attention``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, NearestUpsample, pad_to_multiple
from anysr.archs.lmlt_arch import DownsampleViT
from anysr.archs.plksr_arch import DySample
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits, width_ratio
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

UPSAMPLERS = ("pixelshuffle", "nearest+conv", "dysample")
PIPELINES = ("linear", "meta")
WINDOW = 8  # the positional conv reshapes every window to 8x8 (traiNNer-redux's get_lepe)


class ConvBlock(nn.Module):
    """``mish(conv3x3(mish(conv3x3(x)))) + conv1x1(x)``."""

    def __init__(self, in_channel: int = 3, out_channel: int = 48, strides: int = 1) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Conv2d(in_channel, out_channel, 3, strides, 1), nn.Mish(),
                                   nn.Conv2d(out_channel, out_channel, 3, strides, 1), nn.Mish())
        self.conv11 = nn.Conv2d(in_channel, out_channel, 1, strides, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x) + self.conv11(x)


class RMSNorm(nn.Module):
    """``torch.nn.RMSNorm(dim)`` over the last dimension (parameter ``weight``), written out so that the ONNX
    exporter takes it: computed in float32 at least, with that type's machine epsilon (as torch's kernel does for
    bf16 / fp16 inputs); the result has the input's dtype."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        work = torch.promote_types(x.dtype, torch.float32)
        xf = x.to(work)
        y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + torch.finfo(work).eps) * self.weight
        return y.to(x.dtype)


class OmniShift(nn.Module):
    """Depth-wise ``alpha[0] * x + alpha[1] * dw1x1 + alpha[2] * dw3x3 + alpha[3] * dw5x5`` (no biases): computed as
    one 5x5 depth-wise conv of the folded kernel while training; ``conv5x5_reparam`` (refolded) in eval mode."""

    def __init__(self, dim: int = 48) -> None:
        super().__init__()
        self.dim = dim
        self.conv1x1 = nn.Conv2d(dim, dim, 1, groups=dim, bias=False)
        self.conv3x3 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim, bias=False)
        self.conv5x5 = nn.Conv2d(dim, dim, 5, padding=2, groups=dim, bias=False)
        self.alpha = nn.Parameter(torch.randn(4))
        self.conv5x5_reparam = nn.Conv2d(dim, dim, 5, padding=2, groups=dim, bias=False)
        self.conv5x5_reparam.requires_grad_(False)  # derived, never trained
        self.folded = False

    def folded_weight(self) -> torch.Tensor:
        """The 5x5 depth-wise kernel of the four branches (differentiable in the branches)."""
        a = self.alpha
        centre = a[0] + a[1] * self.conv1x1.weight  # identity and 1x1 act on the centre tap
        return a[3] * self.conv5x5.weight + F.pad(a[2] * self.conv3x3.weight, (1, 1, 1, 1)) + F.pad(centre, (2,) * 4)

    @torch.no_grad()
    def reparam_5x5(self) -> None:
        """Write the folded branches into ``conv5x5_reparam``."""
        self.conv5x5_reparam.weight.copy_(self.folded_weight())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            return F.conv2d(x, self.folded_weight(), padding=2, groups=self.dim)
        if not self.folded:
            self.reparam_5x5()
        return self.conv5x5_reparam(x)


class LMLTVIT(DownsampleViT):
    """OmniShift, then LMLT's single-head window attention with the depth-wise positional term on the values
    (NCHW in and out)."""

    def __init__(self, dim: int = 48, window_size: int = WINDOW, attn_drop: float = 0.0,
                 proj_drop: float = 0.0) -> None:
        super().__init__(dim, window_size, attn_drop, proj_drop)
        self.omni_shift = OmniShift(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self.omni_shift(x))


class ChannelMix(nn.Module):
    """OmniShift, then ``sigmoid(receptance(x)) * value(key_norm(relu(key(x)) ** 2))`` per pixel (NCHW in, NHWC
    out)."""

    def __init__(self, n_embd: int = 48, hidden_rate: float = 4, key_norm: bool = False) -> None:
        super().__init__()
        hidden = int(hidden_rate * n_embd)
        self.n_embd = n_embd
        self.key = nn.Linear(n_embd, hidden, bias=False)
        self.omni_shift = OmniShift(n_embd)
        self.key_norm = RMSNorm(hidden) if key_norm else None
        self.receptance = nn.Linear(n_embd, n_embd, bias=False)
        self.value = nn.Linear(hidden, n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.omni_shift(x).permute(0, 2, 3, 1)
        k = torch.relu(self.key(x)).square()
        if self.key_norm is not None:
            k = self.key_norm(k)
        return torch.sigmoid(self.receptance(x)) * self.value(k)


class TransformerBlock(nn.Module):
    """``x + gamma1 * attention(rms_norm(x))``, then ``+ gamma2 * channel_mix(rms_norm(.))``, on NHWC maps."""

    def __init__(self, dim: int, window_size: int = WINDOW, hidden_rate: float = 4, channel_norm: bool = False,
                 attn_drop: float = 0.0, proj_drop: float = 0.0) -> None:
        super().__init__()
        self.rn1 = RMSNorm(dim)
        self.rn2 = RMSNorm(dim)
        self.att = LMLTVIT(dim, window_size, attn_drop, proj_drop)
        self.ffn = ChannelMix(dim, hidden_rate, channel_norm)
        self.gamma1 = nn.Parameter(torch.ones(dim))
        self.gamma2 = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.gamma1 * self.att(self.rn1(x).permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        return x + self.gamma2 * self.ffn(self.rn2(x).permute(0, 3, 1, 2))


class TransformerGroup(nn.Module):
    """``n_block`` transformer blocks, then a conv block on [input, result] (NCHW in and out); traiNNer-redux's
    ``LBlock`` (linear pipeline) and ``MBlock`` (meta pipeline), which differ only in their token layout."""

    def __init__(self, dim: int = 48, n_block: int = 1, window_size: int = WINDOW, hidden_rate: float = 4,
                 channel_norm: bool = False, attn_drop: float = 0.0, proj_drop: float = 0.0) -> None:
        super().__init__()
        self.t_blocks = nn.ModuleList(TransformerBlock(dim, window_size, hidden_rate, channel_norm, attn_drop,
                                                       proj_drop) for _ in range(n_block))
        self.conv = ConvBlock(dim * 2, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.permute(0, 2, 3, 1)
        for block in self.t_blocks:
            y = block(y)
        return self.conv(torch.cat([x, y.permute(0, 3, 1, 2)], dim=1))


class LinearPipeline(nn.Module):
    """The groups in a row, at full size."""

    def __init__(self, dim: int, num_blocks: Sequence[int], **group: Any) -> None:
        super().__init__()
        self.att = nn.ModuleList(TransformerGroup(dim, n, **group) for n in num_blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for group in self.att:
            x = group(x)
        return x


class Downsample(nn.Module):
    """3x3 conv to half the channels (no bias), PixelUnshuffle(2): twice the channels at half the size."""

    def __init__(self, n_feat: int = 48) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(n_feat, n_feat // 2, 3, 1, 1, bias=False), nn.PixelUnshuffle(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class Upsample(nn.Module):
    """3x3 conv (no bias), PixelShuffle(2): a quarter of the channels at twice the size."""

    def __init__(self, n_feat: int = 48) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(n_feat, n_feat, 3, 1, 1, bias=False), nn.PixelShuffle(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class MetaPipeline(nn.Module):
    """A four-level U-Net of groups (``num_blocks[0..3]`` blocks; the decoder reuses the first three counts): each
    level doubles the channels at half the size; the deepest result joins the level above it by concatenation."""

    def __init__(self, dim: int, num_blocks: Sequence[int], **group: Any) -> None:
        super().__init__()

        def level(width: int, n: int) -> nn.Sequential:
            return nn.Sequential(TransformerGroup(width, n, **group))

        n0, n1, n2, n3 = num_blocks[:4]
        self.enc0, self.enc1, self.enc2, self.enc3 = level(dim, n0), level(dim * 2, n1), level(dim * 4, n2), \
            level(dim * 8, n3)
        self.down1, self.down2, self.down3 = Downsample(dim), Downsample(dim * 2), Downsample(dim * 4)
        self.up1, self.up2, self.up3 = Upsample(dim * 16), Upsample(dim * 8), Upsample(dim * 4)
        self.dec0, self.dec1, self.dec2 = level(dim * 4, n2), level(dim * 2, n1), level(dim, n0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e0 = self.down1(self.enc0(x))
        e1 = self.down2(self.enc1(e0))
        e2 = self.down3(self.enc2(e1))
        x = self.dec0(self.up1(torch.cat([self.enc3(e2), e2], dim=1)))
        x = self.dec1(self.up2(torch.cat([x, e1], dim=1)))
        return self.dec2(self.up3(torch.cat([x, e0], dim=1)))


def _interpolate_upsampler(dim: int, out_ch: int, scale: int) -> nn.Sequential:
    """Per x2 (or one x3) step: conv, nearest upsampling, LeakyReLU(0.2); then conv, LeakyReLU, conv to ``out_ch``
    (traiNNer-redux's ``InterpolateUpsampler``; the layer positions are its)."""
    steps = [3] if scale == 3 else [2] * int(math.log2(scale))
    layers: list[nn.Module] = []
    for step in steps:
        layers += [nn.Conv2d(dim, dim, 3, 1, 1), NearestUpsample(step), nn.LeakyReLU(0.2)]
    layers += [nn.Conv2d(dim, dim, 3, 1, 1), nn.LeakyReLU(0.2), nn.Conv2d(dim, out_ch, 3, 1, 1)]
    return nn.Sequential(*layers)


def _check_args(scale: int, dim: int, num_blocks: Sequence[int], window_size: int, pipeline_type: str,
                upsampler: str) -> list[int]:
    if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
        raise ArchArgumentError("scale", f"FlexNet needs an integer scale >= 1, got {scale!r}")
    if upsampler not in UPSAMPLERS:
        raise ArchArgumentError("upsampler", f"FlexNet has no upsampler {upsampler!r}; use one of "
                                f"{', '.join(UPSAMPLERS)}")
    if upsampler == "nearest+conv" and scale != 3 and scale & (scale - 1):
        raise ArchArgumentError("scale", f"FlexNet's nearest+conv upsampler takes scale 3 or a power of 2, "
                                f"got {scale}")
    if upsampler == "dysample" and dim % 2:
        raise ArchArgumentError("dim", f"FlexNet's dysample upsampler splits 2 * dim channels into 4 groups: dim "
                                f"must be even, got {dim}")
    if pipeline_type not in PIPELINES:
        raise ArchArgumentError("pipeline_type", f"FlexNet has no pipeline_type {pipeline_type!r}; use linear or "
                                "meta")
    if window_size != WINDOW:
        raise ArchArgumentError("window_size", f"FlexNet's positional conv reshapes each window to 8x8 (as "
                                f"traiNNer-redux does): window_size must be 8, got {window_size!r}")
    counts = list(num_blocks)
    if not counts or any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in counts):
        raise ArchArgumentError("num_blocks", f"FlexNet needs a non-empty list of block counts >= 0, got "
                                f"{num_blocks!r}")
    if pipeline_type == "meta":
        if len(counts) < 4:
            raise ArchArgumentError("num_blocks", f"FlexNet's meta pipeline has 4 levels: num_blocks needs 4 "
                                    f"counts, got {num_blocks!r}")
        if dim % 2:
            raise ArchArgumentError("dim", f"FlexNet's meta pipeline halves dim before each pixel-unshuffle: dim "
                                    f"must be even, got {dim}")
    return counts


@ARCH_REGISTRY.register()
class FlexNet(nn.Module):
    """FlexNet: ``short_cut`` conv block and ``in_to_feat`` conv on the (padded) input, the pipeline on the
    latter, both concatenated into the head (``to_img``).

    Args (traiNNer-redux's): inp_channels / out_channels, scale (integer >= 1; nearest+conv: 3 or a power of 2),
    dim (width), num_blocks (transformer blocks per group: linear: one group each; meta: the 4 levels' counts, any
    further entries unused as in the original), window_size (8 only), hidden_rate (channel-mix width per dim),
    channel_norm (RMS norm inside the channel mix), attn_drop / proj_drop, pipeline_type ("linear" or "meta"),
    upsampler ("pixelshuffle", "nearest+conv" or "dysample").
    """

    tile_multiple: int = WINDOW  # set per instance: 64 for the meta pipeline

    def __init__(self, inp_channels: int = 3, out_channels: int = 3, scale: int = 4, dim: int = 64,
                 num_blocks: Sequence[int] = (6, 6, 6, 6, 6, 6), window_size: int = WINDOW,
                 hidden_rate: float = 4, channel_norm: bool = False, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 pipeline_type: str = "linear", upsampler: str = "pixelshuffle") -> None:
        super().__init__()
        counts = _check_args(scale, dim, num_blocks, window_size, pipeline_type, upsampler)
        self.register_buffer("window_size", torch.tensor(window_size, dtype=torch.uint8))  # a record in the files
        self.pipeline_type = pipeline_type
        self.scale = scale
        self.in_channels = inp_channels
        self.tile_multiple = WINDOW * (8 if pipeline_type == "meta" else 1)
        self.short_cut = ConvBlock(inp_channels, dim)
        self.in_to_feat = nn.Conv2d(inp_channels, dim, 3, 1, 1)
        group = {"window_size": window_size, "hidden_rate": hidden_rate, "channel_norm": channel_norm,
                 "attn_drop": attn_drop, "proj_drop": proj_drop}
        pipeline = MetaPipeline if pipeline_type == "meta" else LinearPipeline
        self.pipeline = pipeline(dim, counts, **group)
        self.to_img: nn.Module
        if upsampler == "nearest+conv":
            self.register_buffer("scale_factor", torch.tensor(scale, dtype=torch.uint8))
            self.to_img = nn.Sequential(nn.Conv2d(dim * 2, dim, 3, 1, 1), _interpolate_upsampler(dim, out_channels,
                                                                                                 scale))
        elif upsampler == "dysample":
            self.to_img = DySample(dim * 2, out_channels, scale)
        else:
            self.to_img = nn.Sequential(nn.Conv2d(dim * 2, out_channels * scale**2, 3, 1, 1), nn.PixelShuffle(scale))

    def reparameterize(self) -> FlexNet:
        """The deployment form: fold every OmniShift once and use the folded convs from then on (what export
        traces). The state dict keeps its keys; do not train it further."""
        for module in self.modules():
            if isinstance(module, OmniShift):
                module.reparam_5x5()
                module.folded = True
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        x = pad_to_multiple(x, self.tile_multiple)[0]
        x = torch.cat([self.pipeline(self.in_to_feat(x)), self.short_cut(x)], dim=1)
        return self.to_img(x)[..., : h * self.scale, : w * self.scale]


__all__ = ["FlexNet", "OmniShift", "TransformerGroup"]


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds. ``flexnet`` is the class with its defaults.
register_presets("FlexNet", scale_arg="scale", presets={
    "metaflexnet": {"num_blocks": (4, 6, 6, 8), "pipeline_type": "meta"},
})


def _recognise(s: StateShapes) -> list[dict]:
    """FlexNet from its tensors: width and image channels from the stem, the pipeline (meta: the ``enc0`` level)
    and its block counts, the channel mix's width and norm from the first block, and the head: PixelShuffle conv
    (channels and scale), DySample (offsets: the scale) or nearest+conv (the ``scale_factor`` record: its number
    of x2 steps; one step is x2 or x3, the record's value, when the file has values, says which)."""
    dim, inp = s.shape("in_to_feat.weight")[:2]
    args: dict = {"inp_channels": inp, "dim": dim}
    if s.has_prefix("pipeline.enc0."):
        args["pipeline_type"] = "meta"
        counts = [s.count(f"pipeline.enc{i}.0.t_blocks.") for i in range(4)]
        groups = [(f"pipeline.enc{i}.0.t_blocks.0.", dim * 2**i) for i in range(4)]
    else:
        counts = [s.count(f"pipeline.att.{i}.t_blocks.") for i in range(s.count("pipeline.att."))]
        groups = [(f"pipeline.att.{i}.t_blocks.0.", dim) for i in range(len(counts))]
    args["num_blocks"] = counts
    first = next(((p, c) for (p, c), n in zip(groups, counts, strict=True) if n), None)
    if first is not None:
        prefix, width = first
        args["hidden_rate"] = width_ratio(s.dim(f"{prefix}ffn.key.weight", 0), width, 4)
        args["channel_norm"] = f"{prefix}ffn.key_norm.weight" in s
    if "to_img.offset.weight" in s:
        scale = round((s.dim("to_img.offset.weight", 0) / 8) ** 0.5)
        return [{**args, "upsampler": "dysample", "out_channels": s.dim("to_img.end_conv.weight", 0),
                 "scale": scale}]
    if "scale_factor" in s:
        convs = [i for i in s.indices("to_img.1.") if f"to_img.1.{i}.weight" in s]
        steps = len(convs) - 2
        scales = [2**steps] + ([3] if steps == 1 else [])
        hint = s.integers("scale_factor")
        if hint and hint[0] in scales:
            scales.sort(key=lambda sc: sc != hint[0])
        out = s.dim(f"to_img.1.{convs[-1]}.weight", 0)
        return [{**args, "upsampler": "nearest+conv", "out_channels": out, "scale": sc} for sc in scales]
    return [{**args, "upsampler": "pixelshuffle", "out_channels": c, "scale": sc}
            for c, sc in shuffle_splits(s.dim("to_img.0.weight", 0), (inp, 3, 1, 4))]


register_recogniser("FlexNet", _recognise)

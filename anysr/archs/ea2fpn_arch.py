"""neosr's ``ea2fpn`` discriminator: an A2-FPN (Li et al., "A2-FPN for Semantic Segmentation of Fine-Resolution
Remotely Sensed Images", 2022) on a ResNet-18 encoder, with spectral-normalised convolutions, a linear-attention
aggregation of four pyramid levels and DySample upsamplers, giving a per-pixel map at the input's size.

Module names and constructor arguments are neosr's, so its discriminator checkpoints load with ``strict=True``: the
encoder is torchvision's ``resnet18`` layout under ``base_model.*`` (its unused ``fc`` included) and again under the
``layer_down0`` ... ``layer_down4`` names that share its modules. Spectral norms are ``torch.nn.utils.spectral_norm``
as in neosr (``weight_orig`` / ``weight_u`` / ``weight_v``; one power iteration per training-mode forward).

neosr starts the encoder from torchvision's ImageNet weights (downloaded); anysr reads no files: ``backbone_weights``
names a torchvision ``resnet18`` state dict that the GAN models hand to the engine, which loads it into the encoder
on a fresh run (without it the encoder starts from random weights, and the start-up log says so).

Size requirement: none for the caller. neosr's network needs sides that are multiples of 32 (the pyramid adds
upsampled maps to the encoder's); other sizes are padded (reflect, then edge) to one and the output cropped back.
Output: ``class_num`` channels (6 by default; the last DySample has no end convolution) at the input's size.

The encoder's ``fc`` and the DySample of the one segmentation block that does not upsample are in the state dict but
unused by the forward (as in neosr): they are frozen (``requires_grad`` False), so they keep their values as they
would in neosr's training.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn.utils import spectral_norm

from anysr.archs.arch_util import ArchArgumentError, pad_to_multiple
from anysr.archs.plksr_arch import DySample
from anysr.registry import ARCH_REGISTRY

MULTIPLE = 32  # the encoder's total stride


# ----------------------------------------------------------------------------- the encoder (torchvision's layout)

class BasicBlock(nn.Module):
    """ResNet's two-conv residual block (torchvision's ``BasicBlock`` names: conv1/bn1/conv2/bn2/downsample)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = x if self.downsample is None else self.downsample(x)
        return self.relu(self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x))))) + skip)


class ResNet18(nn.Module):
    """torchvision's ``resnet18`` (names, shapes and initialisation), so its state dicts load strictly."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        widths = (64, 64, 128, 256, 512)
        for i in range(1, 5):
            stride = 1 if i == 1 else 2
            self.add_module(f"layer{i}", nn.Sequential(BasicBlock(widths[i - 1], widths[i], stride),
                                                       BasicBlock(widths[i], widths[i], 1)))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ----------------------------------------------------------------------------- the pyramid

def _sn_conv(cin: int, cout: int, k: int, padding: int = 0, bias: bool = True) -> nn.Conv2d:
    return spectral_norm(nn.Conv2d(cin, cout, k, 1, padding, bias=bias))


class ConvGNMish(nn.Module):
    """Spectral-normalised conv (no bias), GroupNorm(8), Mish (neosr's ``ConvBnMish`` as ea2fpn uses it)."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = _sn_conv(cin, cout, 1, bias=False)
        self.bn = nn.GroupNorm(8, cout, eps=1e-5)
        self.mish = nn.Mish()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mish(self.bn(self.conv(x)))


class LinearAttention(nn.Module):
    """A2-FPN's attention: queries and keys L2-normalised over channels, softmax-free (a first-order Taylor
    expansion of exp), so its cost is linear in the positions; scaled by the learned ``gamma`` (zero at start)."""

    def __init__(self, channels: int, scale: int = 8, eps: float = 1e-6) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(1))
        self.eps = eps
        self.query_conv = nn.Conv2d(channels, channels // scale, 1)
        self.key_conv = nn.Conv2d(channels, channels // scale, 1)
        self.value_conv = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        n = h * w
        q = self.query_conv(x).flatten(2)  # (b, c', n)
        k = self.key_conv(x).flatten(2)
        v = self.value_conv(x).flatten(2)  # (b, c, n)
        q = q / torch.linalg.vector_norm(q, dim=1, keepdim=True)
        k = k / torch.linalg.vector_norm(k, dim=1, keepdim=True)
        denom = n + (q * (k.sum(-1, keepdim=True) + self.eps)).sum(1, keepdim=True)  # (b, 1, n)
        kv = k @ v.transpose(1, 2)  # (b, c', c)
        num = v.sum(-1, keepdim=True) + kv.transpose(1, 2) @ q  # (b, c, n)
        return self.gamma * (num / denom).reshape(b, c, h, w)


class AttentionAggregation(nn.Module):
    """The four levels concatenated, a 1x1 ConvGNMish, plus its linear attention."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.convblk = ConvGNMish(cin, cout)
        self.conv_atten = LinearAttention(cout)

    def forward(self, levels: Sequence[torch.Tensor]) -> torch.Tensor:
        feat = self.convblk(torch.cat(list(levels), dim=1))
        return feat + self.conv_atten(feat)


class Conv3x3GNMish(nn.Module):
    """Spectral-normalised 3x3 conv (no bias), GroupNorm(16), Mish, then a x2 DySample when ``upsample``. The
    DySample is built either way (neosr's state dicts hold it; neosr's is 64 wide whatever ``cout``, the same at
    the only width its forward runs with)."""

    def __init__(self, cin: int, cout: int, upsample: bool) -> None:
        super().__init__()
        self.upsample = upsample
        self.dysample = DySample(cout, cout, scale=2, groups=4, end_convolution=True)
        self.block = nn.Sequential(_sn_conv(cin, cout, 3, 1, bias=False), nn.GroupNorm(16, cout), nn.Mish())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block(x)
        return self.dysample(x) if self.upsample else x


class FPNBlock(nn.Module):
    """Top-down step: the coarser level upsampled x2 by DySample plus the 1x1-projected encoder map."""

    def __init__(self, pyramid_channels: int, skip_channels: int) -> None:
        super().__init__()
        self.skip_conv = nn.Conv2d(skip_channels, pyramid_channels, 1)
        self.dysample = DySample(pyramid_channels, pyramid_channels, scale=2, groups=4, end_convolution=False)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.dysample(x) + self.skip_conv(skip)


class SegmentationBlock(nn.Module):
    """``max(n_upsamples, 1)`` Conv3x3GNMish, each upsampling x2 when ``n_upsamples`` > 0 (to a quarter size)."""

    def __init__(self, cin: int, cout: int, n_upsamples: int) -> None:
        super().__init__()
        blocks = [Conv3x3GNMish(cin, cout, upsample=n_upsamples > 0)]
        blocks += [Conv3x3GNMish(cout, cout, upsample=True) for _ in range(1, n_upsamples)]
        self.block = nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


@ARCH_REGISTRY.register()
class EA2FPN(nn.Module):
    """neosr's ``ea2fpn``: ResNet-18 encoder (H/2 ... H/32), FPN top-down path with DySample, per-level
    segmentation heads to H/4, attention aggregation, a 1x1 spectral-normalised conv to ``class_num`` maps and a
    x4 DySample (3 sampling groups, no end conv) back to the input size.

    Args:
        class_num: output channels (a multiple of 3). encoder_channels: the encoder's widths, deepest first (fixed
        by ResNet-18: (512, 256, 128, 64)). pyramid_channels: FPN width (a multiple of 4). segmentation_channels:
        head width (a multiple of 16; neosr's code runs only with 64). dropout: Dropout2d rate before the last conv.
        backbone_weights: a torchvision ``resnet18`` state dict file for the encoder, read by the engine on a fresh
        run (neosr downloads ImageNet's); None: random encoder weights.
    """

    def __init__(self, class_num: int = 6, encoder_channels: Sequence[int] = (512, 256, 128, 64),
                 pyramid_channels: int = 64, segmentation_channels: int = 64, dropout: float = 0.0,
                 backbone_weights: str | None = None) -> None:
        super().__init__()
        if isinstance(class_num, bool) or not isinstance(class_num, int) or class_num < 3 or class_num % 3:
            raise ArchArgumentError("class_num", f"EA2FPN needs a positive multiple of 3 (the last DySample samples "
                                                 f"3 groups), got {class_num!r}")
        if not isinstance(encoder_channels, Sequence) or tuple(encoder_channels) != (512, 256, 128, 64):
            raise ArchArgumentError("encoder_channels", f"EA2FPN's ResNet-18 encoder has widths (512, 256, 128, 64), "
                                                        f"got {encoder_channels!r}")
        if isinstance(pyramid_channels, bool) or not isinstance(pyramid_channels, int) or pyramid_channels < 4 \
                or pyramid_channels % 4:
            raise ArchArgumentError("pyramid_channels", f"EA2FPN needs a positive multiple of 4 (DySample groups), "
                                                        f"got {pyramid_channels!r}")
        seg = segmentation_channels
        if isinstance(seg, bool) or not isinstance(seg, int) or seg < 16 or seg % 16:
            raise ArchArgumentError("segmentation_channels", f"EA2FPN needs a positive multiple of 16 (GroupNorm(16)), "
                                                             f"got {seg!r}")
        if not isinstance(dropout, int | float) or not 0 <= dropout < 1:
            raise ArchArgumentError("dropout", f"EA2FPN needs a rate in [0, 1), got {dropout!r}")
        if backbone_weights is not None and not isinstance(backbone_weights, str):
            raise ArchArgumentError("backbone_weights", f"EA2FPN needs a file path or null, got {backbone_weights!r}")
        self.backbone_weights = backbone_weights or None  # the engine reads it (architectures read no files)
        self.tile_multiple = MULTIPLE
        self.base_model = ResNet18()
        bm = self.base_model
        # neosr's names for the same modules (its state dicts hold both)
        self.layer_down0 = nn.Sequential(bm.conv1, bm.bn1, bm.relu)  # H/2, 64
        self.layer_down1 = nn.Sequential(bm.maxpool, bm.layer1)  # H/4, 64
        self.layer_down2 = bm.layer2  # H/8, 128
        self.layer_down3 = bm.layer3  # H/16, 256
        self.layer_down4 = bm.layer4  # H/32, 512
        enc, pyr = tuple(encoder_channels), pyramid_channels
        self.conv1 = spectral_norm(nn.Conv2d(enc[0], pyr, 1))
        self.p4 = FPNBlock(pyr, enc[1])
        self.p3 = FPNBlock(pyr, enc[2])
        self.p2 = FPNBlock(pyr, enc[3])
        self.s5 = SegmentationBlock(pyr, seg, 3)
        self.s4 = SegmentationBlock(pyr, seg, 2)
        self.s3 = SegmentationBlock(pyr, seg, 1)
        self.s2 = SegmentationBlock(pyr, seg, 0)
        self.attention = AttentionAggregation(seg * 4, seg * 4)
        self.final_conv = spectral_norm(nn.Conv2d(seg * 4, class_num, 1))
        self.dropout = nn.Dropout2d(p=dropout)
        self.dysample = DySample(class_num, 3, scale=4, groups=3, end_convolution=False)
        for m in self.modules():  # neosr's _init_weights (the encoder's unused fc included)
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        # in the state dict but never in the forward (neosr's too): frozen, so every trainable parameter gets a
        # gradient (DDP needs no find_unused_parameters; the values never change either way)
        bm.fc.requires_grad_(False)
        self.s2.block[0].dysample.requires_grad_(False)

    def backbone(self) -> nn.Module:
        """The encoder that ``backbone_weights`` (a torchvision ``resnet18`` state dict) loads into."""
        return self.base_model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        x, _, _ = pad_to_multiple(x, MULTIPLE)
        c2 = self.layer_down1(self.layer_down0(x))
        c3 = self.layer_down2(c2)
        c4 = self.layer_down3(c3)
        c5 = self.layer_down4(c4)
        p5 = self.conv1(c5)
        p4 = self.p4(p5, c4)
        p3 = self.p3(p4, c3)
        p2 = self.p2(p3, c2)
        out = self.attention((self.s5(p5), self.s4(p4), self.s3(p3), self.s2(p2)))
        out = self.final_conv(self.dropout(out))
        return self.dysample(out)[:, :, :h, :w]

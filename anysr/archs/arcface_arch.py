"""ResNet ArcFace: the face-identity network of GFPGAN's identity loss.

"ArcFace: Additive Angular Margin Loss for Deep Face Recognition" (Deng, Guo, Xue, Zafeiriou; CVPR 2019), as in
GFPGAN's ``gfpgan/archs/arcface_arch.py``: module names and constructor arguments are the authors', so their
``arcface_resnet18.pth`` (``block: IRBlock``, ``layers: [2, 2, 2, 2]``, ``use_se: false``) loads with ``strict=True``.

A 128 x 128 gray face (GFPGAN feeds the luma of its [-1, 1] output) goes through a 3x3 stem (batch norm, PReLU,
2x2 max pool), four residual stages (64, 128, 256, 512 channels; stages 2-4 halve the size) down to 8 x 8, then
batch norm, dropout, a linear layer of the flattened map and batch norm: a 512-d identity embedding. Size
requirement: exactly 128 x 128 (the linear layer reads an 8 x 8 map).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.registry import ARCH_REGISTRY


def conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    """A 3x3 convolution, padding 1, no bias."""
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)


def _frozen_batch_norm(bn: nn.modules.batchnorm._BatchNorm, x: torch.Tensor) -> torch.Tensor:
    """Eval-mode batch norm as its affine map of the running statistics (what ``F.batch_norm`` computes): the
    identity loss backpropagates through the frozen network to its input, and XLA lowers this map's gradient
    (the XLA backend's batch-norm backward failed for a network without trainable parameters)."""
    shape = (1, -1) + (1,) * (x.dim() - 2)
    scale = torch.rsqrt(bn.running_var + bn.eps)
    if bn.weight is not None:
        scale = scale * bn.weight
    shift = -bn.running_mean * scale + (bn.bias if bn.bias is not None else 0)
    return x * scale.view(shape).to(x.dtype) + shift.view(shape).to(x.dtype)


class _BatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d (same keys) whose eval mode is ``_frozen_batch_norm``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) if self.training or self.running_var is None else _frozen_batch_norm(self, x)


class _BatchNorm1d(nn.BatchNorm1d):
    """BatchNorm1d (same keys) whose eval mode is ``_frozen_batch_norm``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) if self.training or self.running_var is None else _frozen_batch_norm(self, x)


class SEBlock(nn.Module):
    """Squeeze-and-excitation: channel weights from the spatial mean (Linear, PReLU, Linear, sigmoid in ``fc``)."""

    def __init__(self, channel: int, reduction: int = 16) -> None:
        super().__init__()
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Sequential(nn.Linear(channel, channel // reduction), nn.PReLU(),
                                nn.Linear(channel // reduction, channel), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.fc(self.avg_pool(x).flatten(1))[:, :, None, None]


class IRBlock(nn.Module):
    """Improved residual block: BN, conv 3x3, BN, PReLU, conv 3x3 (``stride``), BN, optional SE; plus the input
    (through ``downsample`` when given), then the same PReLU again (one ``prelu`` module, used twice)."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None,
                 use_se: bool = True) -> None:
        super().__init__()
        self.bn0 = _BatchNorm2d(inplanes)
        self.conv1 = conv3x3(inplanes, inplanes)
        self.bn1 = _BatchNorm2d(inplanes)
        self.prelu = nn.PReLU()
        self.conv2 = conv3x3(inplanes, planes, stride)
        self.bn2 = _BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride
        self.use_se = use_se
        if use_se:
            self.se = SEBlock(planes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.prelu(self.bn1(self.conv1(self.bn0(x))))
        out = self.bn2(self.conv2(out))
        if self.use_se:
            out = self.se(out)
        residual = x if self.downsample is None else self.downsample(x)
        return self.prelu(out + residual)


class BasicBlock(nn.Module):
    """ResNet's basic block: conv 3x3 (``stride``), BN, ReLU, conv 3x3, BN, plus the input (through
    ``downsample`` when given), ReLU. ``use_se`` is accepted and ignored (the authors' block has none)."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None,
                 use_se: bool = True) -> None:
        super().__init__()
        del use_se
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = _BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = _BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        residual = x if self.downsample is None else self.downsample(x)
        return self.relu(out + residual)


BLOCKS: dict[str, type[IRBlock] | type[BasicBlock]] = {"IRBlock": IRBlock, "BasicBlock": BasicBlock}


@ARCH_REGISTRY.register()
class ResNetArcFace(nn.Module):
    """ArcFace ResNet: (b, 1, 128, 128) gray faces -> (b, 512) identity embeddings.

    Args:
        block: 'IRBlock' (the authors' choice) or 'BasicBlock'. layers: blocks per stage (four counts; the
        defaults: GFPGAN's ResNet-18). use_se: squeeze-and-excitation in each IRBlock.
    """

    def __init__(self, block: str = "IRBlock", layers: Sequence[int] = (2, 2, 2, 2), use_se: bool = True) -> None:
        super().__init__()
        if block not in BLOCKS:
            raise ArchArgumentError("block", f"ResNetArcFace: block must be one of {', '.join(map(repr, BLOCKS))}, "
                                    f"got {block!r}")
        if (isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence) or len(layers) != 4
                or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in layers)):
            raise ArchArgumentError("layers", f"ResNetArcFace: layers must be four block counts >= 1 (one per stage: "
                                    f"64, 128, 256, 512 channels), got {layers!r}")
        self.block_type, self.use_se = BLOCKS[block], use_se
        self.inplanes = 64
        self.conv1 = nn.Conv2d(1, 64, kernel_size=3, padding=1, bias=False)
        self.bn1 = _BatchNorm2d(64)
        self.prelu = nn.PReLU()
        self.maxpool = nn.MaxPool2d(kernel_size=2, stride=2)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], stride=2)
        self.layer3 = self._make_layer(256, layers[2], stride=2)
        self.layer4 = self._make_layer(512, layers[3], stride=2)
        self.bn4 = _BatchNorm2d(512)
        self.dropout = nn.Dropout()
        self.fc5 = nn.Linear(512 * 8 * 8, 512)
        self.bn5 = _BatchNorm1d(512)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_normal_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, (nn.BatchNorm2d, nn.BatchNorm1d)):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def _make_layer(self, planes: int, num_blocks: int, stride: int = 1) -> nn.Sequential:
        block = self.block_type
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block.expansion, kernel_size=1, stride=stride, bias=False),
                _BatchNorm2d(planes * block.expansion))
        blocks = [block(self.inplanes, planes, stride, downsample, use_se=self.use_se)]
        self.inplanes = planes
        blocks += [block(self.inplanes, planes, use_se=self.use_se) for _ in range(1, num_blocks)]
        return nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-2:]) != (128, 128):
            raise ValueError(f"ResNetArcFace takes 128x128 gray faces (its fc5 reads an 8x8 map), got "
                             f"{tuple(x.shape[-2:])}: resize the face first")
        x = self.maxpool(self.prelu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = self.dropout(self.bn4(x))
        return self.bn5(self.fc5(x.flatten(1)))


__all__ = ["BasicBlock", "IRBlock", "ResNetArcFace", "SEBlock"]


def _recognise(s: StateShapes) -> dict | None:
    """ResNetArcFace from its tensors: the block kind (IRBlock's leading batch norm ``bn0``), the blocks per stage
    and whether IRBlocks have squeeze-and-excitation."""
    if s.dim("fc5.weight", 1) != 512 * 8 * 8:
        return None
    return {"block": "IRBlock" if "layer1.0.bn0.weight" in s else "BasicBlock",
            "layers": [s.count(f"layer{i}.") for i in range(1, 5)], "use_se": "layer1.0.se.fc.0.weight" in s}


register_recogniser("ResNetArcFace", _recognise)

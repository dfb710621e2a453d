"""Feature extractors of the learned metrics, without torchvision: AlexNet and VGG16 ``features`` stacks cut
into slices (LPIPS, DISTS) and the Inception-v3 of FID (TensorFlow's 2015 graph as pytorch-fid ports it).

Layer positions are torchvision's: layer ``N`` of ``alexnet().features`` / ``vgg16().features`` keeps the name
``N`` inside whichever slice holds it, so a torchvision state dict (``features.N.weight``) maps onto a sliced
stack by renaming only (``torchvision_to_sliced``). ``FIDInceptionV3`` has torchvision's ``Inception3``
attribute names (``Conv2d_1a_3x3.conv.weight``, ``Mixed_5b.branch1x1.bn.running_mean``, ...), the names in
``pt_inception-2015-12-05-6726825d.pth``. Nothing here reads files or picks a device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from anysr.errors import CheckpointError, DataError

__all__ = [
    "ALEXNET_SLICES", "VGG16_SLICES", "alexnet_layers", "vgg16_layers", "build_slices", "torchvision_to_sliced",
    "run_slices", "split_torchvision_keys", "FIDInceptionV3", "FrozenMetricNet", "fid_inception_state_dict",
]

# Slice boundaries (torchvision layer indices): slice k holds layers [b[k-1], b[k]).
ALEXNET_SLICES = (0, 2, 5, 8, 10, 12)  # ends after relu1 ... relu5
VGG16_SLICES = (0, 4, 9, 16, 23, 30)  # ends after relu1_2, relu2_2, relu3_3, relu4_3, relu5_3

# (out channels, kernel, stride, padding) of AlexNet's convolutions; "M" is a 3x3 / 2 max pool.
_ALEXNET = ((64, 11, 4, 2), "M", (192, 5, 1, 2), "M", (384, 3, 1, 1), (256, 3, 1, 1), (256, 3, 1, 1), "M")
# VGG16 ("D"): 3x3 convolutions of these widths; "M" is a 2x2 / 2 max pool.
_VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def alexnet_layers() -> list[nn.Module]:
    """The 13 layers of torchvision's ``alexnet().features`` in order (ReLUs not in place)."""
    layers: list[nn.Module] = []
    c_in = 3
    for spec in _ALEXNET:
        if spec == "M":
            layers.append(nn.MaxPool2d(kernel_size=3, stride=2))
        else:
            c_out, k, s, p = spec  # type: ignore[misc]
            layers += [nn.Conv2d(c_in, c_out, k, stride=s, padding=p), nn.ReLU()]
            c_in = c_out
    return layers


def vgg16_layers() -> list[nn.Module]:
    """The 31 layers of torchvision's ``vgg16().features`` in order (ReLUs not in place)."""
    layers: list[nn.Module] = []
    c_in = 3
    for spec in _VGG16:
        if spec == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
        else:
            layers += [nn.Conv2d(c_in, int(spec), 3, padding=1), nn.ReLU()]
            c_in = int(spec)
    return layers


def build_slices(layers: Sequence[nn.Module], bounds: Sequence[int],
                 replace: Mapping[int, nn.Module] | None = None) -> list[nn.Sequential]:
    """Cut ``layers`` at ``bounds`` into ``nn.Sequential`` slices whose children keep their layer index as
    name; ``replace`` swaps single layers (DISTS puts L2 pooling where VGG has max pooling)."""
    swap = dict(replace or {})
    slices = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        seq = nn.Sequential()
        for i in range(lo, hi):
            seq.add_module(str(i), swap.get(i, layers[i]))
        slices.append(seq)
    return slices


def run_slices(x: Tensor, slices: Sequence[nn.Module]) -> list[Tensor]:
    """The output of every slice, each fed with the previous one's."""
    outs = []
    for block in slices:
        x = block(x)
        outs.append(x)
    return outs


def torchvision_to_sliced(state_dict: Mapping[str, Tensor], bounds: Sequence[int], prefix: str,
                          what: str) -> dict[str, Tensor]:
    """Rename torchvision ``features.N.<param>`` keys to ``<prefix><k>.N.<param>`` (slice ``k`` holds layer N).

    ``classifier.*`` keys and layers beyond the last slice are dropped; anything else is an error naming the key.
    """
    out: dict[str, Tensor] = {}
    for key, value in state_dict.items():
        if key.startswith("classifier."):
            continue
        parts = key.split(".")
        if len(parts) != 3 or parts[0] != "features" or not parts[1].isdigit():
            raise CheckpointError(f"{what}: unexpected key {key!r}; expected torchvision's 'features.N.weight' "
                                  "/ 'features.N.bias' layout")
        idx = int(parts[1])
        if idx >= bounds[-1]:
            continue
        k = next(j for j in range(1, len(bounds)) if bounds[j - 1] <= idx < bounds[j])
        out[f"{prefix}{k}.{idx}.{parts[2]}"] = value
    return out


# --------------------------------------------------------------------------------------- Inception-v3
def split_torchvision_keys(state_dict: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], list[tuple[str, str, Tensor]]]:
    """Strip ``module.`` prefixes and set torchvision's ``features.*`` / ``classifier.*`` entries apart:
    ``(torchvision entries, [(original key, stripped key, value) of the others])``."""
    tv: dict[str, Tensor] = {}
    rest: list[tuple[str, str, Tensor]] = []
    for key, value in state_dict.items():
        k = key[len("module."):] if key.startswith("module.") else key
        if k.startswith(("features.", "classifier.")):
            tv[k] = value
        else:
            rest.append((key, k, value))
    return tv, rest


class FrozenMetricNet(nn.Module):
    """A fixed network of a learned metric: ``freeze()`` (called at the end of ``__init__``) turns gradients
    off and sets eval mode, which ``train()`` keeps; ``load_checked`` loads merged weights strictly, after
    naming every missing, unexpected or mis-shaped entry."""

    def freeze(self) -> None:
        """No gradients, eval mode."""
        self.requires_grad_(False)
        self.eval()

    def train(self, mode: bool = True) -> FrozenMetricNet:
        """Always eval: the metric is fixed."""
        return super().train(False)

    def load_checked(self, merged: dict[str, Tensor], missing: Sequence[str], owner: str, hint: str) -> None:
        """Load ``merged`` (entries absent from it keep their current values) after checking it: ``missing``
        (the caller decides which keys are required), keys not in the state dict and shape mismatches raise
        ``CheckpointError`` naming ``owner`` and ending with ``hint``."""
        own = self.state_dict()
        unexpected = [k for k in merged if k not in own]
        if missing or unexpected:
            parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
                [f"unexpected {', '.join(unexpected)}"] if unexpected else [])
            raise CheckpointError(f"{owner} weights: {'; '.join(parts)}; {hint}")
        for k, v in merged.items():
            if tuple(v.shape) != tuple(own[k].shape):
                raise CheckpointError(f"{owner} weights: {k} has shape {tuple(v.shape)}, expected "
                                      f"{tuple(own[k].shape)}; are these the weights of another network?")
        for k, v in own.items():
            merged.setdefault(k, v)
        self.load_state_dict(merged, strict=True)


class _ConvBN(nn.Module):
    """Convolution without bias, batch norm (eps 1e-3), ReLU: torchvision's ``BasicConv2d``."""

    def __init__(self, c_in: int, c_out: int, kernel: int | tuple[int, int], stride: int = 1,
                 padding: int | tuple[int, int] = 0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(c_out, eps=0.001)

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.bn(self.conv(x)))


def _avg_pool_valid(x: Tensor) -> Tensor:
    """3x3 average over the pixels inside the image only (TensorFlow's 'SAME' average pooling)."""
    return F.avg_pool2d(x, kernel_size=3, stride=1, padding=1, count_include_pad=False)


class _MixedA(nn.Module):
    """35x35 block: 1x1, 5x5, double 3x3 and pooled branches."""

    def __init__(self, c_in: int, pool_features: int) -> None:
        super().__init__()
        self.branch1x1 = _ConvBN(c_in, 64, 1)
        self.branch5x5_1 = _ConvBN(c_in, 48, 1)
        self.branch5x5_2 = _ConvBN(48, 64, 5, padding=2)
        self.branch3x3dbl_1 = _ConvBN(c_in, 64, 1)
        self.branch3x3dbl_2 = _ConvBN(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = _ConvBN(96, 96, 3, padding=1)
        self.branch_pool = _ConvBN(c_in, pool_features, 1)

    def forward(self, x: Tensor) -> Tensor:
        b5 = self.branch5x5_2(self.branch5x5_1(x))
        b3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        return torch.cat([self.branch1x1(x), b5, b3, self.branch_pool(_avg_pool_valid(x))], 1)


class _ReductionB(nn.Module):
    """35x35 -> 17x17: strided 3x3, strided double 3x3 and max pooling."""

    def __init__(self, c_in: int) -> None:
        super().__init__()
        self.branch3x3 = _ConvBN(c_in, 384, 3, stride=2)
        self.branch3x3dbl_1 = _ConvBN(c_in, 64, 1)
        self.branch3x3dbl_2 = _ConvBN(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = _ConvBN(96, 96, 3, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        b3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        return torch.cat([self.branch3x3(x), b3, F.max_pool2d(x, kernel_size=3, stride=2)], 1)


class _MixedC(nn.Module):
    """17x17 block with factorised 7x7 convolutions (1x7 and 7x1)."""

    def __init__(self, c_in: int, channels_7x7: int) -> None:
        super().__init__()
        c7 = channels_7x7
        row, col = ((1, 7), (0, 3)), ((7, 1), (3, 0))
        self.branch1x1 = _ConvBN(c_in, 192, 1)
        self.branch7x7_1 = _ConvBN(c_in, c7, 1)
        self.branch7x7_2 = _ConvBN(c7, c7, row[0], padding=row[1])
        self.branch7x7_3 = _ConvBN(c7, 192, col[0], padding=col[1])
        self.branch7x7dbl_1 = _ConvBN(c_in, c7, 1)
        self.branch7x7dbl_2 = _ConvBN(c7, c7, col[0], padding=col[1])
        self.branch7x7dbl_3 = _ConvBN(c7, c7, row[0], padding=row[1])
        self.branch7x7dbl_4 = _ConvBN(c7, c7, col[0], padding=col[1])
        self.branch7x7dbl_5 = _ConvBN(c7, 192, row[0], padding=row[1])
        self.branch_pool = _ConvBN(c_in, 192, 1)

    def forward(self, x: Tensor) -> Tensor:
        b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        d = x
        for layer in (self.branch7x7dbl_1, self.branch7x7dbl_2, self.branch7x7dbl_3, self.branch7x7dbl_4,
                      self.branch7x7dbl_5):
            d = layer(d)
        return torch.cat([self.branch1x1(x), b7, d, self.branch_pool(_avg_pool_valid(x))], 1)


class _ReductionD(nn.Module):
    """17x17 -> 8x8: 1x1 then strided 3x3, a 1x7 / 7x1 / strided 3x3 tower, and max pooling."""

    def __init__(self, c_in: int) -> None:
        super().__init__()
        self.branch3x3_1 = _ConvBN(c_in, 192, 1)
        self.branch3x3_2 = _ConvBN(192, 320, 3, stride=2)
        self.branch7x7x3_1 = _ConvBN(c_in, 192, 1)
        self.branch7x7x3_2 = _ConvBN(192, 192, (1, 7), padding=(0, 3))
        self.branch7x7x3_3 = _ConvBN(192, 192, (7, 1), padding=(3, 0))
        self.branch7x7x3_4 = _ConvBN(192, 192, 3, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        b3 = self.branch3x3_2(self.branch3x3_1(x))
        b7 = self.branch7x7x3_4(self.branch7x7x3_3(self.branch7x7x3_2(self.branch7x7x3_1(x))))
        return torch.cat([b3, b7, F.max_pool2d(x, kernel_size=3, stride=2)], 1)


class _MixedE(nn.Module):
    """8x8 block with split 1x3 / 3x1 outputs; the FID graph max-pools in its last block (``max_pool``)."""

    def __init__(self, c_in: int, max_pool: bool) -> None:
        super().__init__()
        self.max_pool = max_pool
        self.branch1x1 = _ConvBN(c_in, 320, 1)
        self.branch3x3_1 = _ConvBN(c_in, 384, 1)
        self.branch3x3_2a = _ConvBN(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3_2b = _ConvBN(384, 384, (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = _ConvBN(c_in, 448, 1)
        self.branch3x3dbl_2 = _ConvBN(448, 384, 3, padding=1)
        self.branch3x3dbl_3a = _ConvBN(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = _ConvBN(384, 384, (3, 1), padding=(1, 0))
        self.branch_pool = _ConvBN(c_in, 192, 1)

    def forward(self, x: Tensor) -> Tensor:
        s = self.branch3x3_1(x)
        b3 = torch.cat([self.branch3x3_2a(s), self.branch3x3_2b(s)], 1)
        d = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        bd = torch.cat([self.branch3x3dbl_3a(d), self.branch3x3dbl_3b(d)], 1)
        pooled = F.max_pool2d(x, kernel_size=3, stride=1, padding=1) if self.max_pool else _avg_pool_valid(x)
        return torch.cat([self.branch1x1(x), b3, bd, self.branch_pool(pooled)], 1)


class FIDInceptionV3(FrozenMetricNet):
    """Inception-v3 as the FID reference computes it: images -> 2048-d pool features ``(N, 2048)``.

    Input: RGB ``NCHW`` on [0, 1] (any size; ``resize_input`` resizes to 299 x 299 bilinearly, without
    antialiasing, then ``normalize_input`` maps to [-1, 1], as pytorch-fid's ``InceptionV3([3])`` does).
    The 2015 TensorFlow graph differs from torchvision's Inception: average pools ignore the padding and
    the last block max-pools. Weights: ``load_fid_weights`` (or ``load_state_dict`` after
    ``fid_inception_state_dict``) with ``pt_inception-2015-12-05-6726825d.pth``. Always in eval mode.
    """

    def __init__(self, resize_input: bool = True, normalize_input: bool = True) -> None:
        super().__init__()
        self.resize_input = resize_input
        self.normalize_input = normalize_input
        self.Conv2d_1a_3x3 = _ConvBN(3, 32, 3, stride=2)
        self.Conv2d_2a_3x3 = _ConvBN(32, 32, 3)
        self.Conv2d_2b_3x3 = _ConvBN(32, 64, 3, padding=1)
        self.Conv2d_3b_1x1 = _ConvBN(64, 80, 1)
        self.Conv2d_4a_3x3 = _ConvBN(80, 192, 3)
        self.Mixed_5b = _MixedA(192, pool_features=32)
        self.Mixed_5c = _MixedA(256, pool_features=64)
        self.Mixed_5d = _MixedA(288, pool_features=64)
        self.Mixed_6a = _ReductionB(288)
        self.Mixed_6b = _MixedC(768, channels_7x7=128)
        self.Mixed_6c = _MixedC(768, channels_7x7=160)
        self.Mixed_6d = _MixedC(768, channels_7x7=160)
        self.Mixed_6e = _MixedC(768, channels_7x7=192)
        self.Mixed_7a = _ReductionD(768)
        self.Mixed_7b = _MixedE(1280, max_pool=False)
        self.Mixed_7c = _MixedE(2048, max_pool=True)
        self.freeze()  # always eval: batch norm uses the running statistics

    def load_fid_weights(self, state_dict: Mapping[str, Tensor]) -> FIDInceptionV3:
        """Load the FID Inception weights in any layout ``fid_inception_state_dict`` accepts (strict)."""
        self.load_state_dict(fid_inception_state_dict(state_dict), strict=True)
        return self

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[1] != 3:
            raise DataError(f"FIDInceptionV3: expected RGB images (N, 3, H, W) on [0, 1], got shape {tuple(x.shape)}")
        if self.resize_input:
            x = F.interpolate(x, size=(299, 299), mode="bilinear", align_corners=False)
        if self.normalize_input:
            x = 2 * x - 1
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
        x = F.max_pool2d(x, kernel_size=3, stride=2)
        x = self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x))
        x = F.max_pool2d(x, kernel_size=3, stride=2)
        for block in (self.Mixed_5b, self.Mixed_5c, self.Mixed_5d, self.Mixed_6a, self.Mixed_6b, self.Mixed_6c,
                      self.Mixed_6d, self.Mixed_6e, self.Mixed_7a, self.Mixed_7b, self.Mixed_7c):
            x = block(x)
        return F.adaptive_avg_pool2d(x, 1).flatten(1)


# pytorch-fid / BasicSR wrap the same layers as ``blocks.<b>.<i>``; this is where each one sits.
_FID_BLOCKS = (
    ("Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3"),
    ("Conv2d_3b_1x1", "Conv2d_4a_3x3"),
    ("Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b", "Mixed_6c", "Mixed_6d", "Mixed_6e"),
    ("Mixed_7a", "Mixed_7b", "Mixed_7c"),
)


def fid_inception_state_dict(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``FIDInceptionV3``'s keys from the FID weight file or from a pytorch-fid / BasicSR ``InceptionV3``.

    Accepts torchvision ``Inception3`` names (the file ``pt_inception-2015-12-05-6726825d.pth``: its
    1008-class ``fc`` and any ``AuxLogits`` are dropped), the ``blocks.<b>.<i>.`` names of pytorch-fid's /
    BasicSR's wrapper, and a ``module.`` prefix (DataParallel). torchvision's ImageNet Inception weights
    (1000 classes) are refused: they are a different network and give meaningless FID values.
    """
    out: dict[str, Tensor] = {}
    fc = state_dict.get("fc.weight", state_dict.get("module.fc.weight"))
    if fc is not None and tuple(fc.shape) == (1000, 2048):
        raise CheckpointError("FID Inception weights: this is torchvision's ImageNet Inception-v3 (1000 classes), "
                              "not the FID graph; use pt_inception-2015-12-05-6726825d.pth from pytorch-fid")
    for key, value in state_dict.items():
        k = key[len("module."):] if key.startswith("module.") else key
        if k.startswith(("fc.", "AuxLogits.")):
            continue
        if k.startswith("blocks."):
            parts = k.split(".", 3)
            try:
                k = f"{_FID_BLOCKS[int(parts[1])][int(parts[2])]}.{parts[3]}"
            except (IndexError, ValueError):
                raise CheckpointError(f"FID Inception weights: unexpected key {key!r} in a pytorch-fid "
                                      "InceptionV3 layout") from None
        out[k] = value
    return out

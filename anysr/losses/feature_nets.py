"""traiNNer-redux's losses on the features of a fixed pretrained network, under its names
(``perceptualanimeloss``, ``linedistillerloss``, ``aesoploss`` in its ``train.losses`` lists), computing what
traiNNer-redux computes (checked against its source on fixtures), times ``loss_weight``:

* ``PerceptualAnimeLoss`` (APISR, Wang et al. 2024): a ResNet-50 trained on Danbooru tags (RF5's
  ``resnet50-13306192.pth``); the ImageNet-normalised images' activations at ``layer_weights``' layers compared by
  ``criterion``, weighted and summed.
* ``LineDistillerLoss``: a line-art extraction network (traiNNer-redux's ``line_distiller_weights.pth``); the
  line maps of the [-1, 1] images compared by ``criterion``.
* ``AESOPLoss`` (Lee et al. 2024): a trained ``AutoEncoder`` (traiNNer-redux's AE model; ``decoder_opt``,
  ``scale``); the reconstructions of both images compared by ``criterion``.

Role ``learned``. The networks' weights are files the user names (never downloaded): ``weights`` (AESOPLoss:
``pretrain_network_ae`` too, traiNNer-redux's option); the engine reads them and passes ``weight_state_dicts``.
The networks stay frozen and in eval mode; the target's features are taken without gradients. All in fp32.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from anysr.ops.autocast import autocast_off
from anysr.registry import LOSS_REGISTRY

StateDicts = Sequence[Mapping[str, torch.Tensor]]
_CRITERIA = ("l1", "charbonnier")


def _criterion(name: str, owner: str) -> str:
    if name not in _CRITERIA:
        raise ValueError(f"{owner}: criterion must be one of {', '.join(_CRITERIA)}, got {name!r}")
    return name


def _distance(a: torch.Tensor, b: torch.Tensor, criterion: str) -> torch.Tensor:
    """Mean L1, or mean Charbonnier (eps 1e-12 under the root, traiNNer-redux's ``charbonnier_loss``)."""
    d = a - b
    return d.abs().mean() if criterion == "l1" else torch.sqrt(d * d + 1e-12).mean()


def _one_state_dict(state_dicts: StateDicts | None, owner: str, what: str, option: str = "weights") -> dict:
    if not state_dicts:
        raise ValueError(f"{owner} needs {what}: set the loss's `{option}` to that file")
    if len(state_dicts) != 1:
        raise ValueError(f"{owner} takes one weights file ({what}), got {len(state_dicts)}")
    return dict(state_dicts[0])


def _load_strict(net: nn.Module, sd: Mapping[str, torch.Tensor], owner: str) -> None:
    """Load ``sd`` into ``net`` (its tensors taken as they are: ``net`` may be built on the meta device when all
    its tensors are in its state dict) after naming every missing, unexpected or mis-shaped entry."""
    own = net.state_dict()
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    shapes = [k for k in own if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or shapes:
        parts = [f"{label} {', '.join(keys[:4])}{' ...' if len(keys) > 4 else ''}"
                 for label, keys in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", shapes)) if keys]
        raise ValueError(f"{owner}: the weights do not fit the network ({'; '.join(parts)})")
    net.load_state_dict({k: v.to(own[k].dtype) if v.is_floating_point() else v for k, v in sd.items()}, assign=True)


class _FrozenBN(nn.BatchNorm2d):
    """An eval-mode batch norm (its keys) as one per-channel affine map: XLA lowers that forward and backward
    (its batch-norm backward with frozen statistics fails there) and it is cheaper."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight * torch.rsqrt(self.running_var + self.eps)
        shift = self.bias - self.running_mean * scale
        return x * scale[:, None, None] + shift[:, None, None]


class _FrozenFeatureLoss(nn.Module):
    """A fixed network (``self.net``): no gradients, eval mode kept by ``train()``."""

    role = "learned"  # which train.*_opt accepts it (the options read this)
    net: nn.Module

    def _freeze(self) -> None:
        self.net.requires_grad_(False)
        self.net.eval()

    def train(self, mode: bool = True) -> _FrozenFeatureLoss:
        """Always eval: the network is fixed."""
        return super().train(False)


# ---------------------------------------------------------------- PerceptualAnimeLoss: torchvision's ResNet-50 body

_IMAGENET_MEAN, _IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
_STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))  # width, blocks, stride of layer1..layer4
_BLOCK_PARTS = ("conv1", "bn1", "conv2", "bn2", "conv3", "bn3", "relu", "downsample")


class _Bottleneck(nn.Module):
    """torchvision's ResNet-50 bottleneck (stride on the 3x3 conv), its names."""

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        out = width * 4
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = _FrozenBN(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = _FrozenBN(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = _FrozenBN(out)
        self.downsample = (nn.Sequential(nn.Conv2d(cin, out, 1, stride, bias=False), _FrozenBN(out))
                           if stride != 1 or cin != out else None)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every output a forward hook on a part sees after the block ran (torchvision's ReLUs are in place: a
        batch norm's output is seen rectified, ``bn3``'s and ``relu``'s as the block's output)."""
        c1 = self.conv1(x)
        r1 = F.relu(self.bn1(c1))
        c2 = self.conv2(r1)
        r2 = F.relu(self.bn2(c2))
        c3 = self.conv3(r2)
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn3(c3) + identity)
        parts = {"conv1": c1, "bn1": r1, "conv2": c2, "bn2": r2, "conv3": c3, "bn3": out, "relu": out, "": out}
        if self.downsample is not None:
            parts["downsample"] = identity
        return parts


def _resnet50_body(stages: tuple[tuple[int, int, int], ...] = _STAGES) -> nn.Sequential:
    """torchvision's resnet50 without avgpool / fc, as ``nn.Sequential(*children[:-2])`` numbers it: 0 conv1,
    1 bn1, 2 relu, 3 maxpool, 4-7 layer1-layer4 (``stages``: their width, blocks, stride; fewer stop early,
    other block counts give resnet101 / resnet152)."""
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), _FrozenBN(64), nn.ReLU(),
                               nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in stages:
        stage = []
        for j in range(blocks):
            stage.append(_Bottleneck(cin, width, stride if j == 0 else 1))
            cin = width * 4
        layers.append(nn.Sequential(*stage))
    return nn.Sequential(*layers)


def _parse_label(label: str) -> tuple[int, int, str]:
    """``"i"`` -> (i, -1, ""); ``"i_j"`` -> (i, j, ""); ``"i_j_part"`` -> (i, j, part) (traiNNer-redux's names)."""
    parts = str(label).split("_")
    bad = ValueError(f"PerceptualAnimeLoss: layer_weights: unknown layer {label!r}; give 'i' (0-7: conv1, bn1, relu, "
                     "maxpool, layer1-4), 'i_j' (block j of layer i, i in 4-7) or 'i_j_part' (part one of "
                     f"{', '.join(_BLOCK_PARTS)})")
    try:
        idx = [int(p) for p in parts[:2]]
    except ValueError:
        raise bad from None
    if len(parts) == 1 and 0 <= idx[0] <= 7:
        return idx[0], -1, ""
    if len(parts) in (2, 3) and 4 <= idx[0] <= 7 and 0 <= idx[1] < _STAGES[idx[0] - 4][1]:
        part = parts[2] if len(parts) == 3 else ""
        if part == "" or (part in _BLOCK_PARTS and not (part == "downsample" and idx[1] != 0)):
            return idx[0], idx[1], part
    raise bad


def resnet50_state_dict(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The body's state dict from RF5's Danbooru file (``0.<n>.*`` the body, ``1.*`` the head, dropped), from the
    body's own names (``<n>.*``) or from torchvision's resnet50 names (``conv1``, ``bn1``, ``layerN``; ``fc``
    dropped)."""
    tv = {"conv1": "0", "bn1": "1", "layer1": "4", "layer2": "5", "layer3": "6", "layer4": "7"}
    if any(k.startswith("0.0.") for k in sd):
        return {k[2:]: v for k, v in sd.items() if k.startswith("0.")}
    out = {}
    for k, v in sd.items():
        head, _, rest = k.partition(".")
        if head == "fc":
            continue
        out[f"{tv.get(head, head)}.{rest}"] = v
    return out


@LOSS_REGISTRY.register()
class PerceptualAnimeLoss(_FrozenFeatureLoss):
    """traiNNer-redux's ``perceptualanimeloss`` (APISR's anime perceptual loss): ``loss_weight * sum_k w_k *
    criterion(f_k(pred), f_k(target))`` over the Danbooru ResNet-50's layers ``layer_weights`` names (traiNNer-redux's
    labels: ``"0"`` the stem conv, ``"4_2_conv3"`` layer1's third block's last conv, ...), images ImageNet-normalised.

    ``weights``: RF5's ``resnet50-13306192.pth`` (or torchvision-named resnet50 weights), read by the engine;
    ``weight_state_dicts``: its contents. Only the layers up to the deepest one named are run.
    """

    def __init__(self, loss_weight: float = 1.0, layer_weights: Mapping[str, float] | None = None,
                 criterion: str = "l1", verbose_logging: bool = False, weights: Sequence[str] | str | None = None,
                 weight_state_dicts: StateDicts | None = None) -> None:
        super().__init__()
        if verbose_logging:
            raise ValueError("PerceptualAnimeLoss: verbose_logging (a dict of per-layer losses) is not supported; "
                             "set it to false")
        if layer_weights is None:
            layer_weights = {"0": 0.1, "4_2_conv3": 20, "5_3_conv3": 25, "6_5_conv3": 1, "7_2_conv3": 1}
        if not isinstance(layer_weights, Mapping) or not layer_weights:
            raise ValueError(f"PerceptualAnimeLoss: layer_weights must be a non-empty mapping, got {layer_weights!r}")
        self.loss_weight = float(loss_weight)
        self.criterion = _criterion(criterion, "PerceptualAnimeLoss")
        self.layers = [(str(k), _parse_label(str(k)), float(w)) for k, w in layer_weights.items()]
        self.depth = max((i, _STAGES[i - 4][1] - 1 if j < 0 and i >= 4 else j) for _, (i, j, _), _ in self.layers)
        sd = _one_state_dict(weight_state_dicts, "PerceptualAnimeLoss",
                             "the Danbooru ResNet-50 (resnet50-13306192.pth)")
        with torch.device("meta"):
            self.net = _resnet50_body()
        _load_strict(self.net, resnet50_state_dict(sd), "PerceptualAnimeLoss")
        self._freeze()
        self.register_buffer("mean", torch.tensor(_IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(_IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def features(self, x: torch.Tensor) -> dict[tuple[int, int, str], torch.Tensor]:
        """The named layers' activations of ``x`` (RGB on [0, 1])."""
        want = {key for _, key, _ in self.layers}
        out: dict[tuple[int, int, str], torch.Tensor] = {}
        x = (x - self.mean) / self.std
        net = self.net
        x = net[0](x)
        out[(0, -1, "")] = x
        x = F.relu(net[1](x))  # bn1 is seen rectified (torchvision's in-place ReLU)
        out[(1, -1, "")] = out[(2, -1, "")] = x
        x = net[3](x)
        out[(3, -1, "")] = x
        for i in range(4, self.depth[0] + 1):
            for j, block in enumerate(net[i]):
                if (i, j) > self.depth:
                    break
                parts = block(x)
                x = parts[""]
                for part, t in parts.items():
                    if (i, j, part) in want:
                        out[(i, j, part)] = t
            out[(i, -1, "")] = x
        return out

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        with autocast_off(pred):
            f_pred = self.features(pred.float())
            with torch.no_grad():
                f_gt = self.features(target.detach().float())
            total = pred.new_zeros((), dtype=torch.float32)
            for _, key, w in self.layers:
                total = total + _distance(f_pred[key], f_gt[key], self.criterion) * w
            return self.loss_weight * total


# ---------------------------------------------------------------- LineDistillerLoss


def _conv(cin: int, cout: int, k: int, s: int = 1, p: int = 0, transpose: bool = False) -> nn.Module:
    return (nn.ConvTranspose2d if transpose else nn.Conv2d)(cin, cout, k, s, p, bias=False)


class _PreActBlock(nn.Module):
    """Pre-activation bottleneck (BN-ReLU-conv 1x1, BN-ReLU-conv, BN-ReLU-conv 1x1) plus a shortcut; ``mode``
    ``down`` (4x4 stride 2 conv), ``up`` (4x4 stride 2 transposed conv) or ``same`` (3x3; shortcut: identity, or a
    1x1 conv when ``proj``). Names as traiNNer-redux's ``left`` / ``shortcut``."""

    def __init__(self, cin: int, mid: int, cout: int, mode: str = "same", proj: bool = False) -> None:
        super().__init__()
        if mode == "same":
            middle = _conv(mid, mid, 3, 1, 1)
        else:
            middle = _conv(mid, mid, 4, 2, 1, transpose=mode == "up")
        self.left = nn.Sequential(_FrozenBN(cin), nn.ReLU(), _conv(cin, mid, 1), _FrozenBN(mid), nn.ReLU(),
                                  middle, _FrozenBN(mid), nn.ReLU(), _conv(mid, cout, 1))
        if mode != "same":
            self.shortcut: nn.Module = _conv(cin, cout, 4, 2, 1, transpose=mode == "up")
        else:
            self.shortcut = _conv(cin, cout, 1) if proj else nn.Sequential()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.left(x) + self.shortcut(x)


def _stage(first: _PreActBlock, cout: int, mid: int, repeats: int) -> nn.Sequential:
    return nn.Sequential(first, *(_PreActBlock(cout, mid, cout) for _ in range(repeats)))


class LineDistiller(nn.Module):
    """traiNNer-redux's line-art network: a 7x7 stride-2 stem, three stride-2 pre-activation residual stages
    (64-512 channels), three transposed-conv stages back with skip additions, a last x2 stage to one channel.
    Sides must be multiples of 16, or one less (the skip additions)."""

    def __init__(self, in_channels: int = 3) -> None:
        super().__init__()
        b = _PreActBlock
        self.conv1 = nn.Sequential(_conv(in_channels, 64, 7, 2, 3), *(b(64, 16, 64) for _ in range(3)))
        self.conv2 = _stage(b(64, 32, 128, "down"), 128, 32, 5)
        self.conv3 = _stage(b(128, 64, 256, "down"), 256, 64, 8)
        self.conv4 = _stage(b(256, 128, 512, "down"), 512, 128, 11)
        self.conv5 = _stage(b(512, 64, 256, "up"), 256, 64, 8)
        self.conv6 = _stage(b(256, 32, 128, "up"), 128, 32, 5)
        self.conv7 = _stage(b(128, 16, 64, "up"), 64, 16, 3)
        self.conv8 = nn.Sequential(b(64, 16, 32, "up"), b(32, 8, 32), b(32, 8, 32), _conv(32, 1, 3, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        if (h + 1) // 16 * 16 < h or (w + 1) // 16 * 16 < w:
            raise ValueError(f"LineDistiller: image sides must be multiples of 16 or one less, got {h}x{w}")
        d1 = self.conv1(x)
        d2 = self.conv2(d1)
        d3 = self.conv3(d2)
        u1 = d3 + self.conv5(self.conv4(d3))
        u2 = d2 + self.conv6(u1)
        return self.conv8(d1 + self.conv7(u2))


@LOSS_REGISTRY.register()
class LineDistillerLoss(_FrozenFeatureLoss):
    """traiNNer-redux's ``linedistillerloss``: ``loss_weight * criterion(L(2 pred - 1), L(2 target - 1))`` with
    ``L`` the line-art network. ``weights``: traiNNer-redux's ``line_distiller_weights.pth``, read by the engine;
    ``weight_state_dicts``: its contents. Image sides: multiples of 16, or one less."""

    def __init__(self, loss_weight: float = 1.0, criterion: str = "l1", debug: bool = False,
                 weights: Sequence[str] | str | None = None, weight_state_dicts: StateDicts | None = None) -> None:
        super().__init__()
        if debug:
            raise ValueError("LineDistillerLoss: debug (saving line maps as images) is not supported; set it to false")
        self.loss_weight = float(loss_weight)
        self.criterion = _criterion(criterion, "LineDistillerLoss")
        sd = _one_state_dict(weight_state_dicts, "LineDistillerLoss", "the line distiller (line_distiller_weights.pth)")
        with torch.device("meta"):
            self.net = LineDistiller()
        _load_strict(self.net, sd, "LineDistillerLoss")
        self._freeze()

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        with autocast_off(pred):
            lines = self.net(pred.float() * 2 - 1)
            with torch.no_grad():
                gt_lines = self.net(target.detach().float() * 2 - 1)
            return self.loss_weight * _distance(lines, gt_lines, self.criterion)


# ---------------------------------------------------------------- AESOPLoss


@LOSS_REGISTRY.register()
class AESOPLoss(_FrozenFeatureLoss):
    """traiNNer-redux's ``aesoploss``: ``loss_weight * criterion(AE(pred), AE(target))`` with ``AE`` a trained
    ``AutoEncoder(decoder_opt, scale=scale)`` (anysr.archs.autoencoder_arch). ``pretrain_network_ae`` (traiNNer-redux's
    option) or ``weights``: its weights file, read by the engine; ``weight_state_dicts``: its contents. Image sides:
    multiples of ``scale``."""

    def __init__(self, loss_weight: float = 1.0, *, decoder_opt: Mapping[str, Any] | None, scale: int,
                 pretrain_network_ae: str | None = None, criterion: str = "charbonnier",
                 weights: Sequence[str] | str | None = None, weight_state_dicts: StateDicts | None = None) -> None:
        super().__init__()
        from anysr.archs.autoencoder_arch import AutoEncoder  # noqa: PLC0415 - losses import before the archs

        if not isinstance(decoder_opt, Mapping):
            raise ValueError(f"AESOPLoss: decoder_opt must name the autoencoder's decoder ({{type: ...}}), "
                             f"got {decoder_opt!r}")
        self.loss_weight = float(loss_weight)
        self.criterion = _criterion(criterion, "AESOPLoss")
        sd = _one_state_dict(weight_state_dicts, "AESOPLoss", "the trained AutoEncoder", "pretrain_network_ae")
        # built for real: a decoder may hold buffers its state dict lacks (an EDSR's RGB mean)
        self.net = AutoEncoder(decoder_opt=decoder_opt, freeze_decoder=True, freeze_encoder=True, scale=scale)
        _load_strict(self.net, sd, "AESOPLoss")
        self._freeze()

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        with autocast_off(pred):
            with torch.no_grad():
                ae_gt = self.net(target.detach().float())
            return self.loss_weight * _distance(self.net(pred.float()), ae_gt, self.criterion)


__all__ = ["AESOPLoss", "LineDistiller", "LineDistillerLoss", "PerceptualAnimeLoss", "resnet50_state_dict"]

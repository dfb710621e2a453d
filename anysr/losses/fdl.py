"""neosr's ``fdl_loss``: the Frequency Distribution Loss (Ni et al., "Misalignment-robust frequency distribution loss
for image transformation", CVPR 2024) on the features of a fixed network, computing what neosr computes (checked
against its source on fixtures).

Per feature map of ``model``'s backbone, both images' 2-D spectra are split into magnitude and phase; each is
convolved with ``num_proj`` random unit-norm ``patch_size`` x ``patch_size`` projections (``stride``), every
projection's responses are sorted over the positions, and the mean absolute difference of the sorted responses
(a sliced Wasserstein-1 distance of the two patch distributions) is taken, ``magnitude + phase_weight * phase``.
Summed over the maps, averaged over the batch, times 0.01 unless ``model`` is spelled ``dinov2`` (neosr's
balancing, which reads the name as written), times ``loss_weight``.

Backbones (neosr's; weights are files named in the loss's ``weights``, read by the engine, never downloaded):

* ``vgg``: torchvision's vgg19 (``vgg19-dcbb9e9d.pth``): relu1_2, relu2_2, relu3_4, relu4_4, relu5_4, each times
  ``vgg_weights`` (default 0.5, 0.5, 1, 1, 1).
* ``resnet``: torchvision's resnet101 (``resnet101-cd907fc2.pth``): the stem's ReLU, layer1, layer2, layer3.
* ``effnet``: torchvision's efficientnet_b7 (``efficientnet_b7_lukemelas-c5b4e57e.pth``): features 0-1, 2, 3, 4, 5.
* ``dinov2`` (neosr's default): DINOv2's hub ViT-B/14 (``dinov2_vitb14_pretrain.pth``; the other hub ViT-S/B/L
  checkpoints work too), the final-norm'd patch tokens of blocks ``dino_layers`` (default 0-7, times
  ``dino_weights``), the image reflect-padded to multiples of 14 (ImageNet-normalised first when ``dino_norm``).

The CNNs see ImageNet-normalised images. The projections are drawn from a fixed seed (every rank and every resumed
run has the same ones); the spectra are DFTs as real matrix products (XLA has no complex autograd), with the
exact zeros a real input's spectrum has kept exact so that phases on the branch cut agree with ``torch.fft``.
Role ``learned``; fp32 under autocast; the target's features without gradients.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.vgg_features import VGGFeatureExtractor
from anysr.losses.dinov2 import DINOv2, dinov2_config
from anysr.losses.feature_nets import (
    _IMAGENET_MEAN,
    _IMAGENET_STD,
    _FrozenBN,
    _FrozenFeatureLoss,
    _load_strict,
    _one_state_dict,
    _resnet50_body,
    resnet50_state_dict,
)
from anysr.ops.autocast import autocast_off
from anysr.ops.dft import dft2
from anysr.registry import LOSS_REGISTRY

StateDicts = Sequence[Mapping[str, torch.Tensor]]

_SEED = 0  # the projections' generator seed
_WHAT = {"vgg": "torchvision's vgg19 state dict (vgg19-dcbb9e9d.pth)",
         "resnet": "torchvision's resnet101 state dict (resnet101-cd907fc2.pth)",
         "effnet": "torchvision's efficientnet_b7 state dict (efficientnet_b7_lukemelas-c5b4e57e.pth)",
         "dinov2": "DINOv2's hub checkpoint dinov2_vitb14 (dinov2_vitb14_pretrain.pth, from "
                   "https://dl.fbaipublicfiles.com/dinov2/dinov2_vitb14/dinov2_vitb14_pretrain.pth; neosr's torch hub "
                   "cache holds it after a neosr run)"}
_VGG_LAYERS = ("relu1_2", "relu2_2", "relu3_4", "relu4_4", "relu5_4")
_RESNET101 = ((64, 3, 1), (128, 4, 2), (256, 23, 2))  # layer1-layer3 (width, blocks, stride); layer4 unused
# efficientnet_b7's stages 1-5: expand ratio, kernel, stride, in, out, blocks (B0's scaled by width 2, depth 3.1)
_B7 = ((1, 3, 1, 64, 32, 4), (6, 3, 2, 32, 48, 7), (6, 5, 2, 48, 80, 7), (6, 3, 2, 80, 160, 10),
       (6, 5, 1, 160, 224, 10))
_DINO_LAYERS = (0, 1, 2, 3, 4, 5, 6, 7)
_DINO_WEIGHTS = (1.0, 0.5, 0.5, 1.0, 0.5, 0.5, 1.0, 0.1)


# ---------------------------------------------------------------- EfficientNet-B7's features 0-5 (torchvision's keys)


class _ConvBN(nn.Sequential):
    """torchvision's Conv2dNormActivation parameters (0 conv, 1 batch norm with eps 1e-3); the SiLU is applied by
    the caller."""

    def __init__(self, cin: int, cout: int, k: int = 1, stride: int = 1, groups: int = 1) -> None:
        super().__init__(nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
                         _FrozenBN(cout, eps=1e-3))


class _SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.fc2(F.silu(self.fc1(x.mean(dim=(2, 3), keepdim=True)))))


class _MBConv(nn.Module):
    """torchvision's MBConv (eval: stochastic depth is the identity): ``block`` = [expand,] depthwise, SE, project."""

    def __init__(self, expand: int, k: int, stride: int, cin: int, cout: int) -> None:
        super().__init__()
        mid = cin * expand
        parts: list[nn.Module] = [_ConvBN(cin, mid)] if expand != 1 else []
        parts += [_ConvBN(mid, mid, k, stride, mid), _SqueezeExcite(mid, max(1, cin // 4)), _ConvBN(mid, cout)]
        self.block = nn.Sequential(*parts)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for part in self.block[:-1]:
            y = part(y) if isinstance(part, _SqueezeExcite) else F.silu(part(y))
        y = self.block[-1](y)
        return y + x if self.residual else y


class _EffNetB7Features(nn.Module):
    """``features.0`` (stem) to ``features.5`` of torchvision's efficientnet_b7."""

    def __init__(self) -> None:
        super().__init__()
        stages: list[nn.Module] = [_ConvBN(3, 64, 3, 2)]
        for expand, k, stride, cin, cout, blocks in _B7:
            stages.append(nn.Sequential(*(_MBConv(expand, k, stride if j == 0 else 1, cin if j == 0 else cout, cout)
                                          for j in range(blocks))))
        self.features = nn.Sequential(*stages)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = F.silu(self.features[0](x))
        out = []
        for stage in self.features[1:]:
            x = stage(x)
            out.append(x)
        return out


# ---------------------------------------------------------------- spectra


def spectrum(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Magnitude and phase of the 2-D DFT of real ``x`` (..., H, W) over its last two dims, as ``torch.abs`` and
    ``torch.angle`` of ``torch.fft.fftn`` give them (gradients too, zero at a zero coefficient)."""
    re, im = dft2(x)
    power = re * re + im * im
    nz = power > 0
    mag = torch.where(nz, torch.sqrt(torch.where(nz, power, 1.0)), 0.0)
    phase = torch.atan2(torch.where(nz & (im != 0), im, 0.0), torch.where(nz, re, 1.0))  # +0: angle(-1 + 0j) = pi
    return mag, phase


# ---------------------------------------------------------------- the loss


@LOSS_REGISTRY.register()
class FrequencyDistributionLoss(_FrozenFeatureLoss):
    """neosr's ``fdl_loss`` (see the module doc): neosr's arguments and defaults; ``weights``: the backbone's
    weights file (read by the engine), ``weight_state_dicts``: its contents."""

    other_names = ("fdl_loss",)  # neosr's name

    def __init__(self, patch_size: int = 4, stride: int = 1, num_proj: int = 24, model: str = "dinov2",
                 vgg_weights: Sequence[float] | None = None, dino_layers: Sequence[int] | None = None,
                 dino_weights: Sequence[float] | None = None, dino_norm: bool = False, phase_weight: float = 1.0,
                 loss_weight: float = 1.0, weights: Sequence[str] | str | None = None,
                 weight_state_dicts: StateDicts | None = None) -> None:
        super().__init__()
        name = str(model).lower()
        if name not in _WHAT:
            raise ValueError(f"fdl_loss: model must be one of vgg, resnet, effnet, dinov2, got {model!r}")
        for arg, value in (("patch_size", patch_size), ("stride", stride), ("num_proj", num_proj)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"fdl_loss: {arg} must be a positive integer, got {value!r}")
        self.model_name = name
        self.stride, self.patch_size = stride, patch_size
        self.phase_weight = float(phase_weight)
        self.loss_weight = float(loss_weight)
        self.scale = 1.0 if model == "dinov2" else 0.01  # neosr compares the name as written
        sd = _one_state_dict(weight_state_dicts, "fdl_loss", f"model {name}: {_WHAT[name]}")
        self.feature_weights: list[float] = []
        if name == "vgg":
            vw = (0.5, 0.5, 1.0, 1.0, 1.0) if vgg_weights is None else tuple(float(w) for w in vgg_weights)
            if len(vw) != len(_VGG_LAYERS):
                raise ValueError(f"fdl_loss: vgg_weights must be 5 numbers (relu1_2 ... relu5_4), got {vgg_weights!r}")
            self.net: nn.Module = VGGFeatureExtractor(list(_VGG_LAYERS), use_input_norm=False)  # done here
            self.net.load_torchvision_state_dict(sd)
            self.feature_weights, chns = list(vw), [64, 128, 256, 512, 512]
        elif name == "resnet":
            with torch.device("meta"):
                self.net = _resnet50_body(_RESNET101)
            body = {k: v for k, v in resnet50_state_dict(sd).items() if not k.startswith("7.")}
            _load_strict(self.net, body, "fdl_loss (model resnet: torchvision's resnet101)")
            chns = [64, 256, 512, 1024]
        elif name == "effnet":
            with torch.device("meta"):
                self.net = _EffNetB7Features()
            keep = tuple(f"features.{i}." for i in range(6))
            _load_strict(self.net, {k: v for k, v in sd.items() if k.startswith(keep)},
                         "fdl_loss (model effnet: torchvision's efficientnet_b7)")
            chns = [32, 48, 80, 160, 224]
        else:
            cfg = dinov2_config(sd, "fdl_loss (model dinov2)")
            layers = list(_DINO_LAYERS if dino_layers is None else dino_layers)
            dw = list(_DINO_WEIGHTS if dino_weights is None else dino_weights)
            if (not layers or len(set(layers)) != len(layers)
                    or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < cfg["depth"] for i in layers)):
                raise ValueError(f"fdl_loss: dino_layers must be distinct block indices in 0-{cfg['depth'] - 1}, "
                                 f"got {dino_layers!r}")
            if len(dw) != len(layers):
                raise ValueError("fdl_loss: dino_weights must have one weight per dino_layers entry, got "
                                 f"{len(dw)} for {len(layers)}")
            with torch.device("meta"):
                self.net = DINOv2(**cfg)
            _load_strict(self.net, sd, "fdl_loss (model dinov2: DINOv2's hub checkpoint)")
            self.dino_layers, self.dino_norm = layers, bool(dino_norm)
            self.feature_weights, chns = [float(w) for w in dw], [cfg["dim"]] * len(layers)
        self._freeze()
        self.register_buffer("mean", torch.tensor(_IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(_IMAGENET_STD).view(1, 3, 1, 1), persistent=False)
        gen = torch.Generator().manual_seed(_SEED)
        for i, c in enumerate(chns):
            rand = torch.randn(num_proj, c, patch_size, patch_size, generator=gen)
            self.register_buffer(f"rand_{i}", rand / rand.flatten(1).norm(dim=1)[:, None, None, None],
                                 persistent=False)
        self.n_maps = len(chns)

    @staticmethod
    def weights_needed(options: Mapping[str, Any]) -> str:
        """What the ``weights`` option must name for these options (the engine's message when it is not set)."""
        name = str(options.get("model", "dinov2")).lower()
        return (f"fdl_loss (model {name}) needs `weights`: {_WHAT.get(name, 'its backbone weights file')}; anysr "
                "never downloads it (in a neosr file: weights = 'FILE' in [train.fdl_opt])")

    def features(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The backbone's weighted feature maps of ``x`` (RGB on [0, 1])."""
        if self.model_name == "dinov2":
            if self.dino_norm:
                x = (x - self.mean) / self.std
            h, w = x.shape[-2:]
            p = self.net.patch
            ph, pw = -h % p, -w % p
            if ph or pw:
                x = F.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2), mode="reflect")
            feats = self.net.intermediate_layers(x, self.dino_layers)
        else:
            x = (x - self.mean) / self.std
            if self.model_name == "vgg":
                out = self.net(x)
                feats = [out[k] for k in _VGG_LAYERS]
            elif self.model_name == "resnet":
                net = self.net
                x = F.relu(net[1](net[0](x)))
                feats = [x]
                x = net[3](x)
                for stage in net[4:]:
                    for block in stage:
                        x = block(x)[""]
                    feats.append(x)
            else:
                feats = self.net(x)
        if self.feature_weights:
            feats = [f * w for f, w in zip(feats, self.feature_weights, strict=True)]
        return feats

    def _sliced(self, a: torch.Tensor, b: torch.Tensor, rand: torch.Tensor) -> torch.Tensor:
        pa = torch.sort(F.conv2d(a, rand, stride=self.stride).flatten(2), dim=-1)[0]
        pb = torch.sort(F.conv2d(b, rand, stride=self.stride).flatten(2), dim=-1)[0]
        return (pa - pb).abs().mean(dim=(1, 2))

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """``pred``, ``target``: (N, 3, H, W) RGB on [0, 1]; computed in fp32 (fp64 for fp64 inputs and a
        ``double()`` loss)."""
        dtype = torch.float64 if pred.dtype == torch.float64 else torch.float32
        with autocast_off(pred):
            fp = self.features(pred.to(dtype))
            with torch.no_grad():
                ft = [spectrum(f) for f in self.features(target.detach().to(dtype))]
            score = pred.new_zeros(pred.shape[0], dtype=dtype)
            for i, (f, (mag_t, phase_t)) in enumerate(zip(fp, ft, strict=True)):
                if min(f.shape[-2:]) < self.patch_size:
                    raise ValueError(f"fdl_loss: feature map {i} of the {self.model_name} backbone is "
                                     f"{f.shape[-2]}x{f.shape[-1]}, smaller than patch_size {self.patch_size}; "
                                     "train on larger crops")
                mag, phase = spectrum(f)
                rand = getattr(self, f"rand_{i}")
                score = score + self._sliced(mag, mag_t, rand) + self._sliced(phase, phase_t, rand) * self.phase_weight
            return score.mean() * (self.scale * self.loss_weight)

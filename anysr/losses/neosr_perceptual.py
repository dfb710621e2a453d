"""neosr's VGG perceptual loss (``vgg_perceptual_loss``, with its Patch Loss) and its DISTS loss (``dists_loss``).

``VGGPerceptualLoss``: VGG19 features of the image normalised with mean 0.5 / std 0.25 (neosr's, not ImageNet's),
compared after scaling by 0.1 with ``criterion``: ``chc`` (default: the clipped pseudo-Huber
``mean(clamp(sqrt(d^2 + 1e-12), 0, 1))``, whose gradient is zero where a scaled feature differs by more than 1),
``huber`` (delta 1), ``l1`` or ``l2``; summed over ``layer_weights`` (default conv1_2 / conv2_2 0.1, conv3_4 /
conv4_4 / conv5_4 1, pre-activation). ``patchloss`` adds per layer, times the layer's weight and
``patch_weight``, the Patch Loss of Zhao et al. (Pattern Recognition 2023): over every k x k patch (stride k // 2)
of every feature channel, the mean of ``(1 - cos(x patch, gt patch)) * std(gt patch)`` for two kernel sizes;
``ipk`` adds the same over the images' own patches (values clamped to [1e-6, 1 - 1e-6]) for three larger kernels.
The kernel sizes follow the model's ``scale`` (4: features 4, 8 and images 7, 11, 15; 2: 3, 6 and 3, 5, 7), which
neosr reads from its options' ``scale``. As in neosr, the patch terms add to the value but carry no gradient.

``RawDISTSLoss``: ``loss_weight * (1 - mean DISTS)`` with neosr's DISTS, which feeds the VGG16 the image without
ImageNet normalisation (``anysr.metrics.raw_dists``); the weight files as ``DISTSLoss``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from anysr.archs.vgg_features import VGG_NAMES, VGGFeatureExtractor
from anysr.losses.learned import StateDicts, _MetricLoss, _need_weights
from anysr.losses.perceptual import TRAINNER_CONV_WEIGHTS
from anysr.losses.pixel import huber
from anysr.metrics.raw_dists import RawDISTS
from anysr.ops.autocast import autocast_off
from anysr.registry import LOSS_REGISTRY

__all__ = ["VGGPerceptualLoss", "RawDISTSLoss", "NEOSR_LAYER_WEIGHTS", "PATCH_KERNELS"]

NEOSR_LAYER_WEIGHTS = dict(TRAINNER_CONV_WEIGHTS)  # conv1_2 / conv2_2 0.1, conv3_4 / conv4_4 / conv5_4 1
# scale -> (feature patch kernels, image patch kernels)
PATCH_KERNELS: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {4: ((4, 8), (7, 11, 15)), 2: ((3, 6), (3, 5, 7))}
_CRITERIA = ("chc", "huber", "l1", "l2")
_FEATURE_SCALE = 0.1  # neosr scales the features down "to balance other losses"
_IPK_CLAMP = (0.000001, 0.999999)


def patch_cosine(x: Tensor, y: Tensor, eye: Tensor, clamp: bool = False) -> Tensor:
    """Mean over every ``k x k`` patch (stride ``k // 2``, no padding) of every channel of ``(1 - cos) * std(y)``,
    the cosine between the ``x`` and ``y`` patches and the (unbiased) standard deviation of the ``y`` patch.
    ``eye``: the ``(k*k, 1, k, k)`` identity kernel that lays the patches out along channels; ``clamp``: clamp the
    patches to [1e-6, 1 - 1e-6] first (image patches)."""
    k = eye.shape[-1]
    n, c, h, w = x.shape
    if h < k or w < k:
        raise ValueError(f"patchloss: a {h}x{w} map is smaller than its {k}x{k} patch kernel; use larger crops "
                         "(gt_size) or shallower layer_weights")
    px = F.conv2d(x.reshape(n * c, 1, h, w), eye, stride=k // 2)  # (n c, k*k, h', w'): one patch per position
    py = F.conv2d(y.reshape(n * c, 1, h, w), eye, stride=k // 2)
    if clamp:
        px, py = px.clamp(*_IPK_CLAMP), py.clamp(*_IPK_CLAMP)
    dot = (px * py).sum(dim=1)
    cos = dot / px.square().sum(dim=1).sqrt() / py.square().sum(dim=1).sqrt()
    return ((1 - cos) * py.std(dim=1)).mean()


@LOSS_REGISTRY.register()
class VGGPerceptualLoss(nn.Module):
    """neosr's ``vgg_perceptual_loss``: 0.1-scaled VGG19 features (input mean 0.5 / std 0.25) compared with
    ``criterion`` (chc, huber, l1, l2), plus the Patch Loss (``patchloss``, ``ipk``, ``patch_weight``); see the
    module's docstring.

    neosr's arguments and defaults; ``scale``: the model's scale (2 or 4), which picks the patch kernels (neosr
    reads it from its options), needed with ``patchloss``. The VGG19 weights come in as ``vgg_state_dict``
    (torchvision's vgg19); ``vgg_weights_path`` is the option the engine reads them from. Computed in fp32 under
    autocast, the VGG too.
    """

    role = "learned"  # called as loss(output, gt) -> tensor (the options read this)
    other_names = ("vgg_perceptual_loss",)  # neosr's name

    def __init__(self, layer_weights: Mapping[str, float] | None = None, vgg_type: str = "vgg19",
                 use_input_norm: bool = True, range_norm: bool = False, loss_weight: float = 1.0,
                 criterion: str = "chc", patchloss: bool = False, ipk: bool = False, patch_weight: float = 1.0,
                 scale: int | None = None, vgg_weights_path: str | None = None,
                 vgg_state_dict: Mapping[str, Tensor] | None = None) -> None:
        super().__init__()
        if criterion not in _CRITERIA:
            raise ValueError(f"criterion '{criterion}' is not supported; use one of {', '.join(_CRITERIA)}")
        if ipk and not patchloss:
            raise ValueError("ipk: true needs patchloss: true (the image patch kernels are part of the Patch Loss)")
        if patchloss and scale not in PATCH_KERNELS:
            raise ValueError(f"scale: patchloss picks its patch kernels by the model's scale, 2 or 4; got {scale!r}")
        if vgg_type not in VGG_NAMES:
            raise ValueError(f"vgg_type '{vgg_type}' is not supported; use one of {', '.join(VGG_NAMES)}")
        if vgg_state_dict is None:
            raise ValueError(f"VGGPerceptualLoss needs vgg_state_dict (torchvision's {vgg_type} weights); set "
                             "vgg_weights_path")
        weights = dict(NEOSR_LAYER_WEIGHTS if layer_weights is None else layer_weights)
        names = VGG_NAMES[vgg_type]
        unknown = [k for k in weights if k not in names]
        if unknown:
            raise ValueError(f"layer_weights: unknown {vgg_type} layer(s) {unknown}; valid names: {', '.join(names)}")
        self.layer_weights = {k: float(weights[k]) for k in sorted(weights, key=names.index)}  # the VGG's order
        self.loss_weight = float(loss_weight)
        self.criterion = criterion
        self.patchloss = bool(patchloss)
        self.ipk = bool(ipk)
        self.patch_weight = float(patch_weight)
        self.vgg = VGGFeatureExtractor(list(self.layer_weights), vgg_type, use_input_norm, range_norm)
        self.vgg.load_torchvision_state_dict(vgg_state_dict)
        self.vgg.mean.fill_(0.5)  # neosr's normalisation, not ImageNet's
        self.vgg.std.fill_(0.25)
        feature_k, image_k = PATCH_KERNELS[int(scale)] if patchloss else ((), ())  # type: ignore[arg-type]
        self.feature_kernels = feature_k
        self.image_kernels = image_k if ipk else ()
        for k in sorted({*self.feature_kernels, *self.image_kernels}):
            self.register_buffer(f"eye{k}", torch.eye(k * k).view(k * k, 1, k, k), persistent=False)

    def _dist(self, a: Tensor, b: Tensor) -> Tensor:
        a, b = a * _FEATURE_SCALE, b * _FEATURE_SCALE
        if self.criterion == "chc":
            return torch.sqrt((a - b) ** 2 + 1e-12).clamp(0, 1).mean()
        if self.criterion == "huber":
            return huber(a, b, 1.0).mean()  # aten's huber_loss falls back to the CPU on XLA
        if self.criterion == "l1":
            return F.l1_loss(a, b)
        return F.mse_loss(a, b)

    def _patch(self, x: Tensor, y: Tensor, kernels: Sequence[int], clamp: bool) -> Tensor:
        with torch.no_grad():  # neosr's Patch Loss adds to the value, not to the gradient
            return sum((patch_cosine(x, y, getattr(self, f"eye{k}"), clamp) for k in kernels),
                       x.new_zeros((), dtype=torch.float32))

    def forward(self, x: Tensor, gt: Tensor) -> Tensor:
        with autocast_off(x):
            x, gt = x.float(), gt.detach().float()
            fx, fy = self.vgg(x), self.vgg(gt)
            total = x.new_zeros((), dtype=torch.float32)
            for k, w in self.layer_weights.items():
                if self.feature_kernels:
                    total = total + self._patch(fx[k], fy[k], self.feature_kernels, False) * w * self.patch_weight
                total = total + self._dist(fx[k], fy[k]) * w
            if self.image_kernels:
                total = total + self._patch(x, gt, self.image_kernels, True)
            return total * self.loss_weight


@LOSS_REGISTRY.register()
class RawDISTSLoss(_MetricLoss):
    """neosr's ``dists_loss``: ``loss_weight * (1 - mean DISTS)`` with DISTS on the images as given (no ImageNet
    normalisation; ``anysr.metrics.raw_dists.RawDISTS``), pred and target RGB on [0, 1].

    neosr's arguments: ``as_loss`` (must be true: false is its metric mode), ``loss_weight``, ``load_weights``
    (must be true: anysr has no random alpha / beta). ``weights``: the weight files (torchvision's vgg16 and DISTS'
    alpha / beta, e.g. neosr's dists_weights.pth; not set: the standard vgg16 and DISTS weights.pt), read by the
    engine; ``weight_state_dicts``: their contents.
    """

    other_names = ("dists_loss",)  # neosr's name
    metric_name = "raw_dists"  # no ``weights``: the engine finds that metric's standard files by name

    def __init__(self, as_loss: bool = True, loss_weight: float = 1.0, load_weights: bool = True,
                 weights: Sequence[str] | None = None, weight_state_dicts: StateDicts | None = None) -> None:
        super().__init__(loss_weight, "mean")
        if not as_loss:
            raise ValueError("as_loss: false is neosr's metric mode; a loss needs as_loss: true (use the raw_dists "
                             "metric in val.metrics)")
        if not load_weights:
            raise ValueError("load_weights: false (DISTS with random alpha / beta) is not supported; set "
                             "load_weights: true and name the files in weights")
        sds = _need_weights(weight_state_dicts, "RawDISTSLoss", "torchvision's vgg16 and DISTS' alpha / beta")
        self.metric = RawDISTS().load_weights(*sds)

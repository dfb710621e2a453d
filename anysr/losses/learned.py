"""Learned losses: LPIPS and DISTS as differentiable losses (the metric modules of ``anysr.metrics``, the same
weight files), and the contextual loss on VGG features (Mechrez et al., "The Contextual Loss for Image
Transformation with Non-Aligned Data", ECCV 2018).

Their ``role`` is ``learned``: they need weight files, which the engine reads (losses do no file I/O) from the
paths in the options (``weights`` for LPIPS / DISTS, as ``val.metrics`` takes them; ``vgg_weights_path`` for the
contextual loss, as ``PerceptualLoss``) and hands over as state dicts (``weight_state_dicts`` / ``vgg_state_dict``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from anysr.archs.vgg_features import VGGFeatureExtractor
from anysr.losses.perceptual import gram_matrix
from anysr.losses.pixel import _PixelLoss
from anysr.metrics.dists import DISTS
from anysr.metrics.lpips import LPIPS
from anysr.ops.autocast import autocast_off
from anysr.registry import LOSS_REGISTRY

StateDicts = Sequence[Mapping[str, torch.Tensor]]


def _need_weights(state_dicts: StateDicts | None, name: str, what: str) -> StateDicts:
    if not state_dicts:
        raise ValueError(f"{name} needs weight_state_dicts ({what}); set the loss's `weights` to those files")
    return state_dicts


class _MetricLoss(_PixelLoss):
    """``loss_weight`` times the metric's per-image distance, reduced over the batch; the metric stays frozen."""

    role = "learned"  # which train.*_opt accepts it (the options read this)
    metric: nn.Module

    def forward(self, pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """``pred``, ``target``: RGB on [0, 1]; ``weight``: optional per-image (N,) weights."""
        return self.loss_weight * self._reduce(self.metric(pred, target.detach()), weight)


@LOSS_REGISTRY.register()
class LPIPSLoss(_MetricLoss):
    """LPIPS (``net`` alex or vgg, version 0.1) between ``pred`` and ``target`` on [0, 1].

    ``weights``: the weight files (torchvision's alexnet / vgg16 and the lpips head, or one lpips state dict), read
    by the engine; ``weight_state_dicts``: their contents, what this module loads (``LPIPS.load_weights``).
    """

    metric_name = "lpips"  # no ``weights``: the engine finds that metric's standard files by name

    def __init__(self, loss_weight: float = 1.0, reduction: str = "mean", net: str = "alex",
                 weights: Sequence[str] | None = None, weight_state_dicts: StateDicts | None = None) -> None:
        super().__init__(loss_weight, reduction)
        sds = _need_weights(weight_state_dicts, "LPIPSLoss", f"torchvision's {net} and the lpips head")
        self.metric = LPIPS(net=net).load_weights(*sds)


@LOSS_REGISTRY.register()
class DISTSLoss(_MetricLoss):
    """DISTS between ``pred`` and ``target`` on [0, 1].

    ``weights``: the weight files (torchvision's vgg16 and DISTS' alpha / beta, or one DISTS state dict), read by
    the engine; ``weight_state_dicts``: their contents, what this module loads (``DISTS.load_weights``).
    """

    metric_name = "dists"  # no ``weights``: the engine finds that metric's standard files by name

    def __init__(self, loss_weight: float = 1.0, reduction: str = "mean", weights: Sequence[str] | None = None,
                 weight_state_dicts: StateDicts | None = None) -> None:
        super().__init__(loss_weight, reduction)
        sds = _need_weights(weight_state_dicts, "DISTSLoss", "torchvision's vgg16 and DISTS' weights.pt")
        self.metric = DISTS().load_weights(*sds)


def contextual_similarity(x: torch.Tensor, y: torch.Tensor, band_width: float = 0.5,
                          eps: float = 1e-5) -> torch.Tensor:
    """Per-image (N,) contextual similarity CX of feature maps ``x`` and ``y`` (N, C, H, W).

    Both are centred on ``y``'s per-image spatial mean and unit-normalised along C; ``d`` is the cosine distance
    of every x position to every y position, ``d / (min over y positions + eps)`` the relative distance,
    ``exp((1 - relative) / band_width)`` normalised over y positions the affinity; CX is the mean over y
    positions of the largest affinity any x position has to it.
    """
    mu = y.mean(dim=(2, 3), keepdim=True)
    xc = nn.functional.normalize((x - mu).flatten(2), dim=1)  # (N, C, P)
    yc = nn.functional.normalize((y - mu).flatten(2), dim=1)
    dist = 1 - torch.bmm(xc.transpose(1, 2), yc)  # (N, Px, Py)
    rel = dist / (dist.amin(dim=2, keepdim=True) + eps)
    w = torch.exp((1 - rel) / band_width)
    cx = w / w.sum(dim=2, keepdim=True)
    return cx.amax(dim=1).mean(dim=1)


@LOSS_REGISTRY.register()
class ContextualLoss(_PixelLoss):
    """Contextual loss: ``-log(CX)`` of VGG features (``contextual_similarity``), summed over ``layer_weights``
    with their weights, per image, reduced over the batch. Computed in fp32 (features too) under autocast.

    VGG arguments as ``PerceptualLoss`` (``vgg_type`` vgg19 / vgg19_bn, ``use_input_norm``, ``range_norm``, the
    weights as ``vgg_state_dict``; ``vgg_weights_path`` is the option the engine reads them from). The cost is
    (H * W) ** 2 per layer: use deep layers or small crops.
    """

    role = "learned"  # which train.*_opt accepts it (the options read this)

    def __init__(self, layer_weights: Mapping[str, float] | None = None, loss_weight: float = 1.0,
                 reduction: str = "mean", vgg_type: str = "vgg19", use_input_norm: bool = True,
                 range_norm: bool = False, band_width: float = 0.5, vgg_weights_path: str | None = None,
                 vgg_state_dict: Mapping[str, torch.Tensor] | None = None) -> None:
        super().__init__(loss_weight, reduction)
        if not band_width > 0:
            raise ValueError(f"band_width must be > 0, got {band_width}")
        if vgg_state_dict is None:
            raise ValueError(f"ContextualLoss needs vgg_state_dict (torchvision's {vgg_type} weights); set "
                             "vgg_weights_path")
        self.layer_weights = {k: float(v) for k, v in (layer_weights or {"conv4_4": 1.0}).items()}
        self.band_width = float(band_width)
        self.vgg = VGGFeatureExtractor(list(self.layer_weights), vgg_type, use_input_norm, range_norm)
        self.vgg.load_torchvision_state_dict(vgg_state_dict)

    def forward(self, pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """``weight``: optional per-image (N,) weights."""
        with autocast_off(pred):
            fx = self.vgg(pred.float())
            fy = self.vgg(target.detach().float())
            loss = sum(-torch.log(contextual_similarity(fx[k], fy[k], self.band_width)) * w
                       for k, w in self.layer_weights.items())
        return self.loss_weight * self._reduce(loss, weight)  # type: ignore[arg-type]


def lpips_with_style(metric: LPIPS, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The LPIPS of VQGAN / RestoreFormer's ``lpips.py`` on **signed** images ([-1, 1], as their losses feed it):
    ``(distance per image (N,), style)``, where style is the sum over the five stages of the mean squared difference
    of the Gram matrices (divided by C * H * W) of the unit-normalised features (their ``style_weight`` term, not
    yet weighted). The distance is ``metric``'s (the same scaling, backbone and heads) in eval mode: their module
    also runs its heads' dropout while training (Lightning puts the loss in train mode), equal in expectation."""
    n = x.shape[0]
    inp = metric.scaling_layer(torch.cat([x, y]))
    dist, style = None, x.new_zeros(())
    for feat, lin in zip(metric.net(inp), metric.lins):
        f = feat.to(torch.float32)
        f = f / (f.square().sum(dim=1, keepdim=True).sqrt() + 1e-10)
        a, b = f[:n], f[n:]
        value = lin((a - b).square()).mean(dim=(1, 2))
        dist = value if dist is None else dist + value
        style = style + (gram_matrix(a) - gram_matrix(b)).square().mean()
    assert dist is not None
    return dist, style

"""traiNNer-redux's ``structuretextureloss``: MS-SSIM weighted toward the target's edges (structure) plus VGG19
feature distances weighted toward its flat regions (texture), computing what traiNNer-redux computes (checked
against its source on fixtures with the same random VGG19 weights) and times ``loss_weight``.

Per pixel of the target's luma (0.299 R + 0.587 G + 0.114 B) the Sobel magnitude ``m`` (3x3 taps / 4, zero
padding, ``sqrt(gx^2 + gy^2 + 1e-8)``) gives the structure weight ``w_s = sigmoid(structure_k * (m -
structure_t))`` and the texture weight ``w_t = 1 - w_s + 1 / (1 + exp(structure_k * structure_t))``.

* structure: ``1 - mean`` over images of the product over five scales of ``clamp(v_i, 1e-8) ** weight_i``, ``v_i``
  the ``w_s``-weighted mean of the contrast-structure map (clamped at 0; at the last scale times the luminance map
  when ``include_luminance``), of the clamped images' luma (``test_y_channel``: Y of ``color_space`` ``yiq``,
  ``ycbcr``, ``lhm``) or channels. The window is the 11x11 Gaussian (sigma 1.5), 'valid' while the image is at
  least 11 pixels wide, else 'same' on zero padding; ``w_s`` is resized (bilinear) to each map's size and
  2x2 average-pooled with the images. As traiNNer-redux's, with several channels the weighted sum runs over all of
  them and the weight's sum over one;
* texture: ``sum`` over ``layer_weights`` of ``weight * mean(w_t' * mean over channels |VGG(pred) - VGG(gt)|)``,
  ``w_t'`` resized (bilinear) to the layer's size; the VGG19 is traiNNer-redux's (first conv padded by
  replication, ImageNet-normalised input, conv layers pre-activation).

The loss is ``loss_weight * (pixel_weight * structure + perceptual_weight * texture)`` (traiNNer-redux logs the two
apart; anysr logs their sum). The target is detached. Computed in fp32 under autocast, the VGG too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.vgg_features import VGG19_NAMES, VGGFeatureExtractor
from anysr.losses.structure import MS_SSIM_WEIGHTS
from anysr.losses.trainner import _LUMA, _mix, ssim_cs_maps
from anysr.ops.autocast import autocast_off
from anysr.registry import LOSS_REGISTRY

STRUCTURE_TEXTURE_LAYERS = {"conv1_2": 0.1, "conv2_2": 0.1, "conv3_4": 1.0, "conv4_4": 1.0, "conv5_4": 1.0}
_WIN, _SIGMA = 11, 1.5


def gaussian_window_2d(size: int = _WIN, sigma: float = _SIGMA) -> torch.Tensor:
    """MATLAB's ``fspecial('gaussian', size, sigma)`` (computed in float64, stored in float32), (1, 1, size, size)."""
    half = (size - 1) / 2
    coords = torch.arange(size, dtype=torch.float64) - half
    h = torch.exp(-(coords[:, None] ** 2 + coords[None, :] ** 2) / (2 * sigma * sigma))
    h = torch.where(h < torch.finfo(torch.float64).eps * h.max(), 0.0, h)
    return (h / h.sum()).float().view(1, 1, size, size)


def _filter(x: torch.Tensor, win: torch.Tensor) -> torch.Tensor:
    c = x.shape[1]
    return F.conv2d(x, win.expand(c, 1, -1, -1), groups=c)


def weighted_ms_ssim(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, win: torch.Tensor,
                     include_luminance: bool = False) -> torch.Tensor:
    """Per-image (N,) MS-SSIM with each scale's map averaged under ``weight`` (N, 1, H, W), as traiNNer-redux's."""
    size = win.shape[-1]
    terms = []
    w = weight
    for level in range(len(MS_SSIM_WEIGHTS)):
        last = level == len(MS_SSIM_WEIGHTS) - 1
        value, _ = ssim_cs_maps(x, y, lambda t: _filter(t, win), size, include_luminance and last)
        w_map = F.interpolate(w, size=value.shape[-2:], mode="bilinear", align_corners=False)
        terms.append((w_map * value).sum((1, 2, 3)) / (w_map.sum((1, 2, 3)) + 1e-8))
        pad2 = (x.shape[2] % 2, x.shape[3] % 2)
        x = F.avg_pool2d(x, kernel_size=2, padding=pad2)
        y = F.avg_pool2d(y, kernel_size=2, padding=pad2)
        w = F.avg_pool2d(w, kernel_size=2, padding=pad2)
    out = None
    for term, power in zip(terms, MS_SSIM_WEIGHTS, strict=True):
        part = term.clamp_min(1e-8) ** power
        out = part if out is None else out * part
    assert out is not None
    return out


@LOSS_REGISTRY.register()
class StructureTextureLoss(nn.Module):
    """traiNNer-redux's ``structuretextureloss`` (see the module's text): edge-weighted MS-SSIM (``pixel_weight``)
    plus flat-region-weighted VGG19 feature L1 (``perceptual_weight``, ``layer_weights``), times ``loss_weight``.

    ``structure_k`` / ``structure_t``: the edge sigmoid's slope and threshold; ``texture_k`` / ``texture_t`` are
    accepted and unused (as in traiNNer-redux). The VGG19 weights come in as ``vgg_state_dict`` (torchvision's
    vgg19); ``vgg_weights_path`` is the option the engine reads them from.
    """

    role = "learned"  # called as loss(output, gt) -> tensor in the train.losses list (the options read this)

    def __init__(self, loss_weight: float = 1.0, pixel_weight: float = 1.0, perceptual_weight: float = 1.0,
                 layer_weights: Mapping[str, float] | None = None, structure_k: float = 10.0,
                 structure_t: float = 0.1, texture_k: float = 10.0, texture_t: float = 0.1,
                 test_y_channel: bool = True, color_space: str = "yiq", include_luminance: bool = False,
                 vgg_weights_path: str | None = None,
                 vgg_state_dict: Mapping[str, torch.Tensor] | None = None) -> None:
        super().__init__()
        if test_y_channel and str(color_space).lower() not in _LUMA:
            raise ValueError(f"color_space '{color_space}' is not supported; use one of {', '.join(_LUMA)}")
        if layer_weights is None:
            layer_weights = STRUCTURE_TEXTURE_LAYERS
        unknown = [k for k in layer_weights if k not in VGG19_NAMES]
        if unknown or not layer_weights:
            raise ValueError(f"layer_weights: unknown or no VGG19 layer(s) {unknown}; valid names: "
                             f"{', '.join(VGG19_NAMES)}")
        if vgg_state_dict is None:
            raise ValueError("StructureTextureLoss needs vgg_state_dict (torchvision's vgg19 weights); set "
                             "vgg_weights_path")
        self.loss_weight = float(loss_weight)
        self.pixel_weight, self.perceptual_weight = float(pixel_weight), float(perceptual_weight)
        self.layer_weights = {k: float(v) for k, v in layer_weights.items()}
        self.structure_k, self.structure_t = float(structure_k), float(structure_t)
        self.texture_k, self.texture_t = float(texture_k), float(texture_t)
        self.test_y_channel = bool(test_y_channel)
        self.color_space = str(color_space).lower()
        self.include_luminance = bool(include_luminance)
        self.floor = 1 / (1 + math.exp(self.structure_k * self.structure_t))
        self.vgg = VGGFeatureExtractor(sorted(self.layer_weights, key=VGG19_NAMES.index), first_padding="replicate")
        self.vgg.load_torchvision_state_dict(vgg_state_dict)
        sobel = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]]) / 4
        self.register_buffer("sobel", torch.stack([sobel, sobel.T]).unsqueeze(1), persistent=False)
        self.register_buffer("win", gaussian_window_2d(), persistent=False)

    def weights(self, gt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The structure and texture weights (N, 1, H, W) of the target ``gt``."""
        luma = _mix(gt, (0.299, 0.587, 0.114))
        g = F.conv2d(luma, self.sobel, padding=1)
        mag = torch.sqrt((g * g).sum(1, keepdim=True) + 1e-8)
        w_s = torch.sigmoid(self.structure_k * (mag - self.structure_t))
        return w_s, 1 - w_s + self.floor

    def _prepare(self, x: torch.Tensor) -> torch.Tensor:
        x = x.clamp(0, 1)
        return _mix(x, *_LUMA[self.color_space]) if self.test_y_channel else x

    def terms(self, pred: torch.Tensor, gt: torch.Tensor) -> dict[str, torch.Tensor]:
        """The weighted ``structure`` and ``texture`` terms (before ``loss_weight``)."""
        pred, gt = pred.float(), gt.detach().float()
        w_s, w_t = self.weights(gt)
        score = weighted_ms_ssim(self._prepare(pred), self._prepare(gt), w_s, self.win, self.include_luminance)
        fp, fg = self.vgg(pred), self.vgg(gt)
        texture = pred.new_zeros(())
        for k, wk in self.layer_weights.items():
            diff = (fp[k] - fg[k]).abs().mean(1, keepdim=True)
            w_map = F.interpolate(w_t, size=diff.shape[-2:], mode="bilinear", align_corners=False)
            texture = texture + wk * (w_map * diff).mean()
        return {"structure": self.pixel_weight * (1 - score.mean()), "texture": self.perceptual_weight * texture}

    def forward(self, pred: torch.Tensor, gt: torch.Tensor) -> torch.Tensor:
        if pred.dim() != 4 or pred.shape[1] != 3 or pred.shape != gt.shape:
            raise ValueError(f"StructureTextureLoss takes two NCHW RGB images of one shape, got {tuple(pred.shape)} "
                             f"and {tuple(gt.shape)}")
        with autocast_off(pred):
            t = self.terms(pred, gt)
            return self.loss_weight * (t["structure"] + t["texture"])


__all__ = ["STRUCTURE_TEXTURE_LAYERS", "StructureTextureLoss", "gaussian_window_2d", "weighted_ms_ssim"]

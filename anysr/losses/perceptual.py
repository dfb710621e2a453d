"""Perceptual (VGG feature) and style loss with BasicSR's arguments; the VGG19 is
:class:`anysr.archs.vgg_features.VGGFeatureExtractor`."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.vgg_features import _VGG19_WIDTHS, VGG19_NAMES, VGG_NAMES, VGGFeatureExtractor
from anysr.ops.autocast import autocast_off
from anysr.registry import LOSS_REGISTRY


def gram_matrix(x: torch.Tensor) -> torch.Tensor:
    """The Gram matrix of ``(n, c, h, w)`` features, normalised by ``c * h * w`` (BasicSR's style loss, GFPGAN's
    facial-component style loss)."""
    n, c, h, w = x.shape
    f = x.reshape(n, c, h * w)
    return f.bmm(f.transpose(1, 2)) / (c * h * w)


@LOSS_REGISTRY.register()
class PerceptualLoss(nn.Module):
    """Weighted distance of VGG19 / VGG19-BN features (and optionally of their Gram matrices, the style loss).

    BasicSR's arguments: ``layer_weights`` (one weight per layer; ``conv``/``bn`` layers are pre-activation,
    ``relu`` layers post-activation), ``vgg_type`` (``vgg19``, ``vgg19_bn``), ``use_input_norm``, ``range_norm``,
    ``perceptual_weight``, ``style_weight``, ``criterion`` (``l1``, ``l2``, ``charbonnier`` with ``eps``, ``fro``).
    ``forward(x, gt)`` returns ``(percep_loss, style_loss)``; either is ``None`` when its weight is 0.
    Under autocast the VGG runs in its precision, the distances and Gram matrices in fp32.
    The VGG weights come in as ``vgg_state_dict`` (torchvision's vgg19); ``vgg_weights_path`` is only the
    option the engine reads them from (losses do no file I/O) and is accepted and ignored here.
    """

    role = "perceptual"  # which train.*_opt accepts it (the options read this)

    def __init__(self, layer_weights: dict[str, float], vgg_type: str = "vgg19", use_input_norm: bool = True,
                 range_norm: bool = False, perceptual_weight: float = 1.0, style_weight: float = 0.0,
                 criterion: str = "l1", vgg_weights_path: str | None = None,
                 vgg_state_dict: Mapping[str, torch.Tensor] | None = None, eps: float = 1e-12) -> None:
        super().__init__()
        if criterion not in ("l1", "l2", "charbonnier", "fro"):
            raise ValueError(f"criterion '{criterion}' is not supported; use l1, l2, charbonnier or fro")
        if vgg_state_dict is None:
            raise ValueError(f"PerceptualLoss needs vgg_state_dict (torchvision's {vgg_type} weights); set "
                             "train.perceptual_opt.vgg_weights_path")
        self.eps = float(eps)
        self.layer_weights = {k: float(v) for k, v in layer_weights.items()}
        self.perceptual_weight = float(perceptual_weight)
        self.style_weight = float(style_weight)
        self.criterion_type = criterion
        self.vgg = VGGFeatureExtractor(list(self.layer_weights), vgg_type, use_input_norm, range_norm)
        self.vgg.load_torchvision_state_dict(vgg_state_dict)

    def _dist(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.criterion_type == "l1":
            return F.l1_loss(a, b)
        if self.criterion_type == "l2":
            return F.mse_loss(a, b)
        if self.criterion_type == "charbonnier":
            return torch.sqrt((a - b) ** 2 + self.eps).mean()
        return torch.linalg.vector_norm(a - b)

    def forward(self, x: torch.Tensor, gt: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        fx = self.vgg(x)  # the network runs in autocast's precision; distances and Gram matrices in fp32
        fg = self.vgg(gt.detach())
        with autocast_off(x):
            return self._losses({k: v.float() for k, v in fx.items()}, {k: v.float() for k, v in fg.items()})

    def _losses(self, fx: dict[str, torch.Tensor],
                fg: dict[str, torch.Tensor]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        percep = style = None
        if self.perceptual_weight > 0:
            percep = sum(self._dist(fx[k], fg[k]) * w for k, w in self.layer_weights.items())
            percep = percep * self.perceptual_weight  # type: ignore[operator]
        if self.style_weight > 0:
            style = sum(self._dist(gram_matrix(fx[k]), gram_matrix(fg[k])) * w for k, w in self.layer_weights.items())
            style = style * self.style_weight  # type: ignore[operator]
        return percep, style  # type: ignore[return-value]

TRAINNER_CONV_WEIGHTS = {"conv1_2": 0.1, "conv2_2": 0.1, "conv3_4": 1.0, "conv4_4": 1.0, "conv5_4": 1.0}
TRAINNER_RELU_WEIGHTS = {"relu1_2": 0.1, "relu2_2": 0.1, "relu3_4": 1.0, "relu4_4": 1.0, "relu5_4": 1.0}
_CONV_CRITERIA = ("l1", "charbonnier", "pd+l1", "fd+l1")  # compare conv (pre-activation) layers
_RELU_CRITERIA = ("pd", "fd", "pd+l1", "fd+l1")  # compare relu layers with a distribution distance
FD_SEED = 0  # seeds the fd criterion's random projections (torch.Generator, one randn per compared layer)
_FD_PATCH = 5


def _pd(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-channel distance of the features' cumulative distributions (each channel normalised to sum 1)."""
    px = (x / (x.sum(dim=(2, 3), keepdim=True) + 1e-14)).flatten(2).cumsum(-1)
    py = (y / (y.sum(dim=(2, 3), keepdim=True) + 1e-14)).flatten(2).cumsum(-1)
    return (px - py).abs().sum(-1).mean()


def _sliced(x: torch.Tensor, y: torch.Tensor, proj: torch.Tensor, stride: int) -> torch.Tensor:
    """Per image: the mean gap of the sorted random patch projections of ``x`` and ``y``."""
    px = F.conv2d(x, proj, stride=stride).flatten(2).sort(dim=-1).values
    py = F.conv2d(y, proj, stride=stride).flatten(2).sort(dim=-1).values
    return (px - py).abs().mean(dim=(1, 2))


@LOSS_REGISTRY.register()
class TraiNNerPerceptualLoss(nn.Module):
    """traiNNer-redux's ``perceptualloss``: VGG19 layers (first conv padded by replication, ImageNet-normalised
    input), summed with ``layer_weights`` and clamped below at ``clip_min``, times ``loss_weight``.

    ``criterion``: ``charbonnier`` (default) or ``l1`` on conv layers (defaults conv1_2 / conv2_2 0.1, conv3_4 /
    conv4_4 / conv5_4 1); ``pd`` (cumulative distribution distance) or ``fd`` (sliced distance of the Fourier
    amplitude and, times ``phase_weight_fd``, phase, ``num_proj_fd`` random 5x5 projections at ``stride_fd``) on
    relu layers (the same names with ``relu``); ``pd+l1`` / ``fd+l1`` both. Per layer (in VGG order) ``alpha``
    mixes them: ``(1 - alpha) * l1 + alpha * w_lambda * pd|fd`` (default alpha: 0 for conv, 1 for relu layers).
    The fd projections are drawn from ``torch.Generator().manual_seed(FD_SEED)`` and kept as buffers
    ``fd_proj_<i>``. Computed in fp32 under autocast, the VGG too (also as ``PerceptualFP16Loss``, which
    traiNNer-redux runs in autocast's precision). ``antialiased`` (another VGG's weights) is
    refused; ``verbose_logging`` is accepted and ignored. The VGG19 weights come in as ``vgg_state_dict``
    (torchvision's vgg19); ``vgg_weights_path`` is the option the engine reads them from.
    """

    role = "learned"  # called as loss(output, gt) -> tensor (the options read this)
    other_names = ("PerceptualFP16Loss",)  # traiNNer-redux's other name for it (BasicSR has none)

    def __init__(self, loss_weight: float = 1.0, layer_weights: Mapping[str, float] | None = None,
                 w_lambda: float = 0.01, alpha: list[float] | None = None, criterion: str = "charbonnier",
                 num_proj_fd: int = 256, phase_weight_fd: float = 1.0, stride_fd: int = 1, clip_min: float = 0.0,
                 antialiased: bool = False, verbose_logging: bool = False, vgg_weights_path: str | None = None,
                 vgg_state_dict: Mapping[str, torch.Tensor] | None = None) -> None:
        super().__init__()
        if criterion not in (*_CONV_CRITERIA, "pd", "fd"):
            raise ValueError(f"criterion '{criterion}' is not supported; use charbonnier, l1, pd, fd, pd+l1 or fd+l1")
        if antialiased:
            raise ValueError("antialiased: true needs antialiased-cnns' VGG19 and its weights, which anysr does not "
                             "have; set antialiased: false")
        if vgg_state_dict is None:
            raise ValueError("TraiNNerPerceptualLoss needs vgg_state_dict (torchvision's vgg19 weights); set "
                             "vgg_weights_path")
        if layer_weights is None:
            layer_weights = {**(TRAINNER_CONV_WEIGHTS if criterion in _CONV_CRITERIA else {}),
                             **(TRAINNER_RELU_WEIGHTS if criterion in _RELU_CRITERIA else {})}
        unknown = [k for k in layer_weights if k not in VGG19_NAMES]
        if unknown:
            raise ValueError(f"unknown VGG19 layer(s) {unknown}; valid names: {', '.join(VGG19_NAMES)}")
        layers = sorted(layer_weights, key=VGG19_NAMES.index)  # traiNNer-redux's order: the VGG's
        self.layer_weights = {k: float(layer_weights[k]) for k in layers}
        if alpha is None:
            alpha = [0.0 if k.startswith("conv") else 1.0 for k in layers]
        if len(alpha) != len(layers):
            raise ValueError(f"alpha has {len(alpha)} values for {len(layers)} layers ({', '.join(layers)}); give "
                             "one per layer in VGG order")
        self.alpha = [float(a) for a in alpha]
        if any(a < 1 for a in self.alpha) and criterion not in _CONV_CRITERIA:
            raise ValueError(f"criterion {criterion} has no term for alpha < 1 (conv layers); use {criterion}+l1 or "
                             "relu layers with alpha 1")
        if any(a > 0 for a in self.alpha) and criterion not in _RELU_CRITERIA:
            raise ValueError(f"criterion {criterion} has no term for alpha > 0 (relu layers); use pd+l1 / fd+l1 or "
                             "conv layers with alpha 0")
        self.criterion = criterion
        self.loss_weight = float(loss_weight)
        self.w_lambda = float(w_lambda)
        self.phase_weight_fd = float(phase_weight_fd)
        self.stride_fd = int(stride_fd)
        self.clip_min = float(clip_min)
        self.vgg = VGGFeatureExtractor(layers, first_padding="replicate")
        self.vgg.load_torchvision_state_dict(vgg_state_dict)
        self.num_fd = 0
        if criterion.startswith("fd"):
            gen = torch.Generator().manual_seed(FD_SEED)
            for k, a in zip(layers, self.alpha, strict=True):
                if a > 0:
                    c = _VGG19_WIDTHS[int(k[4]) - 1]
                    r = torch.randn(int(num_proj_fd), c, _FD_PATCH, _FD_PATCH, generator=gen)
                    self.register_buffer(f"fd_proj_{self.num_fd}",
                                         r / r.flatten(1).norm(dim=1).view(-1, 1, 1, 1))
                    self.num_fd += 1

    def _second(self, x: torch.Tensor, y: torch.Tensor, i: int) -> torch.Tensor:
        if self.criterion.startswith("pd"):
            return _pd(x, y)
        proj = getattr(self, f"fd_proj_{i}")
        fx, fy = torch.fft.fftn(x, dim=(-2, -1)), torch.fft.fftn(y, dim=(-2, -1))
        amp = _sliced(fx.abs(), fy.abs(), proj, self.stride_fd)
        phase = _sliced(fx.angle(), fy.angle(), proj, self.stride_fd)
        return (amp + phase * self.phase_weight_fd).mean()

    def forward(self, x: torch.Tensor, gt: torch.Tensor) -> torch.Tensor:
        with autocast_off(x):
            fx = self.vgg(x.float())
            fy = self.vgg(gt.detach().float())
            total = x.new_zeros((), dtype=torch.float32)
            i = 0
            for (k, w), a in zip(self.layer_weights.items(), self.alpha, strict=True):
                term = x.new_zeros((), dtype=torch.float32)
                if a < 1:
                    d = fx[k] - fy[k]
                    first = d.abs().mean() if self.criterion != "charbonnier" else torch.sqrt(d * d + 1e-12).mean()
                    term = term + first * (1 - a)
                if a > 0:
                    term = term + self._second(fx[k], fy[k], i) * a * self.w_lambda
                    i += 1
                total = total + term * w
            return self.loss_weight * total.clamp(min=self.clip_min)


def vgg19_stand_in(seed: int = 0, vgg_type: str = "vgg19") -> dict[str, torch.Tensor]:
    """Random VGG19 (``vgg_type`` vgg19_bn: VGG19-BN) weights in torchvision's layout (``features.N.*``), for timing
    a model without the file."""
    with torch.random.fork_rng(devices=[]):  # the global generator is left as it was
        torch.manual_seed(seed)
        net = VGGFeatureExtractor([VGG_NAMES[vgg_type][-1]], vgg_type=vgg_type)
    return {f"features.{idx}.{name}": t.detach().clone()
            for idx, module in enumerate(net.vgg_net.children())
            for name, t in module.state_dict().items() if name != "num_batches_tracked"}

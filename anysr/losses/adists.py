"""A-DISTS (Ding et al., "Locally Adaptive Structure and Texture Similarity for Image Quality Assessment", ACM MM
2021) as traiNNer-redux's ``adistsloss``: ``loss_weight * (1 - A-DISTS)`` of ``pred`` against ``target``, RGB on
[0, 1].

The features are DISTS' (``anysr.metrics.dists``: VGG16 with L2 pooling, the image and relu1_2 ... relu5_3 of the
ImageNet-normalised image); A-DISTS has no learned alpha / beta. Instead, per feature set (``h``, ``w`` at least
``window_size``; else over the whole map):

* a texture probability ``p`` from ``pred``'s features: the channel mean of windowed variance / mean (Gaussian
  window, sigma ``window_size // 3``, 'valid'), standardised over the map, through a sigmoid, min-max normalised,
  multiplied by the coarser level's ``p`` (bilinearly resized) and min-max normalised again;
* channel weights: the entropy of each channel's normalised activations of ``pred`` (over all six sets), clamped
  to half a standard deviation around their mean, summing to one;
* the windowed DISTS terms of the spatially L2-normalised features, ``t = (2 m_x m_y + c) / (m_x^2 + m_y^2 + c)``
  and ``s = (2 c_xy + c) / (v_x + v_y + c)`` (c = 1e-6), mixed as ``(1 - p) t + p s``, averaged over the map and
  summed over channels with the weights.

The VGG16 weights come from the caller (the engine reads ``weights``: torchvision's vgg16 state dict, or DISTS'
files / state dict, whose alpha / beta are not used; none given: the standard vgg16 file, as traiNNer-redux's
``pretrained=True``) as ``weight_state_dicts``. Computed in fp32 under autocast; the shapes decide which levels
are windowed, so each input shape is one graph.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor
from torch.nn import functional as F

from anysr.losses.pixel import _PixelLoss
from anysr.metrics.dists import CHANNELS, DISTSTrunk, dists_state_dict
from anysr.ops.autocast import autocast_off
from anysr.registry import LOSS_REGISTRY

StateDicts = Sequence[Mapping[str, Tensor]]

_C0 = 1e-12  # A-DISTS' guard against division by zero
_C = 1e-6  # the DISTS terms' constants
_IGNORED = ("alpha", "beta", "windows.")  # DISTS' learned weights; A-DISTS' own (fixed) Gaussian windows


def gaussian_taps(size: int, sigma: float) -> Tensor:
    """A 1-D Gaussian of ``size`` taps centred at ``size // 2``, summing to one (float32)."""
    taps = torch.tensor([math.exp(-((i - size // 2) ** 2) / float(2 * sigma**2)) for i in range(size)])
    return taps / taps.sum()


def _window(x: Tensor, taps: Tensor) -> Tensor:
    """Depthwise 'valid' filtering of every channel of ``x`` by the separable window ``taps`` (outer product)."""
    c, k = x.shape[1], taps.shape[0]
    taps = taps.to(x.dtype)
    x = F.conv2d(x, taps.view(1, 1, k, 1).expand(c, 1, k, 1), groups=c)
    return F.conv2d(x, taps.view(1, 1, 1, k).expand(c, 1, 1, k), groups=c)


def _min_max(x: Tensor) -> Tensor:
    """``x`` (N, 1, H, W) stretched to [0, 1] per image (the minimum and maximum elements take the gradient)."""
    flat = x.flatten(2)
    lo = flat.min(dim=-1, keepdim=True).values.unsqueeze(-1)
    hi = flat.max(dim=-1, keepdim=True).values.unsqueeze(-1)
    return (x - lo) / (hi - lo + _C0)


def _resize_matrix(n_in: int, n_out: int, like: Tensor) -> Tensor:
    """(n_out, n_in) weights of 1-D linear interpolation with aligned corners (PyTorch's ``align_corners=True``),
    made on ``like``'s device from its static sizes (no constant uploaded)."""
    scale = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    src = torch.arange(n_out, dtype=like.dtype, device=like.device) * scale
    lo = src.floor().clamp(max=n_in - 1)
    frac = (src - lo).unsqueeze(1)
    hi = (lo + 1).clamp(max=n_in - 1)
    cols = torch.arange(n_in, dtype=like.dtype, device=like.device)
    return (cols == lo.unsqueeze(1)) * (1 - frac) + (cols == hi.unsqueeze(1)) * frac


def _resize(x: Tensor, size: Sequence[int]) -> Tensor:
    """Bilinear resize of (N, C, h, w) with aligned corners, as two matrix products (their backward lowers on XLA,
    where ``upsample_bilinear2d``'s falls back to the CPU)."""
    rows = _resize_matrix(x.shape[-2], int(size[0]), x)
    cols = _resize_matrix(x.shape[-1], int(size[1]), x)
    return rows @ x @ cols.T


def _std(x: Tensor) -> Tensor:
    """Unbiased standard deviation over (H, W), keepdim (``Tensor.std``'s, whose XLA backward is not registered)."""
    n = x.shape[-2] * x.shape[-1]
    return ((x - x.mean(dim=(2, 3), keepdim=True)).square().sum(dim=(2, 3), keepdim=True) / (n - 1)).sqrt()


def _entropy_weights(feat: Tensor) -> Tensor:
    """Per channel (N, C, 1): the entropy (bits) of the channel's normalised ReLU activations, normalised to sum
    to C over the channels."""
    n, c = feat.shape[:2]
    p = F.normalize(F.relu(feat), dim=(2, 3)).reshape(n, c, -1)
    p = p / (p.sum(dim=2, keepdim=True) + _C0)
    h = (-p * torch.log2(p + _C0)).sum(dim=2, keepdim=True)
    return h / (h.sum(dim=1, keepdim=True) + _C0) * c


class ADISTS(DISTSTrunk):
    """A-DISTS between two batches of RGB images on [0, 1] -> a scalar, one minus the batch mean (lower is
    better). ``window_size`` (a multiple of 3): the Gaussian window's taps. Load VGG16 with ``load_weights``."""

    def __init__(self, window_size: int = 21) -> None:
        super().__init__()
        self.window_size = int(window_size)
        self.register_buffer("taps", gaussian_taps(self.window_size, self.window_size // 3), persistent=False)
        self.freeze()

    def load_weights(self, *state_dicts: Mapping[str, Tensor]) -> ADISTS:
        """VGG16 from torchvision's ``features.N.*``, DISTS' or traiNNer-redux's ``stage{k}.N.*`` keys (alpha,
        beta and A-DISTS' ``windows.*`` are skipped); every convolution must be covered."""
        merged: dict[str, Tensor] = {}
        for sd in state_dicts:
            kept = {k: v for k, v in sd.items() if not k.removeprefix("module.").startswith(_IGNORED)}
            merged.update(dists_state_dict(kept))
        missing = sorted(name for name, _ in self.named_parameters() if name not in merged)
        self.load_checked(merged, missing, "A-DISTS", "give torchvision's vgg16 state dict (features.N.*)")
        return self

    def _windowed(self, f: Tensor) -> bool:
        return min(f.shape[-2:]) >= self.window_size

    def texture_probability(self, feats: Sequence[Tensor]) -> list[Tensor]:
        """Per feature set (N, 1, h, w) (windowed) or (N, 1, 1, 1): how much each place is texture."""
        out = []
        prod: Tensor | None = None  # the finer levels' product; at first ones (resized ones are ones)
        for f in reversed(feats):
            if self._windowed(f):
                m = _window(f, self.taps)
                v = _window(f * f, self.taps) - m * m
                gamma = (v / (m + _C0)).mean(dim=1, keepdim=True)
                z = -(gamma - gamma.mean(dim=(2, 3), keepdim=True)) / (_std(gamma) + _C0)
                ps = _min_max(1 / (1 + torch.exp(z.clamp(max=50))))
                prod = _min_max(ps if prod is None else ps * _resize(prod, m.shape[-2:]))
            else:
                m = f.mean(dim=(2, 3), keepdim=True)
                v = (f - m).square().mean(dim=(2, 3), keepdim=True)
                gamma = (v / (m + _C0)).mean(dim=1, keepdim=True)
                ps = 1 / (1 + torch.exp(-gamma))
                prod = ps if prod is None else ps * prod[:, :, :1, :1]  # a 1x1 aligned-corner resize: the corner
            out.append(prod)
        return out[::-1]

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        n = x.shape[0]
        feats = [f.float() for f in self.features(torch.cat([x, y]))]
        fx, fy = [f[:n] for f in feats], [f[n:] for f in feats]
        probs = self.texture_probability(fx)
        w = torch.cat([_entropy_weights(f) for f in fx], dim=1)
        w = w / w.sum(dim=(1, 2), keepdim=True)
        mu = w.mean(dim=(1, 2), keepdim=True)
        sd = (w - mu).square().mean(dim=(1, 2), keepdim=True).sqrt()
        w = w.clamp(min=mu - 0.5 * sd, max=mu + 0.5 * sd)
        w = w / w.sum(dim=(1, 2), keepdim=True)
        weights = torch.split(w, list(CHANNELS), dim=1)
        d: Tensor | float = 0.0
        for k in reversed(range(len(feats))):
            a, b = F.normalize(fx[k], dim=(2, 3)), F.normalize(fy[k], dim=(2, 3))
            if self._windowed(a):
                ma, mb = _window(a, self.taps), _window(b, self.taps)
                va = _window(a * a, self.taps) - ma * ma
                vb = _window(b * b, self.taps) - mb * mb
                cov = _window(a * b, self.taps) - ma * mb
            else:
                ma, mb = a.mean(dim=(2, 3), keepdim=True), b.mean(dim=(2, 3), keepdim=True)
                va = (a - ma).square().mean(dim=(2, 3), keepdim=True)
                vb = (b - mb).square().mean(dim=(2, 3), keepdim=True)
                cov = (a * b).mean(dim=(2, 3), keepdim=True) - ma * mb
            t = (2 * ma * mb + _C) / (ma * ma + mb * mb + _C)
            s = (2 * cov + _C) / (va + vb + _C)
            p = probs[k]
            d = d + (((1 - p) * t + p * s) * weights[k].unsqueeze(3)).mean(dim=(2, 3)).sum(dim=1)
        assert isinstance(d, Tensor)
        return 1 - d.mean()


@LOSS_REGISTRY.register()
class ADISTSLoss(_PixelLoss):
    """traiNNer-redux's ``adistsloss``: ``loss_weight * (1 - A-DISTS(pred, target))``, RGB on [0, 1].

    ``window_size``: the Gaussian window (a multiple of 3; sigma a third of it); ``resize_input`` is accepted and,
    as in traiNNer-redux, not used. ``weights``: torchvision's vgg16 file (or DISTS' files), read by the engine;
    ``weight_state_dicts``: their contents (``ADISTS.load_weights``).
    """

    role = "learned"  # which train.*_opt accepts it (the options read this)
    metric_name = "adists"  # no ``weights``: the engine finds the standard vgg16 by name

    def __init__(self, loss_weight: float = 1.0, window_size: int = 21, resize_input: bool = False,
                 weights: Sequence[str] | None = None, weight_state_dicts: StateDicts | None = None) -> None:
        super().__init__(loss_weight, "mean")
        if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 3 or window_size % 3:
            raise ValueError(f"window_size must be a positive multiple of 3, got {window_size!r}")
        if not weight_state_dicts:
            raise ValueError("ADISTSLoss needs weight_state_dicts (torchvision's vgg16); set the loss's `weights` "
                             "to that file")
        self.resize_input = bool(resize_input)
        self.metric = ADISTS(window_size).load_weights(*weight_state_dicts)

    def forward(self, pred: Tensor, target: Tensor) -> Tensor:
        if pred.dim() != 4 or pred.shape[1] != 3 or pred.shape != target.shape:
            raise ValueError(f"ADISTSLoss takes two NCHW RGB images of one shape, got {tuple(pred.shape)} and "
                             f"{tuple(target.shape)}")
        with autocast_off(pred):
            return self.loss_weight * self.metric(pred.float(), target.detach().float())


__all__ = ["ADISTS", "ADISTSLoss", "gaussian_taps"]

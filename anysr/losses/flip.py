"""NVIDIA's LDR-FLIP as a loss (Andersson et al., "FLIP: A Difference Evaluator for Alternating Images", HPG 2020),
traiNNer-redux's ``fliploss``: the mean FLIP error of two sRGB images on [0, 1] times ``loss_weight``.

Both images (clamped to [0, 1]) go to the opponent space YCxCz (sRGB -> linear -> XYZ, D65 -> Y, Cx, Cz).
Colour pipeline: each channel is blurred by its contrast sensitivity filter (a sum of Gaussians whose width
follows ``pixels_per_degree``; replicate padding), taken back to linear RGB and clamped to the unit cube, then to
CIELAB with the Hunt adjustment (a, b scaled by L / 100); the HyAB distance ``|dL| + sqrt(da^2 + db^2 + eps)``
raised to 0.7 is mapped onto [0, 1] piecewise linearly (``pc`` 0.4 of the largest distance, green to blue, goes to
``pt`` 0.95). Feature pipeline: the normalised luma ``(Y + 16) / 116`` of the unblurred images meets edge (first
derivative) and point (second derivative) detectors of a Gaussian (sigma 0.041 degree); the larger difference of
the two images' edge or point magnitudes, clamped at ``eps``, over sqrt(2), to the power 0.5, is ``f``. The
error map is ``colour ** (1 - f)``. Computed in fp32 under autocast; pure tensor code (the filters are buffers
made once from ``pixels_per_degree``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch.nn import functional as F

from anysr.losses.pixel import _PixelLoss
from anysr.ops.autocast import autocast_off
from anysr.ops.color import srgb_to_linear
from anysr.registry import LOSS_REGISTRY

Mat3 = tuple[tuple[float, float, float], tuple[float, float, float], tuple[float, float, float]]

# linear sRGB <-> XYZ (D65) as FLIP writes them (the second is the first's inverse, rounded as FLIP rounds it)
_LIN_TO_XYZ: Mat3 = ((10135552 / 24577794, 8788810 / 24577794, 4435075 / 24577794),
                     (2613072 / 12288897, 8788810 / 12288897, 887015 / 12288897),
                     (1425312 / 73733382, 8788810 / 73733382, 70074185 / 73733382))
_XYZ_TO_LIN: Mat3 = ((3.241003275, -1.537398934, -0.498615861),
                     (-0.969224334, 1.875930071, 0.041554224),
                     (0.055639423, -0.204011202, 1.057148933))
_D65 = (0.950428545, 1.0, 1.088900371)
_INV_D65 = (1.052156925, 1.0, 0.918357670)
_LAB_DELTA = 6 / 29
# contrast sensitivity functions (a1, b1, a2, b2) of the achromatic, red-green and blue-yellow channels
_CSF = ((1.0, 0.0047, 0.0, 1e-5), (1.0, 0.0053, 0.0, 1e-5), (34.1, 0.04, 13.5, 0.025))
_EDGE_WIDTH = 0.082  # peak to trough (two standard deviations) of the human edge detector, in degrees
_DEFAULT_PPD = (0.7 * 3840 / 0.7) * math.pi / 180  # a 0.7 m wide 4K screen seen from 0.7 m


def _mat3(x: torch.Tensor, m: Mat3) -> torch.Tensor:
    """``m @ x`` over the channels of NCHW ``x`` (Python constants: nothing is uploaded)."""
    return torch.cat([x[:, 0:1] * r[0] + x[:, 1:2] * r[1] + x[:, 2:3] * r[2] for r in m], dim=1)


def _scale3(x: torch.Tensor, s: tuple[float, float, float]) -> torch.Tensor:
    return torch.cat([x[:, 0:1] * s[0], x[:, 1:2] * s[1], x[:, 2:3] * s[2]], dim=1)


def srgb_to_ycxcz(x: torch.Tensor) -> torch.Tensor:
    """NCHW sRGB -> FLIP's opponent space (Y, Cx, Cz) = (116 y - 16, 500 (x - y), 200 (y - z)), XYZ over D65."""
    xyz = _scale3(_mat3(srgb_to_linear(x), _LIN_TO_XYZ), _INV_D65)
    xx, yy, zz = xyz[:, 0:1], xyz[:, 1:2], xyz[:, 2:3]
    return torch.cat([116 * yy - 16, 500 * (xx - yy), 200 * (yy - zz)], dim=1)


def ycxcz_to_linear(x: torch.Tensor) -> torch.Tensor:
    """FLIP's opponent space -> linear sRGB (not clamped)."""
    y = (x[:, 0:1] + 16) / 116
    xyz = torch.cat([y + x[:, 1:2] / 500, y, y - x[:, 2:3] / 200], dim=1)
    return _mat3(_scale3(xyz, _D65), _XYZ_TO_LIN)


def linear_to_hunt_lab(x: torch.Tensor) -> torch.Tensor:
    """Linear sRGB -> CIELAB (D65; the cube root sees at least delta^3) with the Hunt adjustment: a, b times L / 100."""
    t = _scale3(_mat3(x, _LIN_TO_XYZ), _INV_D65)
    cube = _LAB_DELTA**3
    f = torch.where(t > cube, t.clamp_min(cube) ** (1 / 3), t / (3 * _LAB_DELTA**2) + 4 / 29)
    lum = 116 * f[:, 1:2] - 16
    return torch.cat([lum, 0.01 * lum * (500 * (f[:, 0:1] - f[:, 1:2])), 0.01 * lum * (200 * (f[:, 1:2] - f[:, 2:3]))],
                     dim=1)


def _hyab(a: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    d = a - b
    return d[:, 0:1].abs() + torch.sqrt(d[:, 1:2].square() + d[:, 2:3].square() + eps)


def csf_filters(pixels_per_degree: float) -> torch.Tensor:
    """The three contrast sensitivity filters (3, 1, 2r + 1, 2r + 1), each summing to one, as float32."""
    r = int(np.ceil(3 * np.sqrt(max(max(c[1], c[3]) for c in _CSF) / (2 * np.pi**2)) * pixels_per_degree))
    x, y = np.meshgrid(np.arange(-r, r + 1), np.arange(-r, r + 1))
    z = (x / pixels_per_degree) ** 2 + (y / pixels_per_degree) ** 2
    out = []
    for a1, b1, a2, b2 in _CSF:
        g = a1 * np.sqrt(np.pi / b1) * np.exp(-(np.pi**2) * z / b1) + a2 * np.sqrt(np.pi / b2) * np.exp(
            -(np.pi**2) * z / b2)
        out.append(torch.from_numpy(g / g.sum()).float())
    return torch.stack(out).unsqueeze(1)


def feature_filters(pixels_per_degree: float) -> torch.Tensor:
    """Edge and point detectors (4, 1, 2r + 1, 2r + 1): edge along x, along y, point along x, along y; positive
    weights sum to 1 and negative ones to -1."""
    sd = 0.5 * _EDGE_WIDTH * pixels_per_degree
    r = int(np.ceil(3 * sd))
    x, y = np.meshgrid(np.arange(-r, r + 1), np.arange(-r, r + 1))
    g = np.exp(-(x**2 + y**2) / (2 * sd * sd))
    out = []
    for k in (-x * g, (x**2 / (sd * sd) - 1) * g):
        neg, pos = float(-k[k < 0].sum()), float(k[k > 0].sum())
        t = torch.from_numpy(k).float()
        t = torch.where(t < 0, t / neg, t / pos)
        out += [t, t.T]
    return torch.stack(out).unsqueeze(1)


@LOSS_REGISTRY.register()
class FLIPLoss(_PixelLoss):
    """traiNNer-redux's ``fliploss``: ``loss_weight`` times the mean LDR-FLIP error (0..1) of ``pred`` against
    ``target``, NCHW sRGB on [0, 1]; ``pixels_per_degree``: the observer's pixels per degree of visual angle
    (sets the filters' widths; by default a 0.7 m wide 4K screen at 0.7 m, about 67)."""

    qc, qf, pc, pt, eps = 0.7, 0.5, 0.4, 0.95, 1e-4

    def __init__(self, loss_weight: float = 1.0, pixels_per_degree: float = _DEFAULT_PPD) -> None:
        super().__init__(loss_weight, "mean")
        ppd = pixels_per_degree
        if isinstance(ppd, bool) or not (isinstance(ppd, (int, float)) and math.isfinite(ppd) and ppd > 0):
            raise ValueError(f"pixels_per_degree must be a positive number, got {pixels_per_degree!r}")
        self.pixels_per_degree = float(pixels_per_degree)
        self.register_buffer("csf", csf_filters(self.pixels_per_degree), persistent=False)
        self.register_buffer("features", feature_filters(self.pixels_per_degree), persistent=False)
        # the largest colour difference: Hunt-adjusted green against blue, to the power qc
        green_blue = linear_to_hunt_lab(torch.eye(3)[1:].view(2, 3, 1, 1))
        self.cmax = float(_hyab(green_blue[0:1], green_blue[1:2], self.eps) ** self.qc)

    def error_map(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Per-pixel FLIP error (N, 1, H, W) on [0, 1], computed in the inputs' dtype."""
        n = pred.shape[0]
        opp = srgb_to_ycxcz(torch.cat([pred, target]).clamp(0, 1))
        r = self.csf.shape[-1] // 2
        blurred = F.conv2d(F.pad(opp, (r, r, r, r), mode="replicate"), self.csf.to(opp.dtype), groups=3)
        lab = linear_to_hunt_lab(ycxcz_to_linear(blurred).clamp(0, 1))
        power = _hyab(lab[n:], lab[:n], self.eps) ** self.qc
        pccmax = self.pc * self.cmax
        colour = torch.where(power < pccmax, (self.pt / pccmax) * power,
                             self.pt + ((power - pccmax) / (self.cmax - pccmax)) * (1.0 - self.pt))
        luma = (opp[:, 0:1] + 16) / 116
        r = self.features.shape[-1] // 2
        feats = F.conv2d(F.pad(luma, (r, r, r, r), mode="replicate"), self.features.to(luma.dtype))
        edges = torch.linalg.vector_norm(feats[:, 0:2], dim=1, keepdim=True)
        points = torch.linalg.vector_norm(feats[:, 2:4], dim=1, keepdim=True)
        feature = torch.maximum((edges[n:] - edges[:n]).abs(), (points[:n] - points[n:]).abs()).clamp_min(self.eps)
        feature = ((1 / math.sqrt(2)) * feature) ** self.qf
        return colour ** (1 - feature)

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if pred.dim() != 4 or pred.shape[1] != 3 or pred.shape != target.shape:
            raise ValueError(f"FLIPLoss takes two NCHW sRGB images of one shape, got {tuple(pred.shape)} and "
                             f"{tuple(target.shape)}")
        with autocast_off(pred):
            return self.loss_weight * self.error_map(pred.float(), target.float()).mean()


__all__ = ["FLIPLoss", "csf_filters", "feature_filters", "linear_to_hunt_lab", "srgb_to_ycxcz", "ycxcz_to_linear"]

"""neosr's small losses under its type names (``mssim_loss``, ``consistency_loss``, ``kl_loss``, ``msswd_loss``,
``ncc_loss``, ``ff_loss``, ``ldl_loss``, ``chc_loss``, ``gan_loss`` in its ``[train.<name>_opt]`` tables), with its
argument names and defaults, computing what neosr computes (checked against its source on fixtures). Inputs are
NCHW; computed in fp32 under autocast.

* ``PaddedMSSSIMLoss`` (``mssim_loss``): 1 - MS-SSIM of every channel with zero-padded 'same' Gaussian filtering,
  each scale's term the mean over the whole batch (not per image), no clamping (a negative contrast mean gives NaN,
  as in neosr).
* ``ConsistencyLoss`` (``consistency_loss``): CIE L* (of the 21-tap, sigma 3 blurred images) and Oklab chroma
  distances, plus their cosine terms where these are below 1e-3.
* ``KLDivergenceLoss`` (``kl_loss``): 0.03 x KL(softmax over channels of the target || that of the prediction).
* ``MSSWDLoss`` (``msswd_loss``): sliced Wasserstein distance of CIELAB patches on a Gaussian pyramid. The random
  projections are drawn per call from a generator keyed by (seed, iteration, call), not from the global RNG.
* ``ncc_loss`` is :class:`~anysr.losses.downscaled.NCCLoss` (the same maths); ``ff_loss`` is
  ``FocalFrequencyLoss``, 50 x :class:`~anysr.losses.frequency.FFLoss` with ``ave_spectrum`` on.
* ``ArtifactWeightedLoss`` (``ldl_loss``): LDL's artifact map without the EMA comparison.
* ``CHCLoss`` (``chc_loss``): clipped pseudo-Huber (or L1) with an optional cosine-similarity term.
* ``LabelledGANLoss`` (``gan_loss``, role ``gan``): BCE-with-logits, MSE or Huber to the real / fake label.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn
from torch.nn import functional as F

from anysr.losses.artifact import local_variance
from anysr.losses.color import srgb_to_oklab
from anysr.losses.downscaled import _check_pair
from anysr.losses.frequency import FFLoss
from anysr.losses.pixel import _PixelLoss, huber
from anysr.losses.structure import MS_SSIM_WEIGHTS, _blur, gaussian_window, ssim_parts
from anysr.ops.autocast import autocast_off
from anysr.registry import LOSS_REGISTRY


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} '{value}' is not supported; use one of {', '.join(allowed)}")
    return value


# ---------------------------------------------------------------- chc (clipped pseudo-Huber + cosine similarity)

def chc_distance(pred: torch.Tensor, target: torch.Tensor, criterion: str = "huber", loss_lambda: float = 0.0,
                 clip_min: float = 0.003921, clip_max: float = 0.996078) -> torch.Tensor:
    """neosr's ``chc_loss`` value: the mean of ``clamp(d + loss_lambda * (1 - mean cos), clip_min, clip_max)``,
    ``d`` = ``|pred - target|`` (``l1``) or ``sqrt((pred - target)^2 + 1e-12)`` (``huber``), the cosine similarity
    taken along dim 1 (eps 1e-20). With ``loss_lambda`` 0 the cosine term is not computed (neosr adds 0 times it)."""
    diff = pred - target
    d = diff.abs() if criterion == "l1" else torch.sqrt(diff * diff + 1e-12)
    if loss_lambda:
        d = d + loss_lambda * (1 - F.cosine_similarity(pred, target, dim=1, eps=1e-20)).mean()
    return torch.clamp(d, clip_min, clip_max).mean()


@LOSS_REGISTRY.register()
class CHCLoss(_PixelLoss):
    """neosr's ``chc_loss``: ``loss_weight`` times :func:`chc_distance` (``criterion`` ``huber`` or ``l1``). As in
    neosr, ``reduction`` is checked but the value is always the mean."""

    other_names = ("chc_loss",)

    def __init__(self, loss_weight: float = 1.0, reduction: str = "mean", criterion: str = "huber",
                 loss_lambda: float = 0, clip_min: float = 0.003921, clip_max: float = 0.996078) -> None:
        super().__init__(loss_weight, reduction)
        self.criterion = _choice("criterion", criterion, ("huber", "l1"))
        self.loss_lambda = float(loss_lambda)
        self.clip_min, self.clip_max = float(clip_min), float(clip_max)

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if pred.shape != target.shape:
            raise ValueError(f"CHCLoss takes two images of one shape, got {tuple(pred.shape)} and "
                             f"{tuple(target.shape)}")
        with autocast_off(pred):
            loss = chc_distance(pred.float(), target.float(), self.criterion, self.loss_lambda, self.clip_min,
                                self.clip_max)
        return self.loss_weight * loss


def huber_mean(a: torch.Tensor, b: torch.Tensor, delta: float = 1.0) -> torch.Tensor:
    """``F.huber_loss(a, b, delta=delta)`` (mean), XLA-friendly (:func:`anysr.losses.pixel.huber`)."""
    return huber(a, b, delta).mean()


def _criterion(name: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The mean distance neosr's ``consistency_loss`` / ``ldl_loss`` build from ``criterion``."""
    if name == "l1":
        return F.l1_loss(a, b)
    if name == "l2":
        return F.mse_loss(a, b)
    if name == "huber":
        return huber_mean(a, b)
    return chc_distance(a, b, "huber", 0.0, 0.0, 1.0)  # chc: chc_loss(loss_lambda=0, clip_min=0, clip_max=1)


# ---------------------------------------------------------------- mssim_loss

@LOSS_REGISTRY.register()
class PaddedMSSSIMLoss(_PixelLoss):
    """neosr's ``mssim_loss``: ``loss_weight * (1 - MS-SSIM)``, five scales (Wang et al.'s weights), a
    ``window_size`` Gaussian (``sigma``) filtering every channel on ``padding`` zeros (default ``window_size // 2``:
    'same' size), ``C1 = (K1 L)^2``, ``C2 = (K2 L)^2``; each scale's contrast-structure (SSIM at the last) is the
    mean over the whole batch, and the scales' powers multiply. 2x2 average pooling pads odd sides. Images must
    have ``in_channels`` channels."""

    other_names = ("mssim_loss",)

    def __init__(self, window_size: int = 11, in_channels: int = 3, sigma: float = 1.5, K1: float = 0.01,  # noqa: N803
                 K2: float = 0.03, L: int = 1, padding: int | None = None, loss_weight: float = 1.0) -> None:  # noqa: N803
        super().__init__(loss_weight, "mean")
        if isinstance(window_size, bool) or int(window_size) != window_size or window_size < 1 or window_size % 2 != 1:
            raise ValueError(f"window_size must be a positive odd integer, got {window_size!r}")
        if isinstance(in_channels, bool) or int(in_channels) != in_channels or in_channels < 1:
            raise ValueError(f"in_channels must be a positive integer, got {in_channels!r}")
        if not sigma > 0:
            raise ValueError(f"sigma must be > 0, got {sigma!r}")
        if padding is not None and (isinstance(padding, bool) or int(padding) != padding or padding < 0):
            raise ValueError(f"padding must be None or an integer >= 0, got {padding!r}")
        self.window_size = int(window_size)
        self.in_channels = int(in_channels)
        self.padding = self.window_size // 2 if padding is None else int(padding)
        self.k = (float(K1), float(K2))
        self.data_range = float(L)
        self.register_buffer("win", gaussian_window(self.window_size, float(sigma)), persistent=False)

    def _check(self, pred: torch.Tensor, target: torch.Tensor) -> None:
        if pred.dim() != 4 or pred.shape != target.shape or pred.shape[1] != self.in_channels:
            raise ValueError(f"PaddedMSSSIMLoss takes two NCHW images of one shape with in_channels="
                             f"{self.in_channels} channels, got {tuple(pred.shape)} and {tuple(target.shape)}")
        h, w = pred.shape[-2:]
        for _ in MS_SSIM_WEIGHTS:
            if min(h, w) + 2 * self.padding < self.window_size:
                raise ValueError(f"PaddedMSSSIMLoss: {pred.shape[-2]}x{pred.shape[-1]} images are too small for "
                                 f"five scales with window_size {self.window_size} and padding {self.padding}")
            h, w = h // 2 + 1 if h % 2 else h // 2, w // 2 + 1 if w % 2 else w // 2

    def ms_ssim(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The batch's MS-SSIM (a scalar) of fp32 images."""
        pad = (self.padding,) * 4
        out = None
        last = len(MS_SSIM_WEIGHTS) - 1
        for i, w in enumerate(MS_SSIM_WEIGHTS):
            ssim, cs = ssim_parts(F.pad(x, pad), F.pad(y, pad), self.win, self.data_range, self.k)
            term = (ssim.mean() if i == last else cs.mean()) ** w
            out = term if out is None else out * term
            if i < last:
                odd = [s % 2 for s in x.shape[2:]]
                x = F.avg_pool2d(x, kernel_size=2, stride=2, padding=odd)
                y = F.avg_pool2d(y, kernel_size=2, stride=2, padding=odd)
        assert out is not None
        return out

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self._check(pred, target)
        with autocast_off(pred):
            return self.loss_weight * (1.0 - self.ms_ssim(pred.float(), target.float()))


# ---------------------------------------------------------------- consistency_loss

_LUMA_709 = (0.2126, 0.7152, 0.0722)
_BLUR_TAPS, _BLUR_SIGMA = 21, 3.0  # torchvision's GaussianBlur(21, 3), reflect padding


def _linear_rgb(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x <= 0.04045, x / 12.92, torch.pow((x + 0.055) / 1.055, 2.4))


def l_star(x: torch.Tensor) -> torch.Tensor:
    """neosr's CIE L* / 100 of NCHW sRGB (N, H, W), clamped to [0, 1]: Rec. 709 luma Y of the linear RGB, then
    ``116 cbrt(Y) - 16`` above 216 / 24389 and (as neosr writes it) ``Y * Y * 24389 / 27`` below."""
    lin = _linear_rgb(x)
    y = lin[:, 0] * _LUMA_709[0] + lin[:, 1] * _LUMA_709[1] + lin[:, 2] * _LUMA_709[2]
    cube = y.sign() * y.abs().pow(1 / 3) * 116 - 16
    return torch.clamp(torch.where(y <= 216 / 24389, y * (y * (24389 / 27)), cube) / 100, 0, 1)


@LOSS_REGISTRY.register()
class ConsistencyLoss(nn.Module):
    """neosr's ``consistency_loss``: on RGB images clamped to [1/255, 1], ``criterion`` (``chc``: clipped
    pseudo-Huber; ``l1``) distance of the CIE L* (of the images blurred by a 21-tap, sigma 3 Gaussian, reflect
    padded, when ``blur``; the target's times ``brightness``) plus that of the Oklab chroma (a, b; the target's
    times ``saturation``; both + 0.5 clamped to [0, 1]). With ``cosim``, ``0.5 (1 - cos chroma) + 0.5 (1 - cos
    L*)`` is added where it is below 1e-3 (cosine along dim 1: the chroma pair, and for L* the image rows)."""

    role = "pixel"
    matches_lq_colors = True  # train.match_lq_colors: compared with the upscaled LQ, as neosr
    other_names = ("consistency_loss",)

    def __init__(self, criterion: str = "chc", blur: bool = True, cosim: bool = True, saturation: float = 1.0,
                 brightness: float = 1.0, loss_weight: float = 1.0) -> None:
        super().__init__()
        self.criterion = _choice("criterion", criterion, ("chc", "l1"))
        self.blur = bool(blur)
        self.cosim = bool(cosim)
        self.saturation = float(saturation)
        self.brightness = float(brightness)
        self.loss_weight = float(loss_weight)
        self.register_buffer("win", gaussian_window(_BLUR_TAPS, _BLUR_SIGMA), persistent=False)

    def _blurred(self, x: torch.Tensor) -> torch.Tensor:
        pad = (_BLUR_TAPS // 2,) * 4
        return torch.clamp(_blur(F.pad(x, pad, mode="reflect"), self.win), 0, 1)

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        _check_pair("ConsistencyLoss", pred, target, rgb=True)
        if self.blur and min(pred.shape[-2:]) <= _BLUR_TAPS // 2:
            raise ValueError(f"ConsistencyLoss: {pred.shape[-2]}x{pred.shape[-1]} images are too small for the "
                             f"blur's reflect padding; both sides must be > {_BLUR_TAPS // 2} (or blur: false)")
        with autocast_off(pred):
            x = torch.clamp(pred.float(), 1 / 255, 1)
            y = torch.clamp(target.float(), 1 / 255, 1)
            if self.blur:
                luma_x, luma_y = l_star(self._blurred(x)), l_star(self._blurred(y)) * self.brightness
            else:
                luma_x, luma_y = l_star(x), l_star(y) * self.brightness
            chroma_x = torch.clamp(srgb_to_oklab(x)[:, 1:] + 0.5, 0, 1)
            chroma_y = torch.clamp(srgb_to_oklab(y)[:, 1:] * self.saturation + 0.5, 0, 1)
            loss = _criterion(self.criterion, luma_x, luma_y) + _criterion(self.criterion, chroma_x, chroma_y)
            if self.cosim:
                cos_chroma = 1 - F.cosine_similarity(chroma_x, chroma_y, dim=1, eps=1e-20).mean()
                cos_luma = 1 - F.cosine_similarity(luma_x, luma_y, dim=1, eps=1e-20).mean()
                cos = 0.5 * cos_chroma + 0.5 * cos_luma
                loss = torch.where(cos < 1e-3, loss + cos, loss)  # neosr: `if cosim < 1e-3`, without a host sync
        return loss * self.loss_weight


# ---------------------------------------------------------------- kl_loss

@LOSS_REGISTRY.register()
class KLDivergenceLoss(nn.Module):
    """neosr's ``kl_loss``: ``loss_weight * 0.03 * KL(q || p)`` averaged over the batch (``batchmean``), ``p``
    and ``q`` the softmax over channels of the prediction and of the target, ``log(p + 1e-8)`` as the log."""

    role = "pixel"
    other_names = ("kl_loss",)

    def __init__(self, loss_weight: float = 1.0) -> None:
        super().__init__()
        self.loss_weight = float(loss_weight)

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if pred.dim() < 2 or pred.shape != target.shape:
            raise ValueError(f"KLDivergenceLoss takes two (N, C, ...) tensors of one shape, got {tuple(pred.shape)} "
                             f"and {tuple(target.shape)}")
        with autocast_off(pred):
            log_p = torch.log(F.softmax(pred.float(), dim=1) + 1e-8)
            q = F.softmax(target.float(), dim=1)
            # F.kl_div(log_p, q, reduction="batchmean") written out (aten::kl_div has no autograd kernel on XLA)
            loss = (torch.xlogy(q, q) - q * log_p).sum() / pred.shape[0] * 0.03
        return loss * self.loss_weight


# ---------------------------------------------------------------- msswd_loss

_XYZ = ((10135552 / 24577794, 8788810 / 24577794, 4435075 / 24577794),
        (2613072 / 12288897, 8788810 / 12288897, 887015 / 12288897),
        (1425312 / 73733382, 8788810 / 73733382, 70074185 / 73733382))
_INV_D65 = (1.052156925, 1.0, 0.918357670)


def srgb_to_lab(x: torch.Tensor) -> torch.Tensor:
    """NCHW sRGB -> CIELAB (D65) as neosr's ``msswd_loss`` converts: the sRGB curve with the power branch's input
    clamped at 0.04045, the sRGB -> XYZ matrix, the white point divided out, the Lab curve with its cube root's
    input clamped at (6 / 29)^3."""
    lin = torch.where(x > 0.04045, torch.pow((torch.clamp(x, min=0.04045) + 0.055) / 1.055, 2.4), x / 12.92)
    m = torch.tensor(_XYZ, dtype=x.dtype, device=x.device)
    xyz = torch.einsum("kc,nchw->nkhw", m, lin)
    xyz = xyz * torch.tensor(_INV_D65, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    delta = 6 / 29
    f = torch.where(xyz > delta**3, torch.pow(torch.clamp(xyz, min=delta**3), 1 / 3),
                    xyz / (3 * delta * delta) + 4 / 29)
    fx, fy, fz = f[:, 0:1], f[:, 1:2], f[:, 2:3]
    return torch.cat((116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)), 1)


_BINOMIAL5 = (1 / 16, 4 / 16, 6 / 16, 4 / 16, 1 / 16)


def gaussian_pyramid_level(x: torch.Tensor, level: int) -> torch.Tensor:
    """Level ``level`` of neosr's Gaussian pyramid: ``level`` times the 5-tap binomial filter on reflect padding,
    then every second row and column."""
    win = torch.tensor(_BINOMIAL5, dtype=x.dtype, device=x.device)
    for _ in range(level):
        x = _blur(F.pad(x, (2, 2, 2, 2), mode="reflect"), win)[:, :, ::2, ::2]
    return x


def _draw_seed(*key: int) -> int:
    digest = hashlib.blake2b(":".join(str(k) for k in ("msswd", *key)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@LOSS_REGISTRY.register()
class MSSWDLoss(nn.Module):
    """neosr's ``msswd_loss``: multi-scale sliced Wasserstein distance (after real-hjq/MS-SWD) of RGB images in
    CIELAB, ``loss_weight * 0.1 * mean over images of SWD / num_scale``. SWD: ``num_proj`` random unit directions
    of ``c x patch_size^2`` patches (reflect padded, ``stride``), each projection's values sorted, mean absolute
    difference. As neosr's source sums after its loop over the ``num_scale`` pyramid levels, only the last
    (coarsest) level's distance enters; it alone is computed here.

    Randomness: neosr draws new projections from the global RNG at every call. Here every call draws them from a
    generator seeded by (``seed``, iteration, call within the iteration), set by the model through
    :meth:`at_iteration` (``manual_seed`` and the iteration): a resumed run draws what the first run drew, and
    all ranks draw the same. They are made on the CPU and uploaded (an input, not a constant: one compile).
    """

    role = "pixel"
    matches_lq_colors = True  # train.match_lq_colors: compared with the upscaled LQ, as neosr
    other_names = ("msswd_loss",)

    def __init__(self, num_scale: int = 3, num_proj: int = 24, patch_size: int = 11, stride: int = 1, c: int = 3,
                 loss_weight: float = 1.0) -> None:
        super().__init__()
        for name, value in (("num_scale", num_scale), ("num_proj", num_proj), ("patch_size", patch_size),
                            ("stride", stride)):
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if c != 3:
            raise ValueError(f"c must be 3 (the CIELAB channels the projections see), got {c!r}")
        self.num_scale, self.num_proj = int(num_scale), int(num_proj)
        self.patch_size, self.stride, self.c = int(patch_size), int(stride), 3
        self.loss_weight = float(loss_weight)
        self.seed, self.iteration, self.calls = 0, 0, 0

    def at_iteration(self, iteration: int, seed: int = 0) -> None:
        """Key the next draws by (``seed``, ``iteration``, call); the call count restarts at a new iteration."""
        if (int(seed), int(iteration)) != (self.seed, self.iteration):
            self.seed, self.iteration, self.calls = int(seed), int(iteration), 0

    def projections(self, seed: int, iteration: int, call: int) -> torch.Tensor:
        """The (num_proj, 3, patch_size, patch_size) unit projections of draw (seed, iteration, call), on the CPU."""
        gen = torch.Generator().manual_seed(_draw_seed(seed, iteration, call))
        rand = torch.randn(self.num_proj, self.c * self.patch_size**2, generator=gen)
        rand = rand / torch.linalg.vector_norm(rand, dim=1, keepdim=True)
        return rand.reshape(self.num_proj, self.c, self.patch_size, self.patch_size)

    def _check(self, pred: torch.Tensor, target: torch.Tensor) -> None:
        _check_pair("MSSWDLoss", pred, target, rgb=True)
        h, w = pred.shape[-2:]
        for _ in range(self.num_scale - 1):
            if min(h, w) <= 2:
                raise ValueError(f"MSSWDLoss: {pred.shape[-2]}x{pred.shape[-1]} images are too small for "
                                 f"num_scale {self.num_scale}")
            h, w = (h + 1) // 2, (w + 1) // 2
        if min(h, w) <= self.patch_size // 2:
            raise ValueError(f"MSSWDLoss: the last pyramid level ({h}x{w}) of {pred.shape[-2]}x{pred.shape[-1]} "
                             f"images is too small for patch_size {self.patch_size}; use larger images, a smaller "
                             "num_scale or patch_size")

    def forward(self, pred: torch.Tensor, target: torch.Tensor,
                projections: torch.Tensor | None = None) -> torch.Tensor:
        """``projections``: given directions (tests); by default the next keyed draw."""
        self._check(pred, target)
        if projections is None:
            projections = self.projections(self.seed, self.iteration, self.calls)
            self.calls += 1
        with autocast_off(pred):
            x, y = pred.float(), target.float()
            rand = projections.to(device=x.device, dtype=x.dtype)
            level = self.num_scale - 1
            x, y = srgb_to_lab(gaussian_pyramid_level(x, level)), srgb_to_lab(gaussian_pyramid_level(y, level))
            p = self.patch_size // 2
            x, y = F.pad(x, (p, p, p, p), mode="reflect"), F.pad(y, (p, p, p, p), mode="reflect")
            proj_x = F.conv2d(x, rand, stride=self.stride).flatten(2)
            proj_y = F.conv2d(y, rand, stride=self.stride).flatten(2)
            swd = (torch.sort(proj_x, dim=2)[0] - torch.sort(proj_y, dim=2)[0]).abs().mean(dim=(1, 2))
            loss = (swd / self.num_scale).mean() * 0.1
        return loss * self.loss_weight


# ---------------------------------------------------------------- ff_loss

@LOSS_REGISTRY.register()
class FocalFrequencyLoss(FFLoss):
    """neosr's ``ff_loss``: 50 x the focal frequency loss of :class:`~anysr.losses.frequency.FFLoss` (the same
    arguments and weighting), the batch's average spectrum compared by default (``ave_spectrum`` true). A predefined
    weight matrix is not supported."""

    other_names = ("ff_loss",)

    def __init__(self, loss_weight: float = 1.0, alpha: float = 1.0, patch_factor: int = 1, ave_spectrum: bool = True,
                 log_matrix: bool = False, batch_matrix: bool = False) -> None:
        super().__init__(loss_weight, "mean", alpha, patch_factor, ave_spectrum, log_matrix, batch_matrix)

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        _check_pair("FocalFrequencyLoss", pred, target)
        with autocast_off(pred):
            return self.loss_weight * self.focal(pred.float(), target.float()).mean() * 50


# ---------------------------------------------------------------- ldl_loss

@LOSS_REGISTRY.register()
class ArtifactWeightedLoss(nn.Module):
    """neosr's ``ldl_loss``: LDL's artifact map (the channel-summed residual's variance to the power 1/5 times its
    local ``ksize`` window variance, reflect padded) without LDL's EMA comparison; ``criterion`` (``l1``, ``l2``,
    ``huber`` (delta 1), ``chc``) distance of ``map * pred`` and ``map * target``, the map not detached."""

    role = "pixel"
    other_names = ("ldl_loss",)

    def __init__(self, criterion: str = "l1", loss_weight: float = 1.0, ksize: int = 7) -> None:
        super().__init__()
        self.criterion = _choice("criterion", criterion, ("l1", "l2", "huber", "chc"))
        if isinstance(ksize, bool) or int(ksize) != ksize or ksize < 3 or ksize % 2 == 0:
            raise ValueError(f"ksize must be an odd integer >= 3, got {ksize!r}")
        self.ksize = int(ksize)
        self.loss_weight = float(loss_weight)

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        _check_pair("ArtifactWeightedLoss", pred, target)
        if min(pred.shape[-2:]) <= self.ksize // 2:
            raise ValueError(f"ArtifactWeightedLoss: {pred.shape[-2]}x{pred.shape[-1]} images are too small for "
                             f"ksize {self.ksize}")
        with autocast_off(pred):
            x, y = pred.float(), target.float()
            residual = (y - x).abs().sum(1, keepdim=True)
            patch = torch.var(residual, dim=(-1, -2, -3), keepdim=True) ** (1 / 5)
            weight = patch * local_variance(residual, self.ksize)
            loss = _criterion(self.criterion, weight * x, weight * y)
        return loss * self.loss_weight


# ---------------------------------------------------------------- gan_loss

@LOSS_REGISTRY.register()
class LabelledGANLoss(nn.Module):
    """neosr's ``gan_loss`` on discriminator logits: ``bce`` (binary cross-entropy with logits), ``mse`` or
    ``huber`` (delta 1) to a tensor of ``real_label_val`` / ``fake_label_val``, mean-reduced. ``loss_weight``
    (default 0.1) scales only generator losses (``is_disc=False``)."""

    role = "gan"
    other_names = ("gan_loss",)

    def __init__(self, gan_type: str = "bce", real_label_val: float = 1.0, fake_label_val: float = 0.0,
                 loss_weight: float = 0.1) -> None:
        super().__init__()
        self.gan_type = _choice("gan_type", gan_type, ("bce", "mse", "huber"))
        self.real_label_val = float(real_label_val)
        self.fake_label_val = float(fake_label_val)
        self.loss_weight = float(loss_weight)

    def forward(self, input: torch.Tensor, target_is_real: bool, is_disc: bool = False) -> torch.Tensor:  # noqa: A002
        """The loss of ``input`` judged against the real (``True``) or fake label."""
        x = input.float()
        label = torch.full_like(x, self.real_label_val if target_is_real else self.fake_label_val)
        if self.gan_type == "bce":
            loss = F.binary_cross_entropy_with_logits(x, label)
        elif self.gan_type == "mse":
            loss = F.mse_loss(x, label)
        else:
            loss = huber_mean(x, label)
        return loss if is_disc else loss * self.loss_weight


__all__ = ["ArtifactWeightedLoss", "CHCLoss", "ConsistencyLoss", "FocalFrequencyLoss", "KLDivergenceLoss",
           "LabelledGANLoss", "MSSWDLoss", "PaddedMSSSIMLoss", "chc_distance",
           "gaussian_pyramid_level", "huber_mean", "l_star", "srgb_to_lab"]

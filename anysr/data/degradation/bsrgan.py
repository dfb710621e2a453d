"""BSRGAN's degradation model (Zhang et al., ICCV 2021) and its "plus" variant, as KAIR's ``utils_blindsr.py``
defines them (``degradation_bsrgan``, ``degradation_bsrgan_plus``): settings, counter-based draws, pipeline.

Two halves:

* **The draws** (:meth:`BSRGANPipeline.draw`): from a ``numpy.random.Generator`` keyed by the sample's seed, the
  whole recipe as a fixed record (:class:`BSRGANDraws`): the shuffled order of blur / downsampling / noise / JPEG
  steps with every drawn value (kernel shapes, resize sizes and filters, noise levels and kinds, JPEG qualities),
  the output crop and the seed of the noise fields. The image sizes each step produces are tracked on the host, so
  the record also says them; the same ``(seed, epoch, index)`` gives the same record anywhere.
* **The pipeline** (:func:`apply_draws`): the record applied to an HR image (3, H, W) in [0, 1] with the tensor
  operators of :mod:`anysr.ops.blind` (each equal to KAIR's numpy / OpenCV / SciPy call) and the real JPEG codec
  (:func:`anysr.data.degradation.jpeg.jpeg_cv2`, the one KAIR calls); noise fields from a ``torch.Generator``
  seeded from the record. It runs in the DataLoader workers (``BSRGANDataset``), so the device sees fixed shapes
  (the ``gt_size`` GT patch and its ``gt_size / scale`` LQ patch) on every accelerator.

Both pipelines are registered in ``DEGRADATION_REGISTRY`` under KAIR's ``degradation_type`` names, ``bsrgan`` and
``bsrgan_plus``. KAIR's probabilities are kept (BSRGAN: the extra x2 downsampling at scale 4 with 0.25, JPEG in the
shuffle with 0.9; plus: the full shuffle with ``shuffle_prob``, Poisson and speckle noise with 0.1 each). The
camera-sensor (ISP) step of both draws its coin as KAIR does and then does nothing: KAIR calls it with
``isp_model=None`` (its ISP model was never published), so its pairs never contain it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from anysr.data.degradation.jpeg import jpeg_cv2
from anysr.errors import DataError, OptionError
from anysr.ops.blind import (
    CV2_MODES,
    GeneratorFields,
    NoiseFields,
    convolve_mirror,
    gaussian_noise_3ch,
    poisson_noise_kair,
    resize_cv2,
    speckle_noise_3ch,
)
from anysr.ops.degradation import USMSharp
from anysr.ops.imresize import imresize_torch
from anysr.registry import DEGRADATION_REGISTRY

__all__ = ["BSRGANSettings", "Step", "BSRGANDraws", "BSRGANPipeline", "BSRGAN", "BSRGANPlus", "apply_draws",
           "anisotropic_gaussian_kernel", "gaussian_kernel", "shifted_gaussian_kernel", "step_kernel",
           "draw_rng", "STEP_OPS"]

_TAG_DRAWS = 7201  # keeps this generator apart from the other purposes of a sample's seed
_NOISE_LEVELS = (2, 25)  # KAIR's noise_level1, noise_level2 (0-255 scale)
_JPEG_QUALITY = (30, 95)
_KERNEL_SIZES = (2, 11)  # ksize = 2 * randint(2, 11) + 3: 7, 9, ..., 25
_DOWN_KERNEL = 25  # the shifted Gaussian of BSRGAN's downsample2
STEP_OPS = ("sharpen", "blur", "resize", "half_matlab", "shifted_down", "noise", "speckle", "poisson", "jpeg",
            "camera")


@dataclass(frozen=True)
class BSRGANSettings:
    """What a BSRGAN pipeline needs: ``scale`` (2, 3 or 4 as KAIR; any integer >= 1 works), ``gt_size`` (the GT
    patch; the LQ patch is ``gt_size / scale``), ``degrade_size`` (KAIR's ``H_size``: the HR square that is
    degraded before the pair is cropped; default ``gt_size``), and the plus variant's ``shuffle_prob`` and
    ``use_sharp`` (KAIR's dataset defaults 0.1 and false)."""

    scale: int
    gt_size: int
    degrade_size: int | None = None
    shuffle_prob: float = 0.1
    use_sharp: bool = False

    def __post_init__(self) -> None:
        fn = "BSRGANSettings"
        for name in ("scale", "gt_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or int(v) != v or v < 1:
                raise OptionError(f"{fn}: {name} must be a positive integer, got {v!r}")
        if self.gt_size % self.scale:
            raise OptionError(f"{fn}: gt_size {self.gt_size} is not a multiple of scale {self.scale}")
        size = self.gt_size if self.degrade_size is None else self.degrade_size
        if isinstance(size, bool) or int(size) != size or size < self.gt_size or size % self.scale:
            raise OptionError(f"{fn}: degrade_size must be a multiple of scale ({self.scale}) and at least gt_size "
                              f"({self.gt_size}), got {self.degrade_size!r}")
        object.__setattr__(self, "degrade_size", int(size))
        if not 0.0 <= float(self.shuffle_prob) <= 1.0:
            raise OptionError(f"{fn}: shuffle_prob must be a probability in [0, 1], got {self.shuffle_prob!r}")

    @property
    def lq_size(self) -> int:
        return self.gt_size // self.scale


@dataclass(frozen=True)
class Step:
    """One step of a drawn recipe: ``op`` (one of :data:`STEP_OPS`), its drawn values, and the (H, W) it outputs."""

    op: str
    params: Mapping[str, Any] = field(default_factory=dict)
    size: tuple[int, int] = (0, 0)

    def as_dict(self) -> dict[str, Any]:
        p = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in self.params.items()}
        return {"op": self.op, **p, "size": list(self.size)}


@dataclass(frozen=True)
class BSRGANDraws:
    """A sample's whole recipe: the steps in order, the LQ crop origin (``top``, ``left`` in LQ pixels) and the seed
    of its noise fields."""

    steps: tuple[Step, ...]
    top: int
    left: int
    field_seed: int

    def as_dict(self) -> dict[str, Any]:
        return {"steps": [s.as_dict() for s in self.steps], "top": self.top, "left": self.left,
                "field_seed": self.field_seed}


def draw_rng(seed: int) -> np.random.Generator:
    """The generator of a sample's recipe, keyed by its (counter-based) seed."""
    return np.random.default_rng([int(seed), _TAG_DRAWS])


# ------------------------------------------------------------------------------------------------- kernels
def anisotropic_gaussian_kernel(size: int, theta: float, l1: float, l2: float) -> np.ndarray:
    """KAIR's ``anisotropic_Gaussian``: a Gaussian of covariance ``V diag(l1, l2) V^-1`` (V from ``theta``) sampled
    on a ``size`` x ``size`` grid centred on its middle pixel, normalised to sum 1 (float64)."""
    v = np.array([math.cos(theta), math.sin(theta)])
    vm = np.array([[v[0], v[1]], [v[1], -v[0]]])
    cov = vm @ np.diag([max(l1, 1e-12), max(l2, 1e-12)]) @ np.linalg.inv(vm)
    inv = np.linalg.inv(cov)
    c = np.arange(size, dtype=np.float64) - (size / 2.0 + 0.5) + 1
    cx, cy = np.meshgrid(c, c)  # k[y, x] at (cx, cy)
    q = inv[0, 0] * cx * cx + (inv[0, 1] + inv[1, 0]) * cx * cy + inv[1, 1] * cy * cy
    k = np.exp(-0.5 * q)
    return k / k.sum()


def gaussian_kernel(size: int, sigma: float) -> np.ndarray:
    """MATLAB's ``fspecial('gaussian', size, sigma)`` as KAIR's ``fspecial_gaussian`` (float64)."""
    r = (size - 1.0) / 2.0
    x, y = np.meshgrid(np.arange(-r, r + 1), np.arange(-r, r + 1))
    if sigma <= 0:
        return (x * x + y * y == 0).astype(np.float64)
    h = np.exp(-(x * x + y * y) / (2 * sigma * sigma))
    h[h < np.finfo(float).eps * h.max()] = 0
    return h / h.sum()


def shifted_gaussian_kernel(sigma: float, sf: int, size: int = _DOWN_KERNEL) -> np.ndarray:
    """BSRGAN's downsampling kernel: :func:`gaussian_kernel` moved by ``(sf - 1) / 2`` pixels up-left by bilinear
    interpolation (KAIR's ``shift_pixel``, coordinates clipped to the grid) and normalised."""
    k = gaussian_kernel(size, sigma)
    n = k.shape[0]
    pos = np.clip(np.arange(n, dtype=np.float64) + (sf - 1) * 0.5, 0, n - 1)
    i0 = np.minimum(np.floor(pos).astype(np.int64), n - 2)
    t = pos - i0
    rows = k[i0] * (1 - t)[:, None] + k[i0 + 1] * t[:, None]
    out = rows[:, i0] * (1 - t)[None] + rows[:, i0 + 1] * t[None]
    return out / out.sum()


def step_kernel(step: Step) -> np.ndarray:
    """The 2-D kernel of a ``blur`` or ``shifted_down`` step."""
    p = step.params
    if step.op == "shifted_down":
        return shifted_gaussian_kernel(p["sigma"], p["sf"])
    if p["kind"] == "anisotropic":
        return anisotropic_gaussian_kernel(p["ksize"], p["theta"], p["l1"], p["l2"])
    return gaussian_kernel(p["ksize"], p["sigma"])


# --------------------------------------------------------------------------------------------------- draws
class _Drawer:
    """Draws steps from ``rng`` while tracking the image size (H, W) they produce."""

    def __init__(self, rng: np.random.Generator, size: tuple[int, int]) -> None:
        self.rng = rng
        self.h, self.w = size
        self.h0, self.w0 = size
        self.steps: list[Step] = []

    def add(self, op: str, **params: Any) -> None:
        self.steps.append(Step(op, params, (self.h, self.w)))

    def mode(self) -> str:
        return CV2_MODES[int(self.rng.integers(len(CV2_MODES)))]

    def randint(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))

    def resize_to(self, w: int, h: int, *, clip: bool) -> None:
        if w < 1 or h < 1:
            raise DataError(f"BSRGAN degradation: a resize to {h}x{w} pixels; degrade a larger image (raise "
                            "degrade_size / gt_size)")
        self.h, self.w = h, w
        self.add("resize", mode=self.mode(), clip=clip)

    def blur(self, sf: int) -> None:
        wd2, wd = 4.0 + sf, 2.0 + 0.2 * sf
        if self.rng.random() < 0.5:
            l1, l2 = wd2 * float(self.rng.random()), wd2 * float(self.rng.random())
            ksize = 2 * self.randint(*_KERNEL_SIZES) + 3
            self.add("blur", kind="anisotropic", ksize=ksize, theta=float(self.rng.random()) * math.pi, l1=l1, l2=l2)
        else:
            ksize = 2 * self.randint(*_KERNEL_SIZES) + 3
            self.add("blur", kind="gaussian", ksize=ksize, sigma=wd * float(self.rng.random()))

    def noise(self, op: str) -> None:
        level = self.randint(*_NOISE_LEVELS)
        u = float(self.rng.random())
        if u > 0.6:
            self.add(op, kind="color", sigma=level / 255.0)
        elif u < 0.4:
            self.add(op, kind="gray", sigma=level / 255.0)
        else:
            self.add(op, kind="correlated", sigma=level / 255.0,
                     transform=correlated_transform(self.rng.random(3), self.rng.random((3, 3))))

    def poisson(self) -> None:
        vals = 10 ** (2 * float(self.rng.random()) + 2.0)
        self.add("poisson", vals=vals, gray=bool(self.rng.random() >= 0.5))

    def jpeg(self) -> None:
        self.add("jpeg", quality=self.randint(*_JPEG_QUALITY))

    def plus_resize(self, sf: int) -> None:  # KAIR's add_resize
        u = float(self.rng.random())
        if u > 0.8:
            f = float(self.rng.uniform(1, 2))
        elif u < 0.7:
            f = float(self.rng.uniform(0.5 / sf, 1))
        else:
            f = 1.0
        self.resize_to(int(f * self.w), int(f * self.h), clip=True)


def correlated_transform(d: np.ndarray, a: np.ndarray) -> np.ndarray:
    """The 3x3 ``T`` with ``z @ T`` distributed as KAIR's correlated noise, ``numpy.random.multivariate_normal``
    of ``|L^2 U^T diag(d) U|`` (U an orthonormal basis of ``a``, L = 25/255) computed as NumPy computes it."""
    u, _, _ = np.linalg.svd(a)  # scipy.linalg.orth for a full-rank matrix
    cov = np.abs((_NOISE_LEVELS[1] / 255.0) ** 2 * (u.T @ np.diag(d) @ u))
    _, s, vh = np.linalg.svd(cov)
    return np.sqrt(s)[:, None] * vh


class BSRGANPipeline(ABC):
    """A registered BSRGAN-style degradation: :meth:`draw` a sample's recipe, :meth:`__call__` apply it."""

    name = ""

    def __init__(self, settings: BSRGANSettings) -> None:
        self.settings = settings
        self.usm = USMSharp()

    @abstractmethod
    def draw_steps(self, d: _Drawer) -> None:
        """Append the model's steps to ``d`` in their drawn order (the final resize and JPEG included)."""

    def draw(self, rng: np.random.Generator, size: tuple[int, int]) -> BSRGANDraws:
        """The recipe for an HR image of ``size`` (H, W) (mod-cropped to the scale first, as KAIR)."""
        sf = self.settings.scale
        h, w = (int(v) - int(v) % sf for v in size)
        p = self.settings.lq_size
        if h < p * sf or w < p * sf:
            raise DataError(f"BSRGAN degradation: the image is {size[0]}x{size[1]}, smaller than the "
                            f"{p * sf}x{p * sf} GT patch")
        d = _Drawer(rng, (h, w))
        self.draw_steps(d)
        lh, lw = d.h, d.w
        if (lh, lw) != (h // sf, w // sf):
            raise DataError(f"BSRGAN degradation ended at {lh}x{lw}, not {h // sf}x{w // sf}")  # a bug, not input
        top, left = d.randint(0, lh - p), d.randint(0, lw - p)
        return BSRGANDraws(tuple(d.steps), top, left, int(rng.integers(0, 2**62)))

    def __call__(self, img: Tensor, seed: int) -> dict[str, Any]:
        """``img`` (3, H, W) in [0, 1] -> ``lq`` (3, p, p), ``gt`` (3, p * scale, ...) and the ``draws``, on
        ``img``'s device (the random fields are drawn on the CPU from the sample's seed wherever the image is, so
        a device gives the loader's pairs up to its kernels' rounding)."""
        draws = self.draw(draw_rng(seed), (int(img.shape[-2]), int(img.shape[-1])))
        fields = GeneratorFields(torch.Generator().manual_seed(draws.field_seed))
        lq, gt = apply_draws(img, draws, self.settings, fields, self.usm)
        return {"lq": lq, "gt": gt, "draws": draws}


@DEGRADATION_REGISTRY.register(name="bsrgan")
class BSRGAN(BSRGANPipeline):
    """KAIR's ``degradation_bsrgan``: at scale 4 an extra x2 downsampling with probability 0.25 (OpenCV or MATLAB
    bicubic); then in a random order two blurs, downsample (OpenCV resize by 1..2*sf, or a shifted Gaussian and
    nearest subsampling), Gaussian noise, JPEG (0.9) and the camera step (a no-op, as KAIR), with the final resize
    to H / scale after the downsample; a final JPEG; a random crop."""

    name = "bsrgan"

    def draw_steps(self, d: _Drawer) -> None:
        sf = self.settings.scale
        if sf == 4 and d.rng.random() < 0.25:
            if d.rng.random() < 0.5:
                d.resize_to(int(1 / 2 * d.w), int(1 / 2 * d.h), clip=True)
            else:
                d.h, d.w = math.ceil(d.h / 2), math.ceil(d.w / 2)
                d.add("half_matlab")
            sf = 2
        order = [int(v) for v in d.rng.permutation(7)]
        i2, i3 = order.index(2), order.index(3)
        if i2 > i3:  # the final downsample stays after the first
            order[i2], order[i3] = order[i3], order[i2]
        a = b = 0
        for i in order:
            if i in (0, 1):
                d.blur(sf)
            elif i == 2:
                a, b = d.w, d.h
                if d.rng.random() < 0.75:
                    sf1 = float(d.rng.uniform(1, 2 * sf))
                    d.resize_to(int(1 / sf1 * d.w), int(1 / sf1 * d.h), clip=True)
                else:
                    sigma = float(d.rng.uniform(0.1, 0.6 * sf))
                    d.h, d.w = -(-d.h // sf), -(-d.w // sf)
                    d.add("shifted_down", sigma=sigma, sf=sf)
            elif i == 3:
                d.resize_to(int(1 / sf * a), int(1 / sf * b), clip=True)
            elif i == 4:
                d.noise("noise")
            elif i == 5:
                if d.rng.random() < 0.9:
                    d.jpeg()
            elif d.rng.random() < 0.25:
                d.add("camera")
        d.jpeg()


@DEGRADATION_REGISTRY.register(name="bsrgan_plus")
class BSRGANPlus(BSRGANPipeline):
    """KAIR's ``degradation_bsrgan_plus`` (BSRGAN and Real-ESRGAN combined): optional USM sharpening of the HR;
    13 steps (blur, resize, Gaussian noise, Poisson 0.1, speckle 0.1, camera 0.1 (a no-op), JPEG, then blur,
    resize, noises, camera again) fully shuffled with ``shuffle_prob``, else in order with the noises shuffled
    within each half; a final OpenCV resize to H / scale, a final JPEG, a random crop."""

    name = "bsrgan_plus"

    def draw_steps(self, d: _Drawer) -> None:
        st = self.settings
        sf = st.scale
        if st.use_sharp:
            d.add("sharpen")
        if d.rng.random() < st.shuffle_prob:
            order = [int(v) for v in d.rng.permutation(13)]
        else:
            order = list(range(13))
            order[2:6] = [int(v) for v in d.rng.permutation(order[2:6])]
            order[9:13] = [int(v) for v in d.rng.permutation(order[9:13])]
        for i in order:
            j = i if i < 7 else i - 7  # 7..12 repeat 0..5 (6 is the JPEG)
            if j == 0:
                d.blur(sf)
            elif j == 1:
                d.plus_resize(sf)
            elif j == 2:
                d.noise("noise")
            elif j == 3:
                if d.rng.random() < 0.1:
                    d.poisson()
            elif j == 4:
                if d.rng.random() < 0.1:
                    d.noise("speckle")
            elif j == 5:
                if d.rng.random() < 0.1:
                    d.add("camera")
            else:
                d.jpeg()
        d.resize_to(int(1 / sf * d.w0), int(1 / sf * d.h0), clip=False)
        d.jpeg()


# ------------------------------------------------------------------------------------------------ pipeline
def _jpeg(x: Tensor, quality: int) -> Tensor:
    """OpenCV's JPEG round trip, as KAIR's (8-bit levels cross to the host and back when ``x`` is elsewhere)."""
    u8 = (x.clamp(0, 1) * 255.0).round().to(torch.uint8)
    bgr = u8.flip(0).permute(1, 2, 0).contiguous().cpu().numpy()
    out = torch.from_numpy(jpeg_cv2(bgr, quality)).permute(2, 0, 1).flip(0)
    return out.to(device=x.device, dtype=torch.float32) / 255.0


def apply_step(x: Tensor, step: Step, fields: NoiseFields, usm: USMSharp | None = None) -> Tensor:
    """One recipe step on a (3, H, W) float image (``usm``: the sharpener of ``sharpen`` steps)."""
    p = step.params
    if step.op == "blur":
        return convolve_mirror(x, step_kernel(step))
    if step.op == "resize":
        out = resize_cv2(x, step.size, p["mode"])
        return out.clamp(0, 1) if p["clip"] else out
    if step.op == "half_matlab":
        return imresize_torch(x, 0.5).clamp(0, 1)
    if step.op == "shifted_down":
        sf = int(p["sf"])
        return convolve_mirror(x, step_kernel(step))[..., ::sf, ::sf].clamp(0, 1).contiguous()
    if step.op in ("noise", "speckle"):
        add = gaussian_noise_3ch if step.op == "noise" else speckle_noise_3ch
        return add(x, fields, sigma=p["sigma"], gray=p["kind"] == "gray", transform=p.get("transform"))
    if step.op == "poisson":
        return poisson_noise_kair(x, fields, vals=p["vals"], gray=p["gray"])
    if step.op == "jpeg":
        return _jpeg(x, int(p["quality"]))
    if step.op == "sharpen":
        return (usm or USMSharp())(x[None])[0]
    if step.op == "camera":
        return x
    raise DataError(f"unknown BSRGAN step {step.op!r}; known: {', '.join(STEP_OPS)}")


def apply_draws(img: Tensor, draws: BSRGANDraws, settings: BSRGANSettings, fields: NoiseFields,
                usm: USMSharp | None = None) -> tuple[Tensor, Tensor]:
    """The (LQ, GT) patches of ``img`` (3, H, W) in [0, 1] under the recipe ``draws``."""
    if img.dim() != 3 or img.shape[0] != 3:
        raise DataError(f"BSRGAN degradation expects a (3, H, W) image, got shape {tuple(img.shape)}")
    sf = settings.scale
    h, w = img.shape[-2:]
    x = img[:, : h - h % sf, : w - w % sf].to(torch.float32)
    hq = x
    with torch.no_grad():
        for i, step in enumerate(draws.steps):
            x = apply_step(x, step, fields, usm)
            if i == 0 and step.op == "sharpen":
                hq = x
    p = settings.lq_size
    t, left = draws.top, draws.left
    lq = x[:, t: t + p, left: left + p]
    gt = hq[:, t * sf: (t + p) * sf, left * sf: (left + p) * sf]
    return lq.contiguous(), gt.contiguous()


def settings_from_options(opt: Mapping[str, Any]) -> BSRGANSettings:
    """The settings of a validated ``BSRGANDataset`` section."""
    return BSRGANSettings(int(opt["scale"]), int(opt["gt_size"]), opt.get("degrade_size"),
                          float(opt["shuffle_prob"]), bool(opt["use_sharp"]))


"""Real-ESRGAN's training pairs: the second-order degradation with counter-based randomness, and the pair pool.

Used by ``RealESRNetModel`` / ``RealESRGANModel`` in the training step (on the accelerator's device, one batch at a
time, as BasicSR does) or by ``RealESRGANDataset`` in the DataLoader workers (one sample at a time, on the CPU),
and by ``anysr prepare degrade``. The operators are :mod:`anysr.ops.degrade` and :mod:`anysr.ops.diffjpeg`; this
module decides what they are called with.

Randomness (no global RNG anywhere):

* **Batch choices** (resize up/down/keep and its scale, interpolation modes, Gaussian or Poisson noise, second
  blur, final order, the crop position) are BasicSR's per-batch draws. They come from a host generator keyed by
  ``(manual_seed, iteration, micro-batch)`` in the training step (:func:`step_rng`): the same on every rank, so
  a global batch split over ranks is degraded as one process degrades it. In the loaders every sample is its own
  batch and the key is its sample seed (:func:`sample_batch_rng`).
* **Per-sample values** (noise level, gray or colour noise, the two JPEG qualities) come from the sample's seed
  (the sampler's counter-based ``(seed, epoch, position)`` seed, delivered in the batch as ``seed``), and so do
  the noise fields: each sample draws them from its own ``torch.Generator`` (on the device where one exists),
  re-seeded from the sample seed every time. A sample's degradation thus depends on its seed and its batch's
  choices only: not on the rank split, the worker count or the resume point, and nothing needs saving.
* The **pool** (:class:`TrainingPairPool`) picks its entries with a generator keyed by
  ``(manual_seed, iteration, micro-batch)``; its contents are training state (``state_dict``).

Two deliberate differences from BasicSR, both in distribution-preserving details: every sample draws its own
noise fields (BasicSR draws one gray Gaussian field per batch), and the pool is stratified by batch position
(see :class:`TrainingPairPool`), so that it splits over ranks exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from anysr.errors import CheckpointError, DataError, OptionError
from anysr.ops.autocast import autocast_off
from anysr.ops.degrade import RESIZE_MODES, DegradeStage, USMSharp, clamp_round, filter2d, resize
from anysr.ops.diffjpeg import DiffJPEG

__all__ = [
    "SynthesisSettings", "BatchChoices", "SampleDraws", "step_rng", "sample_batch_rng", "draw_batch_choices",
    "draw_samples", "sample_generator", "degrade", "crop_pair", "synthesise", "LoaderSynthesis",
    "TrainingPairPool", "quantise", "dequantise",
]

# Tags that keep the generators of different purposes apart (any distinct constants would do).
_TAG_STEP, _TAG_POOL, _TAG_SAMPLE, _TAG_SAMPLE_BATCH = 7101, 7102, 7103, 7104
_GRAY = (0.2989, 0.587, 0.114)  # the luma weights of BasicSR's gray Poisson noise (torchvision's)
_UPDOWN = ("up", "down", "keep")


@dataclass(frozen=True)
class SynthesisSettings:
    """The model-side Real-ESRGAN settings (top-level option keys, BasicSR's names).

    ``first`` / ``second``: the two stages (``resize_prob``, ``resize_range``, ``gaussian_noise_prob``,
    ``noise_range``, ``poisson_scale_range``, ``gray_noise_prob``, ``jpeg_range`` and their ``*2`` twins);
    ``gt_size``: the GT crop taken after the degradation.
    """

    scale: int
    gt_size: int
    first: DegradeStage
    second: DegradeStage
    second_blur_prob: float

    @classmethod
    def from_options(cls, opt: Mapping[str, Any]) -> SynthesisSettings:
        """From validated options (the schema filled and checked every key for the Real-ESRGAN models)."""
        plain = {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in opt.items()
                 if not isinstance(v, Mapping)}
        return cls(int(opt["scale"]), int(opt["gt_size"]), DegradeStage.from_basicsr(plain, 1),
                   DegradeStage.from_basicsr(plain, 2), float(opt["second_blur_prob"]))


@dataclass(frozen=True)
class BatchChoices:
    """The per-batch draws: stage resizes (``updown``, ``scale``, ``mode``), noise kind (``gaussian``), the second
    blur, the final order (``sinc_first``) and mode, and the crop origin (``top``, ``left`` in LQ pixels)."""

    updown1: str
    scale1: float
    mode1: str
    gaussian1: bool
    second_blur: bool
    updown2: str
    scale2: float
    mode2: str
    gaussian2: bool
    sinc_first: bool
    final_mode: str
    top: int
    left: int

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class SampleDraws:
    """Per-sample draws (one entry per sample): noise level (sigma on the 0-255 scale, or Poisson scale: which one
    the batch's ``gaussian`` choice decides), gray noise, JPEG quality, for both stages; and the seed of the noise
    fields' generator."""

    level1: tuple[float, ...]
    gray1: tuple[bool, ...]
    quality1: tuple[float, ...]
    level2: tuple[float, ...]
    gray2: tuple[bool, ...]
    quality2: tuple[float, ...]
    field_seeds: tuple[int, ...]


def step_rng(seed: int, iteration: int, micro: int) -> np.random.Generator:
    """The host generator of the batch choices of micro-batch ``micro`` of training iteration ``iteration``."""
    return np.random.default_rng([int(seed), _TAG_STEP, int(iteration), int(micro)])


def pool_rng(seed: int, iteration: int, micro: int) -> np.random.Generator:
    """The host generator of the pool's picks at that micro-batch (the same on every rank)."""
    return np.random.default_rng([int(seed), _TAG_POOL, int(iteration), int(micro)])


def sample_batch_rng(sample_seed: int) -> np.random.Generator:
    """The batch choices of a sample degraded on its own (in the loader workers)."""
    return np.random.default_rng([int(sample_seed), _TAG_SAMPLE_BATCH])


def _pick(rng: np.random.Generator, weights: Sequence[float]) -> int:
    cum = np.cumsum(np.asarray(weights, dtype=np.float64))
    return min(int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), len(cum) - 1)


def _resize_draw(rng: np.random.Generator, stage: DegradeStage) -> tuple[str, float, str]:
    updown = _UPDOWN[_pick(rng, stage.resize_prob)]
    if updown == "up":
        s = float(rng.uniform(1.0, stage.resize_range[1]))
    elif updown == "down":
        s = float(rng.uniform(stage.resize_range[0], 1.0))
    else:
        s = 1.0
    return updown, s, RESIZE_MODES[int(rng.integers(len(RESIZE_MODES)))]


def draw_batch_choices(rng: np.random.Generator, settings: SynthesisSettings,
                       size: tuple[int, int]) -> BatchChoices:
    """Draw a batch's choices from ``rng`` in BasicSR's order; ``size``: the (H, W) of the GT being degraded.

    Stage 1 resize (kind by ``resize_prob``, scale uniform in [low, 1] or [1, high], mode uniform over
    area/bilinear/bicubic), Gaussian with ``gaussian_noise_prob``; second blur with ``second_blur_prob``; stage 2
    likewise; the final order (resize back + sinc first with probability 1/2) and mode; the crop origin.
    """
    u1, s1, m1 = _resize_draw(rng, settings.first)
    g1 = bool(rng.random() < settings.first.gaussian_noise_prob)
    blur2 = bool(rng.random() < settings.second_blur_prob)
    u2, s2, m2 = _resize_draw(rng, settings.second)
    g2 = bool(rng.random() < settings.second.gaussian_noise_prob)
    sinc_first = bool(rng.random() < 0.5)
    final_mode = RESIZE_MODES[int(rng.integers(len(RESIZE_MODES)))]
    h, w = (v // settings.scale for v in size)
    p = settings.gt_size // settings.scale
    if h < p or w < p:
        raise DataError(f"the degraded image is {h}x{w} (LQ pixels), smaller than the {p}x{p} LQ crop (gt_size "
                        f"{settings.gt_size} / scale {settings.scale}); raise crop_pad_size or lower gt_size")
    top, left = int(rng.integers(0, h - p + 1)), int(rng.integers(0, w - p + 1))
    return BatchChoices(u1, s1, m1, g1, blur2, u2, s2, m2, g2, sinc_first, final_mode, top, left)


def draw_samples(seeds: Sequence[int], settings: SynthesisSettings) -> SampleDraws:
    """Each sample's values from its own seed: six uniforms (level, gray, quality of each stage) and a field seed.

    The draws do not depend on the batch's choices: a level is ``low + u * (high - low)`` of the noise range the
    batch picks (``noise_range`` for Gaussian, ``poisson_scale_range`` for Poisson noise).
    """
    cols: list[list[float]] = [[] for _ in range(6)]
    fields: list[int] = []
    for s in seeds:
        rng = np.random.default_rng([int(s), _TAG_SAMPLE])
        for col, u in zip(cols, rng.random(6)):
            col.append(float(u))
        fields.append(int(rng.integers(0, 2**62)))
    st1, st2 = settings.first, settings.second

    def scaled(us: list[float], lo_hi: tuple[float, float]) -> tuple[float, ...]:
        return tuple(lo_hi[0] + u * (lo_hi[1] - lo_hi[0]) for u in us)

    return SampleDraws(tuple(cols[0]), tuple(u < st1.gray_noise_prob for u in cols[1]),
                       scaled(cols[2], st1.jpeg_range), tuple(cols[3]),
                       tuple(u < st2.gray_noise_prob for u in cols[4]), scaled(cols[5], st2.jpeg_range),
                       tuple(fields))


def sample_generator(device: torch.device) -> torch.Generator:
    """A generator on ``device`` where the backend has device generators, else a CPU one (fields are uploaded)."""
    try:
        return torch.Generator(device=device)
    except RuntimeError:
        return torch.Generator()


# ------------------------------------------------------------------------------------------------------ noise
def _gaussian(x: Tensor, sigma: Sequence[float], gray: Sequence[bool], gens: Sequence[torch.Generator]) -> Tensor:
    """Per sample: one standard normal field (one plane for gray samples) times sigma / 255."""
    b, c, h, w = x.shape
    fields = []
    for j in range(b):
        g = gens[j]
        f = torch.randn((1 if gray[j] else c, h, w), generator=g, device=g.device, dtype=torch.float32)
        fields.append(f.to(x.device).expand(c, h, w))
    scale = torch.tensor([s / 255.0 for s in sigma], dtype=torch.float32).reshape(b, 1, 1, 1).to(x.device)
    return torch.stack(fields).to(x.dtype) * scale.to(x.dtype)


def _levels(q: Tensor) -> Tensor:
    """The number of distinct 8-bit levels of ``q`` (integers 0..255) rounded up to a power of two, (1,) float."""
    hist = torch.zeros(256, dtype=torch.int32, device=q.device)
    idx = q.reshape(-1).long()
    hist.scatter_add_(0, idx, torch.ones_like(idx, dtype=torch.int32))
    n = (hist > 0).sum()
    powers = torch.tensor([2**j for j in range(8)], device=q.device)
    return torch.exp2((n > powers).sum().to(torch.float32)).reshape(1)


def _poisson(x: Tensor, scale: Sequence[float], gray: Sequence[bool], gens: Sequence[torch.Generator]) -> Tensor:
    """Per sample, BasicSR's Poisson noise: the image (its luma for gray samples) rounded to 8 bits, ``v`` its
    distinct levels rounded up to a power of two, ``Poisson(img * v) / v - img``, times the sample's scale."""
    b, c, h, w = x.shape
    out = []
    for j in range(b):
        img = x[j].float()
        if gray[j]:
            if c != 3:
                raise DataError(f"gray Poisson noise needs RGB images, got {c} channels")
            img = (_GRAY[0] * img[0] + _GRAY[1] * img[1] + _GRAY[2] * img[2]).unsqueeze(0)
        q = torch.clamp((img * 255.0).round(), 0, 255)
        img = q / 255.0
        vals = _levels(q)
        g = gens[j]
        rate = (img * vals).to(g.device)
        noise = torch.poisson(rate, generator=g).to(x.device) / vals - img
        out.append((noise * scale[j]).expand(c, h, w))
    return torch.stack(out).to(x.dtype)


def _add_noise(x: Tensor, gaussian: bool, level_u: Sequence[float], gray: Sequence[bool], stage: DegradeStage,
               gens: Sequence[torch.Generator]) -> Tensor:
    lo, hi = stage.noise_range if gaussian else stage.poisson_scale_range
    levels = [lo + u * (hi - lo) for u in level_u]
    noise = _gaussian(x, levels, gray, gens) if gaussian else _poisson(x, levels, gray, gens)
    return torch.clamp(x + noise, 0, 1)


# ------------------------------------------------------------------------------------------------ the pipeline
def degrade(src: Tensor, kernel1: Tensor, kernel2: Tensor, sinc_kernel: Tensor, choices: BatchChoices,
            draws: SampleDraws, settings: SynthesisSettings, gens: Sequence[torch.Generator],
            jpeger: DiffJPEG) -> Tensor:
    """The LQ batch (``scale`` times smaller, rounded to 8-bit levels) of ``src`` (B, 3, H, W) in [0, 1].

    BasicSR's ``feed_data`` steps: blur (kernel1), resize, noise, JPEG; blur (kernel2, if chosen), resize to
    (H / scale, W / scale) times the stage-2 scale, noise; then [resize to (H / scale, W / scale) + sinc filter]
    and JPEG in the chosen order. ``gens[j]`` draws sample j's noise fields (re-seed them first). Autocast off.
    """
    b, _, h, w = src.shape
    if len(gens) != b or len(draws.field_seeds) != b:
        raise DataError(f"degrade: {len(gens)} generators and {len(draws.field_seeds)} draws for a batch of {b}")
    s = settings.scale
    dev = src.device
    q1 = torch.tensor(draws.quality1, dtype=torch.float32).to(dev)
    q2 = torch.tensor(draws.quality2, dtype=torch.float32).to(dev)
    with autocast_off(src):
        out = filter2d(src, kernel1)
        if choices.updown1 != "keep":
            out = resize(out, choices.mode1, scale_factor=choices.scale1)
        out = _add_noise(out, choices.gaussian1, draws.level1, draws.gray1, settings.first, gens)
        out = jpeger(out.clamp(0, 1), q1)
        if choices.second_blur:
            out = filter2d(out, kernel2)
        size = (int(h / s * choices.scale2), int(w / s * choices.scale2))
        out = resize(out, choices.mode2, size=size)
        out = _add_noise(out, choices.gaussian2, draws.level2, draws.gray2, settings.second, gens)
        target = (h // s, w // s)
        if choices.sinc_first:
            out = filter2d(resize(out, choices.final_mode, size=target), sinc_kernel)
            out = jpeger(out.clamp(0, 1), q2)
        else:
            out = jpeger(out.clamp(0, 1), q2)
            out = filter2d(resize(out, choices.final_mode, size=target), sinc_kernel)
        return clamp_round(out)


def crop_pair(lq: Tensor, gts: Sequence[Tensor], top: int, left: int, gt_size: int,
              scale: int) -> tuple[Tensor, list[Tensor]]:
    """The ``gt_size // scale`` LQ patch at (top, left) and the ``gt_size`` patches of ``gts`` that pair with it."""
    p = gt_size // scale
    t, lft = top * scale, left * scale
    return (lq[..., top: top + p, left: left + p],
            [g[..., t: t + gt_size, lft: lft + gt_size] for g in gts])


def synthesise(gt: Tensor, kernels: Sequence[Tensor], *, settings: SynthesisSettings, choices: BatchChoices,
               seeds: Sequence[int], gens: Sequence[torch.Generator], usm: USMSharp, jpeger: DiffJPEG,
               sharpen_input: bool, keep_sharpened: bool) -> dict[str, Any]:
    """One training pair batch: ``lq`` (B, 3, p, p) and ``gt`` (B, 3, gt_size, gt_size), plus what was drawn.

    ``gt`` (B, 3, H, W) in [0, 1] is degraded as it is, or USM-sharpened first (``sharpen_input``: Real-ESRGAN
    always, RealESRNet with ``gt_usm``); the returned ``gt`` is the crop of the raw image, or of the sharpened one
    with ``keep_sharpened`` (RealESRNet's target). The generators are re-seeded from the samples' seeds here.
    """
    draws = draw_samples(seeds, settings)
    for g, fs in zip(gens, draws.field_seeds):
        g.manual_seed(fs)
    with torch.no_grad(), autocast_off(gt):
        src = usm(gt) if sharpen_input else gt
        lq = degrade(src, *kernels, choices=choices, draws=draws, settings=settings, gens=gens, jpeger=jpeger)
        keep = src if keep_sharpened else gt
        lq, (gt_out,) = crop_pair(lq, [keep], choices.top, choices.left, settings.gt_size, settings.scale)
    return {"lq": lq.contiguous(), "gt": gt_out.contiguous(), "choices": choices, "draws": draws}


class LoaderSynthesis:
    """Real-ESRGAN synthesis of one sample at a time, in the DataLoader workers (on the CPU).

    Every sample is a batch of one: its choices come from its own seed (:func:`sample_batch_rng`), so batches mix
    degradations as the pool makes them do; its values and fields from its seed as in the training step.
    Picklable (spawned workers get a copy).
    """

    def __init__(self, settings: SynthesisSettings, *, sharpen_input: bool, keep_sharpened: bool) -> None:
        self.settings = settings
        self.sharpen_input = bool(sharpen_input)
        self.keep_sharpened = bool(keep_sharpened)
        self.usm = USMSharp()
        self.jpeger = DiffJPEG(differentiable=False)

    def __call__(self, gt: Tensor, kernels: Sequence[Tensor], seed: int) -> dict[str, Any]:
        """``gt`` (3, H, W) and (k, k) kernels of one sample -> its ``lq`` (3, p, p) and ``gt`` crop, and draws."""
        choices = draw_batch_choices(sample_batch_rng(seed), self.settings, tuple(gt.shape[-2:]))  # type: ignore
        out = synthesise(gt[None], [k[None] for k in kernels], settings=self.settings, choices=choices,
                         seeds=[seed], gens=[torch.Generator()], usm=self.usm, jpeger=self.jpeger,
                         sharpen_input=self.sharpen_input, keep_sharpened=self.keep_sharpened)
        return {**out, "lq": out["lq"][0], "gt": out["gt"][0]}


# ---------------------------------------------------------------------------------------------- the pair pool
def quantise(x: Tensor) -> Tensor:
    """A tensor of 8-bit levels ``k / 255`` as uint8 (exact: ``dequantise`` gives the same floats back)."""
    return torch.clamp((x * 255.0).round(), 0, 255).to(torch.uint8)


def dequantise(x: Tensor) -> Tensor:
    """uint8 levels as float32 ``k / 255`` (the values image decoding and ``clamp_round`` produce)."""
    return x.to(torch.float32) / 255.0


class TrainingPairPool:
    """Real-ESRGAN's training-pair pool (``queue_size``), which mixes samples of different batches.

    The pool has ``rows = queue_size // batch`` rows of one batch each. While it fills, each batch goes into the
    next row and trains as it is. Once full, every batch position ``j`` trains on the sample of a random row of
    its column and leaves its new sample in that place. BasicSR shuffles the whole pool and takes ``batch``
    entries instead; both replace ``batch / queue_size`` of the pool per step (the same age distribution), but a
    column per batch position lets a global batch split over ranks keep exactly one process's pool: rank ``r``
    holds the columns of its slice of the global batch. Picks come from :func:`pool_rng`.

    Entries are stored as uint8 where they are 8-bit images (``exact_8bit``: the LQ always, the GT unless it was
    sharpened), which is exact and 4x smaller than float32.
    """

    def __init__(self, queue_size: int, exact_8bit: Mapping[str, bool]) -> None:
        self.queue_size = int(queue_size)
        self.exact_8bit = dict(exact_8bit)
        self.rows = 0
        self.filled = 0
        self.data: dict[str, Tensor] = {}
        self._pending: dict[str, Any] | None = None

    def _create(self, batch: Mapping[str, Tensor]) -> None:
        b = next(iter(batch.values())).shape[0]
        if self.queue_size % b:
            raise OptionError(f"queue_size: {self.queue_size} is not a multiple of the batch per device ({b}); "
                              f"use e.g. {max(1, self.queue_size // b) * b}")
        self.rows = self.queue_size // b
        for k, v in batch.items():
            dtype = torch.uint8 if self.exact_8bit[k] else v.dtype
            self.data[k] = torch.zeros((self.rows, *v.shape), dtype=dtype, device=v.device)
        if self._pending is not None:
            self._restore(self._pending)
            self._pending = None

    def _store(self, k: str, v: Tensor) -> Tensor:
        return quantise(v) if self.exact_8bit[k] else v

    def _load(self, k: str, v: Tensor) -> Tensor:
        return dequantise(v) if self.exact_8bit[k] else v

    @property
    def full(self) -> bool:
        return self.rows > 0 and self.filled == self.rows

    def swap(self, batch: Mapping[str, Tensor], rng: np.random.Generator, *, offset: int, global_batch: int,
             to_device: Callable[[Tensor], Tensor]) -> dict[str, Tensor]:
        """Put ``batch`` (same keys every call; columns ``offset .. offset + B`` of the global batch) into the pool
        and return what trains now. ``rng`` draws the rows of all ``global_batch`` columns (the same on every
        rank); ``to_device`` uploads the index tensors (data, not constants: one graph on XLA for every step)."""
        if not self.data:
            self._create(batch)
        b = next(iter(batch.values())).shape[0]
        if not self.full:
            row = to_device(torch.tensor([self.filled], dtype=torch.long))
            for k, v in batch.items():
                self.data[k].index_copy_(0, row, self._store(k, v).unsqueeze(0))
            self.filled += 1
            return dict(batch)
        picks = rng.integers(0, self.rows, size=global_batch)[offset: offset + b]
        rows = to_device(torch.from_numpy(picks.astype(np.int64)))
        cols = to_device(torch.arange(b, dtype=torch.long))
        out = {}
        for k, v in batch.items():
            out[k] = self._load(k, self.data[k][rows, cols])
            self.data[k][rows, cols] = self._store(k, v)
        return out

    # ------------------------------------------------------------------------------------------ state
    def state_dict(self, gather: Callable[[Any], list[Any]], to_host: Callable[[Any], Any]) -> dict[str, Any]:
        """The whole pool of every rank, columns in global order: ``{'filled', 'rows', 'data': {key: tensor
        (rows, global batch, ...)}}``. ``gather`` is the accelerator's ``all_gather_object`` (every rank calls)."""
        if not self.data and self._pending is not None:  # loaded, not used yet: what was loaded
            local, filled = dict(self._pending["data"]), int(self._pending["filled"])
            rows = int(next(iter(local.values())).shape[0])
        else:
            local, filled, rows = to_host(self.data), self.filled, self.rows
        parts = gather(local)
        data = {k: torch.cat([p[k] for p in parts], dim=1) for k in local} if local else {}
        return {"filled": filled, "rows": rows, "data": data}

    def load_state_dict(self, state: Mapping[str, Any], *, offset: int, batch: int, where: str = "the state") -> None:
        """Take this rank's columns ``offset .. offset + batch`` of a saved pool (the pool is built on the first
        batch, so the device copy happens then)."""
        if not state["data"]:
            return
        rows = int(state["rows"])
        if self.queue_size != rows * batch:
            raise CheckpointError(f"{where} holds a pair pool of {rows} rows x {batch} (queue_size {rows * batch} "
                                  f"per device) but queue_size is {self.queue_size} now; restore queue_size "
                                  "(or start a new run)")
        sizes = {int(v.shape[1]) for v in state["data"].values()}
        if any(offset + batch > n for n in sizes):
            raise CheckpointError(f"{where}: its pair pool holds {sizes} columns, fewer than this rank needs "
                                  f"({offset + batch}); resume with the global batch it was saved with")
        self._pending = {"filled": int(state["filled"]),
                         "data": {k: v[:, offset: offset + batch].contiguous() for k, v in state["data"].items()}}

    def _restore(self, pending: Mapping[str, Any]) -> None:
        for k, v in pending["data"].items():
            if k not in self.data or tuple(v.shape) != tuple(self.data[k].shape) or v.dtype != self.data[k].dtype:
                raise CheckpointError(f"the saved pair pool's '{k}' entries ({tuple(v.shape)}, {v.dtype}) do not fit "
                                      f"this run's ({tuple(self.data[k].shape) if k in self.data else 'none'}); "
                                      "restore gt_size, scale and queue_size (or start a new run)")
            self.data[k].copy_(v.to(self.data[k].device))
        self.filled = int(pending["filled"])


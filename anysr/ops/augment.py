"""Batch augmentations of LQ/GT training pairs: mixup, cutmix, resizemix, cutblur, RGB channel permutation.

Pure tensor operators: every random choice comes in as a tensor (:class:`AugmentDraw`, drawn in
:mod:`anysr.data.batch_augment`), so the same draw gives the same result on any device, and no shape depends on a
draw: a box is a mask (``torch.where``), a resize into a box is a product with resampling matrices built from the
box. XLA therefore compiles one graph whatever is drawn, and nothing waits for the device.

Boxes are given in LQ pixels ``(y0, x0, y1, x1)`` (end exclusive) and scaled by the LQ/GT ratio for the GT, so the
LQ and GT boxes cover the same content. Semantics follow traiNNer-redux's mixture of augmentations (``use_moa``):

- ``mixup``: both images become ``lam * own + (1 - lam) * partner``;
- ``cutmix``: the partner's pixels inside the box replace the sample's;
- ``resizemix``: the whole partner, shrunk into the box (antialiased bicubic, clamped to [0, 1]), is pasted there;
- ``cutblur``: inside the box the LQ becomes the GT downscaled to LQ size (antialiased bicubic); the GT is kept
  (traiNNer-redux's reading of CutBlur for scale > 1: the network sees clean bicubic-downscaled regions next to
  degraded ones; the paper's version pastes both ways at HR size, which needs an input as large as the GT);
- ``rgb``: the same permutation of the channels of LQ and GT (victorca25/traiNNer's ``rgb``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["AUGMENTS", "AugmentDraw", "apply_augment", "box_mask", "cutblur", "cutmix", "downscale", "mixup",
           "permute_channels", "resize_into_box", "resize_matrix", "resizemix"]

AUGMENTS = ("none", "mixup", "cutmix", "resizemix", "cutblur", "rgb")  # the index is the kind code of a draw
NONE, MIXUP, CUTMIX, RESIZEMIX, CUTBLUR, RGB = range(len(AUGMENTS))


@dataclass(frozen=True)
class AugmentDraw:
    """The random draws of one micro-batch of ``B`` samples (all tensors, on the images' device).

    ``kind`` (B,) int64: index into :data:`AUGMENTS`; ``lam`` (B,) float: mixup's weight of the sample itself;
    ``box`` (B, 4) int64: ``(y0, x0, y1, x1)`` in LQ pixels (mixup: the whole image; none / rgb: empty);
    ``partner`` (B,) int64: the sample mixed in (an index into the batch); ``perm`` (B, C) int64: the channel order.
    """

    kind: Tensor
    lam: Tensor
    box: Tensor
    partner: Tensor
    perm: Tensor

    def to(self, device: torch.device | str) -> AugmentDraw:
        """The draw on ``device``, moved as one float32 tensor (one transfer; the integers are small, so exact)."""
        packed = torch.cat([self.kind[:, None].float(), self.lam[:, None].float(), self.box.float(),
                            self.partner[:, None].float(), self.perm.float()], dim=1).to(device)
        ints = packed.to(torch.int64)
        return AugmentDraw(ints[:, 0], packed[:, 1], ints[:, 2:6], ints[:, 6], ints[:, 7:])


def _ratio(lq: Tensor, gt: Tensor) -> int:
    h, w = lq.shape[-2:]
    hh, ww = gt.shape[-2:]
    if hh % h or ww % w or hh // h != ww // w:
        raise ValueError(f"batch augmentations need a GT an integer multiple of the LQ in size; got LQ {h}x{w} and "
                         f"GT {hh}x{ww}")
    return hh // h


def box_mask(box: Tensor, height: int, width: int, scale: int = 1) -> Tensor:
    """(B, 1, height, width) bool: True inside ``box * scale`` (``box`` (B, 4) = y0, x0, y1, x1, end exclusive)."""
    b = box.to(torch.int64) * scale
    ys = torch.arange(height, device=box.device)[None, :]
    xs = torch.arange(width, device=box.device)[None, :]
    in_y = (ys >= b[:, 0:1]) & (ys < b[:, 2:3])
    in_x = (xs >= b[:, 1:2]) & (xs < b[:, 3:4])
    return (in_y[:, :, None] & in_x[:, None, :])[:, None]


def _cubic(t: Tensor, a: float = -0.5) -> Tensor:
    """Keys' cubic kernel (``a = -0.5``, PyTorch's antialiased bicubic)."""
    t = t.abs()
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return torch.where(t <= 1, near, torch.where(t < 2, far, torch.zeros_like(t)))


def resize_matrix(start: Tensor, length: Tensor, out_len: int, in_len: int) -> Tensor:
    """(B, out_len, in_len): output rows ``start <= y < start + length`` sample the whole input squeezed into
    ``length`` pixels (antialiased bicubic, half-pixel centres, taps outside the input dropped and the rest
    renormalised, as ``F.interpolate(mode='bicubic', antialias=True)``); the other rows are zero."""
    start = start.to(torch.float32).reshape(-1, 1)
    length = length.to(torch.float32).reshape(-1, 1).clamp(min=1.0)
    # Pixel centres y + 1/2 as (2y + 1) / 2: no 0.5 scalar in the graph (on XLA a float scalar is a value-cached
    # device input; a varying one elsewhere, such as the EMA's weight, would share it when equal: a new graph).
    yc = torch.arange(1, 2 * out_len, 2, device=start.device, dtype=torch.float32)[None, :] / 2
    vc = torch.arange(1, 2 * in_len, 2, device=start.device, dtype=torch.float32)[None, None, :] / 2
    ratio = length / in_len  # output pixels per input pixel
    uc = (yc - start) / ratio  # (B, out): source coordinate (+ 1/2) of each output row
    support = ratio.clamp(max=1.0)[..., None]  # antialias: the kernel widens by 1 / ratio when shrinking
    w = _cubic((vc - uc[..., None]) * support)
    inside = (yc > start) & (yc < start + length)
    w = w / w.sum(-1, keepdim=True).clamp(min=1e-12)
    return torch.where(inside[..., None], w, torch.zeros_like(w))


def _resample(x: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """``rows @ x @ cols^T`` per sample and channel, in float32 (rows (B, H', H), cols (B, W', W))."""
    t = torch.einsum("bhy,bcyx->bchx", rows, x.float())
    return torch.einsum("bchx,bwx->bchw", t, cols).to(x.dtype)


def resize_into_box(x: Tensor, box: Tensor, scale: int = 1) -> Tensor:
    """Each whole image of ``x`` shrunk into its ``box * scale`` (zero outside the box), fixed output shape."""
    b = box.to(torch.int64) * scale
    h, w = x.shape[-2:]
    rows = resize_matrix(b[:, 0], b[:, 2] - b[:, 0], h, h)
    cols = resize_matrix(b[:, 1], b[:, 3] - b[:, 1], w, w)
    return _resample(x, rows, cols)


def bicubic_resize(x: Tensor, out_h: int, out_w: int, span: tuple[float, float] | None = None) -> Tensor:
    """Every image of ``x`` (N, C, H, W) resampled to ``out_h`` x ``out_w`` as ``F.interpolate(mode='bicubic',
    antialias=True)`` does (Keys' cubic, a = -0.5), as two small matrix products in float32: no XLA fallback.
    ``span``: the output lengths the input maps onto (default the output sides, ``size=``; ``side / factor`` for
    ``scale_factor=``'s coordinates)."""
    h, w = x.shape[-2:]
    span_h, span_w = span if span is not None else (out_h, out_w)
    zero = torch.zeros(1, device=x.device)
    rows = resize_matrix(zero, zero + span_h, out_h, h)[0]
    cols = resize_matrix(zero, zero + span_w, out_w, w)[0]
    t = torch.einsum("hy,ncyx->nchx", rows, x.float())
    return torch.einsum("nchx,wx->nchw", t, cols)


def downscale(x: Tensor, factor: int) -> Tensor:
    """``x`` downscaled by an integer ``factor`` (antialiased bicubic, as ``F.interpolate(..., antialias=True)``)."""
    if factor == 1:
        return x
    h, w = x.shape[-2:]
    return bicubic_resize(x, h // factor, w // factor).to(x.dtype)


def _col(t: Tensor) -> Tensor:
    return t.reshape(-1, 1, 1, 1)


def mixup(lq: Tensor, gt: Tensor, partner: Tensor, lam: Tensor) -> tuple[Tensor, Tensor]:
    """``lam * own + (1 - lam) * partner`` for LQ and GT (``lam`` (B,), ``partner`` (B,) batch indices)."""
    lam = _col(lam)
    return torch.lerp(lq[partner], lq, lam.to(lq.dtype)), torch.lerp(gt[partner], gt, lam.to(gt.dtype))


def cutmix(lq: Tensor, gt: Tensor, partner: Tensor, box: Tensor) -> tuple[Tensor, Tensor]:
    """The partner's pixels inside the box (LQ pixels; scaled for the GT) replace the sample's."""
    s = _ratio(lq, gt)
    return (torch.where(box_mask(box, *lq.shape[-2:]), lq[partner], lq),
            torch.where(box_mask(box, *gt.shape[-2:], scale=s), gt[partner], gt))


def resizemix(lq: Tensor, gt: Tensor, partner: Tensor, box: Tensor) -> tuple[Tensor, Tensor]:
    """The whole partner, shrunk into the box and clamped to [0, 1], pasted there (LQ and GT alike)."""
    s = _ratio(lq, gt)
    small_lq = resize_into_box(lq[partner], box).clamp(0, 1)
    small_gt = resize_into_box(gt[partner], box, scale=s).clamp(0, 1)
    return (torch.where(box_mask(box, *lq.shape[-2:]), small_lq, lq),
            torch.where(box_mask(box, *gt.shape[-2:], scale=s), small_gt, gt))


def cutblur(lq: Tensor, gt: Tensor, box: Tensor) -> tuple[Tensor, Tensor]:
    """Inside the box the LQ becomes the GT downscaled to LQ size; the GT is unchanged."""
    s = _ratio(lq, gt)
    return torch.where(box_mask(box, *lq.shape[-2:]), downscale(gt, s).to(lq.dtype), lq), gt


def permute_channels(x: Tensor, perm: Tensor) -> Tensor:
    """Channel ``c`` of sample ``b`` becomes its channel ``perm[b, c]`` (a gather: exact, fixed shape)."""
    return torch.gather(x, 1, perm.to(torch.int64)[:, :, None, None].expand_as(x))


def apply_augment(lq: Tensor, gts: Sequence[Tensor], draw: AugmentDraw,
                  kinds: Sequence[str] = AUGMENTS) -> tuple[Tensor, list[Tensor]]:
    """Apply each sample's drawn augmentation to the LQ and to every GT-sized target in ``gts`` (the first one is
    the GT that cutblur pastes from), in one fixed graph: each kind in ``kinds`` (the ones that can be drawn) is
    computed, and each sample takes its own by ``torch.where``. A sample of kind ``none`` is returned unchanged."""
    s = _ratio(lq, gts[0])
    kind = _col(draw.kind)
    mixes = any(k in kinds for k in ("mixup", "cutmix", "resizemix"))
    in_lq = box_mask(draw.box, *lq.shape[-2:])
    in_gt = box_mask(draw.box, *gts[0].shape[-2:], scale=s) & (kind != CUTBLUR)

    def source(x: Tensor, scale: int, own: Tensor | None) -> Tensor:
        """What sample b takes inside its box (``own``: cutblur's LQ source, for the LQ)."""
        out = x
        if mixes:
            other = x[draw.partner]
            out = other
            if "mixup" in kinds:
                out = torch.where(kind == MIXUP, torch.lerp(other, x, _col(draw.lam).to(x.dtype)), out)
            if "resizemix" in kinds:
                out = torch.where(kind == RESIZEMIX, resize_into_box(other, draw.box, scale).clamp(0, 1), out)
        if own is not None and "cutblur" in kinds:
            out = torch.where(kind == CUTBLUR, own.to(x.dtype), out)
        return out

    down = downscale(gts[0], s) if "cutblur" in kinds else None
    new_lq = torch.where(in_lq, source(lq, 1, down), lq)
    new_gts = [torch.where(in_gt, source(g, s, None), g) for g in gts]
    if "rgb" in kinds:
        new_lq = permute_channels(new_lq, draw.perm)
        new_gts = [permute_channels(g, draw.perm) for g in new_gts]
    return new_lq, new_gts

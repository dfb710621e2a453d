"""Image transforms for training pairs (numpy, BasicSR conventions) and numpy <-> tensor conversion.

Randomness always comes from an explicit ``numpy.random.Generator``; nothing here touches a global RNG.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import torch

from anysr.errors import DataError, OptionError
from anysr.ops.color import bgr2ycbcr
from anysr.ops.image import img2tensor as img2tensor
from anysr.ops.image import lq_patch_size

ImgOrList = TypeVar("ImgOrList", np.ndarray, list[np.ndarray])


def _as_list(imgs: np.ndarray | Sequence[np.ndarray]) -> tuple[list[np.ndarray], bool]:
    if isinstance(imgs, np.ndarray):
        return [imgs], True
    return list(imgs), False


def _hw(img: np.ndarray) -> tuple[int, int]:
    return int(img.shape[0]), int(img.shape[1])


def mod_crop(img: np.ndarray, scale: int) -> np.ndarray:
    """Crop the bottom/right border so that height and width are multiples of ``scale`` (HW or HWC)."""
    if isinstance(scale, bool) or not isinstance(scale, int | np.integer) or scale < 1:
        raise OptionError(f"mod_crop: scale must be a positive integer, got {scale}")
    s = int(scale)
    h, w = _hw(img)
    return img[: h - h % s, : w - w % s, ...]


def check_pair_size(gt: np.ndarray, lq: np.ndarray, scale: int, gt_path: str = "GT image",
                    lq_path: str = "LQ image") -> None:
    """A DataError naming both files unless ``gt`` mod-cropped to ``scale`` is exactly ``lq`` x scale."""
    h_gt, w_gt = _hw(gt)
    h_lq, w_lq = _hw(lq)
    if h_gt // scale != h_lq or w_gt // scale != w_lq:
        raise DataError(
            f"{gt_path} is {h_gt}x{w_gt} (HxW) but {lq_path} is {h_lq}x{w_lq}: with scale {scale} the GT "
            f"should be {h_lq * scale}x{w_lq * scale} (up to {scale - 1} extra border pixels). "
            "Check the 'scale' option and that the LQ image was made from this GT."
        )


def match_gt_to_lq(gt: np.ndarray, lq: np.ndarray, scale: int, gt_path: str = "GT image",
                   lq_path: str = "LQ image") -> np.ndarray:
    """``gt`` cropped to exactly (lq height x scale, lq width x scale), after checking the sizes agree."""
    check_pair_size(gt, lq, scale, gt_path, lq_path)
    h_lq, w_lq = _hw(lq)
    return gt[: h_lq * scale, : w_lq * scale, ...]


def random_crop_origin(h: int, w: int, patch: int, rng: np.random.Generator) -> tuple[int, int]:
    """A uniform (top, left) for a ``patch`` square inside an ``h`` x ``w`` image (two draws from ``rng``)."""
    top = int(rng.integers(0, h - patch + 1))
    left = int(rng.integers(0, w - patch + 1))
    return top, left


def paired_random_crop(gt: ImgOrList, lq: ImgOrList, gt_size: int, scale: int, rng: np.random.Generator,
                       gt_path: str = "GT image", lq_path: str = "LQ image") -> tuple[ImgOrList, ImgOrList]:
    """Crop aligned patches: ``gt_size`` square from the GT, ``gt_size // scale`` from the LQ.

    ``gt`` and ``lq`` are images (HW or HWC) or lists of equally sized images; the LQ patch at (top, left)
    pairs with the GT patch at (top * scale, left * scale). Returns the patches in the form given.
    """
    lq_patch = lq_patch_size(gt_size, scale)
    gts, gt_single = _as_list(gt)
    lqs, lq_single = _as_list(lq)
    if not gts or not lqs:
        raise DataError("paired_random_crop: no images given")
    h_lq, w_lq = _hw(lqs[0])
    check_pair_size(gts[0], lqs[0], scale, gt_path, lq_path)
    if h_lq < lq_patch or w_lq < lq_patch:
        raise DataError(
            f"{lq_path} is {h_lq}x{w_lq} (HxW), smaller than the {lq_patch}x{lq_patch} LQ patch "
            f"(gt_size {gt_size} / scale {scale}; GT {gt_path}). Lower gt_size, or remove images smaller "
            f"than {gt_size}x{gt_size} from the dataset."
        )
    top, left = random_crop_origin(h_lq, w_lq, lq_patch, rng)
    lq_out = [v[top: top + lq_patch, left: left + lq_patch, ...] for v in lqs]
    t, lft = top * scale, left * scale
    gt_out = [v[t: t + gt_size, lft: lft + gt_size, ...] for v in gts]
    return (gt_out[0] if gt_single else gt_out), (lq_out[0] if lq_single else lq_out)  # type: ignore[return-value]


def augment(imgs: ImgOrList, hflip: bool, rot: bool, rng: np.random.Generator) -> ImgOrList:
    """BasicSR's augmentation: horizontal flip (if ``hflip``), vertical flip and transpose (if ``rot``).

    Each is applied with probability 1/2, the same to every image of ``imgs``; together they give the
    eight dihedral orientations. Three draws are always taken from ``rng`` so its stream does not depend
    on the flags. Returns contiguous arrays in the form given.
    """
    draws = rng.random(3)
    do_h, do_v, do_t = hflip and draws[0] < 0.5, rot and draws[1] < 0.5, rot and draws[2] < 0.5
    items, single = _as_list(imgs)
    out = []
    for img in items:
        if do_h:
            img = img[:, ::-1, ...]
        if do_v:
            img = img[::-1, ...]
        if do_t:
            img = np.swapaxes(img, 0, 1)
        out.append(np.ascontiguousarray(img))
    return out[0] if single else out  # type: ignore[return-value]


def tensor2img(t: torch.Tensor, *, rgb2bgr: bool = True, bits: int = 8) -> np.ndarray:
    """A CHW (or 1xCHW) tensor in [0,1] as a numpy image: HWC BGR, or HW for one channel; uint8 (``bits=8``)
    or uint16 (``bits=16``).

    Values are clamped to [0,1], scaled by 255 (65535) and rounded (half to even).
    """
    if bits not in (8, 16):
        raise DataError(f"tensor2img: bits must be 8 or 16, got {bits!r}")
    t = t.detach()
    if t.ndim == 4:
        if t.shape[0] != 1:
            raise DataError(f"tensor2img: expected one image, got a batch of {t.shape[0]}")
        t = t[0]
    if t.ndim == 2:
        t = t[None]
    if t.ndim != 3 or t.shape[0] not in (1, 3):
        raise DataError(f"tensor2img: expected CHW with 1 or 3 channels, got shape {tuple(t.shape)}")
    if bits == 16:
        arr = (t.float().cpu().clamp_(0, 1) * 65535.0).round_().to(torch.int32).numpy().astype(np.uint16)
    else:
        arr = (t.float().cpu().clamp_(0, 1) * 255.0).round_().to(torch.uint8).numpy()
    if arr.shape[0] == 1:
        return np.ascontiguousarray(arr[0])
    if rgb2bgr:
        arr = arr[::-1]
    return np.ascontiguousarray(arr.transpose(1, 2, 0))


def bgr_to_y(img: np.ndarray) -> np.ndarray:
    """The BT.601 luma (16-235 range, as MATLAB rgb2ycbcr) of a BGR image (uint8, uint16 or float in [0,1]), as
    float32 HW in [0,1].

    A 2-D (gray) image is its own Y channel (full range) and is only scaled to float in [0,1].
    """
    if img.dtype == np.uint8:
        x = img.astype(np.float32) / 255.0
    elif img.dtype == np.uint16:
        x = img.astype(np.float32) / 65535.0
    else:
        x = img.astype(np.float32)
    if x.ndim == 2:
        return x
    return bgr2ycbcr(x, y_only=True).astype(np.float32)


def normalize(t: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``(t - mean) / std`` per channel of a CHW tensor (one value broadcasts to every channel)."""
    m = torch.as_tensor(list(mean), dtype=t.dtype).reshape(-1, 1, 1)
    s = torch.as_tensor(list(std), dtype=t.dtype).reshape(-1, 1, 1)
    return (t - m) / s


def image_grid(images: torch.Tensor, nrow: int | None = None, padding: int = 2) -> torch.Tensor:
    """(N, C, H, W) images as one (C, H', W') grid, ``nrow`` per row (default: ceil(sqrt(N))), ``padding`` black
    pixels around each (torchvision's ``make_grid`` layout)."""
    n, c, h, w = images.shape
    per_row = nrow or math.ceil(math.sqrt(n))
    rows = math.ceil(n / per_row)
    grid = images.new_zeros(c, rows * (h + padding) + padding, per_row * (w + padding) + padding)
    for k in range(n):
        y, x = divmod(k, per_row)
        top, left = y * (h + padding) + padding, x * (w + padding) + padding
        grid[:, top:top + h, left:left + w] = images[k]
    return grid

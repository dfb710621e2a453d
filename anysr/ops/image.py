"""Image <-> tensor conversion and the GT / LQ patch arithmetic that the datasets (anysr.data) and the degradation
pipelines (anysr.data.degradation) share; re-exported by anysr.data.transforms."""

from __future__ import annotations

import numpy as np
import torch

from anysr.errors import DataError, OptionError


def lq_patch_size(gt_size: int, scale: int) -> int:
    """The LQ patch side that pairs with a ``gt_size`` GT patch at ``scale``: the one place it is computed.

    The options check once that ``gt_size`` is a multiple of the scale; a call that bypassed them is refused here.
    """
    if gt_size % scale:
        raise OptionError(f"gt_size {gt_size} is not a multiple of scale {scale}; pick e.g. "
                          f"{max(scale, gt_size - gt_size % scale)}")
    return gt_size // scale


def img2tensor(img: np.ndarray, *, bgr2rgb: bool = True, gray_to_rgb: bool = False) -> torch.Tensor:
    """A numpy image (HWC BGR or HW gray; uint8, uint16, or float in [0,1]) as a float32 CHW tensor in [0,1]:
    ``x / 255`` for uint8, ``x / 65535`` for uint16 (every 16-bit level kept), floats as they are.

    Colour channels are reordered BGR -> RGB; a 2-D gray image becomes 1 channel, or 3 identical channels
    with ``gray_to_rgb``.
    """
    if img.ndim == 3 and img.shape[2] == 1:
        img = img[:, :, 0]
    if img.ndim == 2:
        chw = img[None]
        if gray_to_rgb:
            chw = np.repeat(chw, 3, axis=0)
    elif img.ndim == 3 and img.shape[2] == 3:
        chw = img.transpose(2, 0, 1)
        if bgr2rgb:
            chw = chw[::-1]
    else:
        raise DataError(f"img2tensor: expected an HW or HWC (3 channels) image, got shape {img.shape}")
    if chw.dtype in (np.uint8, np.uint16):
        # one pass into a new CHW float32 array: the same values as ``chw.astype(np.float32) / 255.0`` (an exact
        # integer to float32 conversion, then a float32 division), without the strided float temporary
        arr = np.empty(chw.shape, np.float32)
        np.divide(np.ascontiguousarray(chw), np.float32(255.0 if chw.dtype == np.uint8 else 65535.0), out=arr,
                  dtype=np.float32)
    else:
        arr = chw.astype(np.float32)
    return torch.from_numpy(np.ascontiguousarray(arr))

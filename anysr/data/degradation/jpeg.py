"""The real JPEG codec (OpenCV) as a degradation: encode and decode at a fixed or a randomly drawn quality.

:class:`anysr.ops.diffjpeg.DiffJPEG` is its tensor counterpart (what the Real-ESRGAN pipeline runs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import cv2
import numpy as np

from anysr.data.degradation.draws import check_range
from anysr.errors import DataError, OptionError

__all__ = ["jpeg_cv2", "random_jpeg_cv2"]


def jpeg_cv2(img: np.ndarray, quality: int) -> np.ndarray:
    """Encode ``img`` as JPEG with OpenCV at ``quality`` (0-100) and decode it again.

    ``img`` is uint8, HW or HWC with 3 channels in OpenCV's BGR order (as anysr reads images); the chroma
    conversion assumes that order. The result has the same shape and dtype. BasicSR's ``add_jpg_compression``
    on ``img / 255`` gives the same pixels (it rounds to uint8 before encoding).
    """
    arr = np.asarray(img)
    if arr.dtype != np.uint8:
        raise DataError(f"jpeg_cv2: expected a uint8 image, got {arr.dtype}; round and clip to uint8 first")
    if not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[2] in (1, 3))):
        raise DataError(f"jpeg_cv2: expected an HW or HWC (1 or 3 channels) image, got shape {arr.shape}")
    if isinstance(quality, bool) or int(quality) != quality or not 0 <= quality <= 100:
        raise OptionError(f"jpeg_cv2: quality must be an integer in [0, 100], got {quality!r}")
    ok, buf = cv2.imencode(".jpg", arr, [int(cv2.IMWRITE_JPEG_QUALITY), int(quality)])
    if not ok:
        raise DataError(f"jpeg_cv2: OpenCV could not encode an image of shape {arr.shape}")
    out = cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)
    return out.reshape(arr.shape)


def random_jpeg_cv2(img: np.ndarray, rng: np.random.Generator, quality_range: Sequence[int]) -> np.ndarray:
    """:func:`jpeg_cv2` at an integer quality drawn uniformly from ``quality_range`` (both ends included)."""
    lo, hi = check_range(quality_range, "random_jpeg_cv2", "quality_range")
    quality = int(rng.integers(math.ceil(lo), math.floor(hi) + 1))
    return jpeg_cv2(img, quality)

"""MMRealSR's training set: ``MMRealSRGANDataset`` (GT images and the seven anchored kernels per sample).

As ``RealESRGANDataset`` (read, flip / rotate, reflect-pad or crop to ``crop_pad_size``, 400 as the authors
hard-code it), with the authors' additions: ``random_scale`` (a Lanczos downscale by a factor uniform in
[random_scale, 1], grown by 0.1 steps until both sides reach the crop size, possibly past 1: the reference's
loop), before the flips; ``meta_info`` may be a list of files; and the kernels of
:func:`anysr.data.degradation.mmrealsr.draw_anchored_kernel_params` (small / large / max of both stages, at
least ``blur_kernel_diff_lower_bound`` apart, and the final sinc). Every draw comes from the sample's seed.
Items: ``{'gt', 'kernel1_small', ..., 'sinc_kernel', 'gt_path', 'seed', 'bits'}``; with an
:class:`~anysr.data.degradation.mmrealsr.AnchoredLoaderSynthesis` attached (``degrade_in: loader``):
``{'lq', 'anchor', 'gt', 'gt_path', 'seed', 'bits'}``. With ``random_scale`` the GT is the float Lanczos result, as
the authors' (not rounded, overshoot kept), and ``bits`` says 16: more than 8-bit levels, which the training-pair
pool and ``anysr prepare degrade`` then keep.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import cv2
import numpy as np

from anysr.data.degradation.kernels import KernelParams
from anysr.data.degradation.mmrealsr import (
    ANCHOR_KERNELS,
    AnchoredLoaderSynthesis,
    draw_anchored_kernel_params,
    sample_anchored_kernels,
)
from anysr.data.paired_image_dataset import _check_files_exist, _meta_info_names, image_bits
from anysr.data.realesrgan_dataset import _TAG_IMAGE, _TAG_KERNELS, MAX_KERNEL_SIZE, RealESRGANDataset, pad_or_crop
from anysr.data.transforms import augment, img2tensor
from anysr.errors import OptionError
from anysr.registry import DATASET_REGISTRY

__all__ = ["MMRealSRGANDataset", "random_rescale"]

_TAG_SCALE = 2  # a third stream of a sample's seed: the random_scale draw


def random_rescale(img: np.ndarray, low: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """The authors' ``random_scale``: ``img`` as float32 in [0, 1] resized (Lanczos) by ``f`` uniform in [low, 1],
    where ``f`` grows by 0.1 while a side would be below ``size`` and ``f < 1`` (so it may end above 1)."""
    if img.dtype in (np.uint8, np.uint16):
        img = img.astype(np.float32) / (255.0 if img.dtype == np.uint8 else 65535.0)
    f = float(rng.uniform(low, 1.0))
    h, w = img.shape[:2]
    while (h * f < size or w * f < size) and f < 1:
        f += 0.1
    return cv2.resize(img, (int(w * f), int(h * f)), interpolation=cv2.INTER_LANCZOS4)


@DATASET_REGISTRY.register()
class MMRealSRGANDataset(RealESRGANDataset):
    """HR images plus MMRealSR's seven per-sample kernels, for ``MMRealSRNetModel`` / ``MMRealSRGANModel``.

    Options (the authors'): RealESRGANDataset's (dataroot_gt, meta_info (a file or a list of files), io_backend,
    use_hflip, use_rot, the blur keys of both stages, final_sinc_prob, crop_pad_size (400)), plus random_scale
    (null, or a factor below 1) and blur_kernel_diff_lower_bound (0.1).
    """

    anchored_kernels = True  # the seven kernels of MMRealSR's synthesis (the options pair it with its models)
    meta_info_lists = True  # meta_info may list several files

    def __init__(self, opt: Mapping[str, Any], key_path: str | None = None) -> None:
        super().__init__(opt, key_path)
        scale = opt.get("random_scale")
        if scale is not None and not 0 < float(scale) < 1:
            raise OptionError(f"{self.key_path}.random_scale: must be a factor in (0, 1) or null, got {scale!r}")
        self.random_scale = None if scale is None else float(scale)
        bound = opt.get("blur_kernel_diff_lower_bound")
        self.diff_lower_bound = 0.1 if bound is None else float(bound)
        self.kernel_params(0)  # the bound against the sigma ranges: an error now, not in a worker
        self.synthesis: AnchoredLoaderSynthesis | None = None  # type: ignore[assignment]

    def _names_from(self, root: str, backend: Any, what: str) -> list[str]:
        metas = self.opt["meta_info_file"]
        if metas is None or isinstance(metas, (str, os.PathLike)) or self.io_type in ("lmdb", "shards"):
            return super()._names_from(root, backend, what)
        names: list[str] = []
        for meta in metas:
            part = _meta_info_names(os.fspath(meta), self.key_path)
            _check_files_exist(root, part, what, self.key_path)
            names += part
        return names

    def attach_synthesis(self, synthesis: AnchoredLoaderSynthesis | None) -> None:  # type: ignore[override]
        """Synthesise in the loader workers with ``synthesis`` (None: deliver GT and kernels)."""
        self.synthesis = synthesis

    def kernel_params(self, seed: int) -> dict[str, KernelParams]:
        """The seven kernels sample ``seed`` draws (keys ``ANCHOR_KERNELS``), as parameters."""
        return draw_anchored_kernel_params(np.random.default_rng([int(seed), _TAG_KERNELS]), first=self.first,
                                           second=self.second, final_sinc_prob=self.final_sinc_prob,
                                           diff_lower_bound=self.diff_lower_bound, max_kernel_size=MAX_KERNEL_SIZE)

    def __getitem__(self, index: Any) -> dict[str, Any]:
        i, seed, img = self._read_gt(index)
        bits = image_bits(img)
        if self.random_scale is not None:
            img = random_rescale(img, self.random_scale, self.crop_pad_size,
                                 np.random.default_rng([seed, _TAG_SCALE]))
            bits = 16  # float Lanczos output: no longer 8-bit levels (the pool then keeps the GT as float32)
        rng = np.random.default_rng([seed, _TAG_IMAGE])
        img = augment(img, self.use_hflip, self.use_rot, rng)
        img = pad_or_crop(img, self.crop_pad_size, rng)
        kernels = sample_anchored_kernels(self.kernel_params(seed))
        gt = img2tensor(img, gray_to_rgb=True)
        if self.synthesis is not None:
            out = self.synthesis(gt, kernels, seed)
            return {"lq": out["lq"], "anchor": out["anchor"], "gt": out["gt"], "gt_path": self.path(i),
                    "seed": seed, "bits": bits}
        return {"gt": gt, **{k: kernels[k] for k in ANCHOR_KERNELS}, "gt_path": self.path(i), "seed": seed,
                "bits": bits}

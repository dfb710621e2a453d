"""Real-ESRGAN's training sets: ``RealESRGANDataset`` (GT only, kernels drawn per sample) and
``RealESRGANPairedDataset`` (LQ/GT pairs for fine-tuning), with BasicSR's option keys.

``RealESRGANDataset`` reads a GT image, flips / rotates it, reflect-pads it to ``crop_pad_size`` (BasicSR: 400)
when smaller and crops a random ``crop_pad_size`` square when larger, and draws the first- and second-order blur
kernels and the final sinc kernel (:func:`anysr.data.degradation.realesrgan.sample_degradation_kernels`). Every
random draw comes from the sample's seed (the sampler's counter-based one; ``ds[i]`` means seed ``i``). Items:
``{'gt', 'kernel1', 'kernel2', 'sinc_kernel', 'gt_path', 'seed', 'bits'}``; the model synthesises the LQ from
them. When the model hands it a :class:`~anysr.data.degradation.realesrgan.LoaderSynthesis` (``degrade_in:
loader``), the dataset synthesises in the loader workers instead and its items are ``{'lq', 'gt', 'gt_path',
'seed', 'bits'}``. A 16-bit GT stays 16-bit (``x / 65535``; ``bits`` 16); the synthesised LQ ends on 8-bit
levels as Real-ESRGAN's does (it models an 8-bit JPEG input).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import cv2
import numpy as np
import torch

from anysr.data.degradation.kernels import KERNEL_TYPES, KernelParams, make_kernel
from anysr.data.degradation.realesrgan import BlurSettings, LoaderSynthesis, draw_degradation_kernel_params
from anysr.data.file_backends import build_backend
from anysr.data.paired_image_dataset import (
    PairedImageDataset,
    _check_files_exist,
    _ImageDataset,
    _Pair,
    image_bits,
    meta_info_lines,
)
from anysr.data.transforms import augment, img2tensor
from anysr.errors import DataError
from anysr.registry import DATASET_REGISTRY

__all__ = ["RealESRGANDataset", "RealESRGANPairedDataset", "MAX_KERNEL_SIZE", "pad_or_crop"]

MAX_KERNEL_SIZE = 21  # BasicSR draws kernel sizes 7..21 and pads every kernel to 21x21
_TAG_IMAGE, _TAG_KERNELS = 0, 1  # two independent streams of a sample's seed: geometry, kernels


def pad_or_crop(img: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """BasicSR's crop-or-pad: reflect-pad (no edge repeat) the bottom/right to at least ``size``; then, when a side is
    larger, a random ``size`` x ``size`` crop (two draws from ``rng``)."""
    h, w = img.shape[:2]
    if h < size or w < size:
        img = cv2.copyMakeBorder(img, 0, max(0, size - h), 0, max(0, size - w), cv2.BORDER_REFLECT_101)
    h, w = img.shape[:2]
    if h > size or w > size:
        top, left = int(rng.integers(0, h - size + 1)), int(rng.integers(0, w - size + 1))
        img = img[top: top + size, left: left + size, ...]
    return np.ascontiguousarray(img)


class GTImageDataset(_ImageDataset):
    """A dataset of GT images only (degraded into LQ on the fly: Real-ESRGAN's, BSRGAN's; whole images: FFHQ's):
    an image needs two pixels a side to be reflect-padded to the patch."""

    def _check_item(self, i: int, decode: bool) -> str | None:
        name = self.items[i].gt
        assert name is not None
        info = self._info(self.gt_backend, name, decode)
        if min(info.width, info.height) < 2:
            return (f"{self._path(self.gt_root, name)} is {info.width}x{info.height}; it cannot be reflect-padded "
                    "to the patch (2 pixels a side at least): remove it from the folder or replace it")
        return None

    def path(self, i: int) -> str:
        name = self.items[i].gt
        assert name is not None
        return self._path(self.gt_root, name)

    def _read_gt(self, index: Any) -> tuple[int, int, np.ndarray]:
        """Item ``index`` (``i``, or ``(i, seed)`` from the sampler): its position, its seed (``i`` when not
        given) and its GT image as read."""
        i, seed = self._split_index(index)
        name = self.items[i].gt
        assert name is not None
        return i, i if seed is None else seed, self.gt_backend.read(name)


@DATASET_REGISTRY.register()
class RealESRGANDataset(GTImageDataset):
    """HR images plus per-sample degradation kernels, for ``RealESRNetModel`` / ``RealESRGANModel`` (train only).

    Options (BasicSR's): dataroot_gt (a folder, an .lmdb or a shard set), meta_info (alias of meta_info_file: lines
    starting with an image path relative to dataroot_gt; without it the folder is listed), io_backend, use_hflip,
    use_rot, kernel_list / kernel_prob / blur_sigma / betag_range / betap_range / sinc_prob and their ``*2`` twins,
    final_sinc_prob; traiNNer-redux's kernel_range / kernel_range2 / final_kernel_range (odd [min, max] kernel
    sizes, default 7 to 21); anysr's crop_pad_size (400 as BasicSR hard-codes it).
    """

    role = "synthesis_source"  # GT and kernels, no LQ: the options pair it with the models that synthesise
    kernel_types = KERNEL_TYPES  # the kernel_list kinds it draws (the options check and default them)

    def __init__(self, opt: Mapping[str, Any], key_path: str | None = None) -> None:
        super().__init__(opt, key_path)
        self.gt_root = os.fspath(opt["dataroot_gt"])
        self.gt_backend = build_backend(self.io_type, self.gt_root, self.io_opt)
        self.items = [_Pair(n, None) for n in self._names_from(self.gt_root, self.gt_backend, "GT")]
        self.first = BlurSettings.from_basicsr(opt, 1)
        self.second = BlurSettings.from_basicsr(opt, 2)
        self.final_sinc_prob = float(opt["final_sinc_prob"])
        final_sizes = opt.get("final_kernel_range")
        self.final_kernel_range = None if final_sizes is None else tuple(int(v) for v in final_sizes)
        self.crop_pad_size = int(opt["crop_pad_size"])
        self.use_hflip = bool(opt["use_hflip"])
        self.use_rot = bool(opt["use_rot"])
        self.synthesis: LoaderSynthesis | None = None

    def attach_synthesis(self, synthesis: LoaderSynthesis | None) -> None:
        """Synthesise the LQ in the loader workers with ``synthesis`` (None: deliver GT and kernels)."""
        self.synthesis = synthesis

    def kernel_params(self, seed: int) -> dict[str, KernelParams]:
        """The kernels sample ``seed`` draws, as parameters (what ``anysr prepare degrade`` reports)."""
        return draw_degradation_kernel_params(np.random.default_rng([int(seed), _TAG_KERNELS]), first=self.first,
                                              second=self.second, final_sinc_prob=self.final_sinc_prob,
                                              max_kernel_size=MAX_KERNEL_SIZE,
                                              final_kernel_range=self.final_kernel_range)

    def __getitem__(self, index: Any) -> dict[str, Any]:
        i, seed, img = self._read_gt(index)
        rng = np.random.default_rng([seed, _TAG_IMAGE])
        img = augment(img, self.use_hflip, self.use_rot, rng)
        img = pad_or_crop(img, self.crop_pad_size, rng)
        params = self.kernel_params(seed)
        kernels = [torch.from_numpy(make_kernel(params[k]).astype(np.float32))
                   for k in ("kernel1", "kernel2", "sinc_kernel")]
        gt = img2tensor(img, gray_to_rgb=True)
        bits = image_bits(img)
        if self.synthesis is not None:
            out = self.synthesis(gt, kernels, seed)
            return {"lq": out["lq"], "gt": out["gt"], "gt_path": self.path(i), "seed": seed, "bits": bits}
        return {"gt": gt, "kernel1": kernels[0], "kernel2": kernels[1], "sinc_kernel": kernels[2],
                "gt_path": self.path(i), "seed": seed, "bits": bits}


@DATASET_REGISTRY.register()
class RealESRGANPairedDataset(PairedImageDataset):
    """Real-ESRGAN's paired fine-tuning set (``high_order_degradation: false``): ``PairedImageDataset`` whose
    ``meta_info`` lines may also be Real-ESRGAN's ``<gt path>, <lq path>`` (relative to dataroot_gt / dataroot_lq);
    lines with one name are GT names as for PairedImageDataset. Crop, then flip / rotate, as BasicSR.
    """

    def _pairs_from_meta_info(self, meta: str) -> list[tuple[str, str]]:
        assert self.lq_root is not None
        lines = meta_info_lines(meta, self.key_path)
        if not lines or "," not in lines[0]:
            return super()._pairs_from_meta_info(meta)
        pairs = []
        for n, line in enumerate(lines, 1):
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != 2 or not all(parts):
                raise DataError(f"{self.key_path}.meta_info: line {n} of '{meta}' is {line!r}; expected "
                                "'<gt path>, <lq path>' (Real-ESRGAN's pair format)")
            pairs.append((parts[0], parts[1]))
        _check_files_exist(self.gt_root, [p[0] for p in pairs], "GT", self.key_path)
        _check_files_exist(self.lq_root, [p[1] for p in pairs], "LQ", self.key_path)
        return pairs


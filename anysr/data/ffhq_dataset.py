"""``FFHQDataset``: BasicSR's dataset of whole face images for StyleGAN2 (no LQ, no crop).

Per sample: read the image, flip it horizontally with probability 1/2 (``use_hflip``; the draw comes from the
sample's counter-based seed, so it does not depend on the worker count, the rank split or the resume point),
normalise it by ``mean`` / ``std`` (BasicSR's files: 0.5 / 0.5, so images in [-1, 1]). Items:
``{'gt', 'gt_path'}``.

Unlike BasicSR, a folder is listed (sorted; BasicSR assumes FFHQ's 70,000 names ``00000000.png`` ...
``00069999.png``, so the same files in the same order for FFHQ itself), and every image must have one size (the
generator's ``out_size``): checked for every image before training starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from anysr.data.file_backends import build_backend
from anysr.data.paired_image_dataset import _Pair
from anysr.data.realesrgan_dataset import GTImageDataset
from anysr.data.transforms import augment
from anysr.registry import DATASET_REGISTRY

__all__ = ["FFHQDataset"]

_TAG_FLIP = 7  # the flip stream of a sample's seed


@DATASET_REGISTRY.register()
class FFHQDataset(GTImageDataset):
    """Whole images of one size for unconditional GANs (``StyleGAN2Model``).

    Options (BasicSR's): dataroot_gt (a folder, an .lmdb or a shard set), meta_info_file, io_backend, use_hflip,
    mean, std.
    """

    role = "image_source"  # images alone: no LQ, no crop (the options pair it with generative models)

    def __init__(self, opt: Mapping[str, Any], key_path: str | None = None) -> None:
        super().__init__(opt, key_path)
        self.gt_root = os.fspath(opt["dataroot_gt"])
        self.gt_backend = build_backend(self.io_type, self.gt_root, self.io_opt)
        self.items = [_Pair(n, None) for n in self._names_from(self.gt_root, self.gt_backend, "GT")]
        self.use_hflip = bool(opt["use_hflip"])
        self._sizes: dict[int, tuple[int, int]] = {}

    def _check_item(self, i: int, decode: bool) -> str | None:
        name = self.items[i].gt
        assert name is not None
        info = self._info(self.gt_backend, name, decode)
        self._sizes[i] = (info.width, info.height)
        return None

    def check(self, *, decode: bool, progress: bool = True) -> list[str]:
        """As every dataset's, and every image of the first one's size (a batch stacks them)."""
        self._sizes = {}
        problems = super().check(decode=decode, progress=progress)
        sizes = {s for s in self._sizes.values()}
        if len(sizes) > 1:
            first = self._sizes[min(self._sizes)]
            odd = next(i for i in sorted(self._sizes) if self._sizes[i] != first)
            problems.append(f"{self.key_path}: {type(self).__name__} needs images of one size (the generator's "
                            f"out_size); {self.path(min(self._sizes))} is {first[0]}x{first[1]} but "
                            f"{self.path(odd)} is {self._sizes[odd][0]}x{self._sizes[odd][1]} ({len(sizes)} sizes "
                            "in all); resize them first")
        return problems

    def __getitem__(self, index: Any) -> dict[str, Any]:
        i, seed, img = self._read_gt(index)
        img = augment(img, self.use_hflip, False, np.random.default_rng([seed, _TAG_FLIP]))
        return {"gt": self._to_tensor(np.ascontiguousarray(img)), "gt_path": self.path(i)}

"""``BSRGANDataset``: HR images degraded in the loader workers by BSRGAN's degradation models (KAIR's
``DatasetBlindSR``, with its keys ``degradation_type``, ``shuffle_prob``, ``use_sharp``).

Per sample: read the GT, flip / rotate it, reflect-pad it to ``degrade_size`` (KAIR's ``H_size``; default
``gt_size``) when smaller and crop a random ``degrade_size`` square when larger, then degrade it with the
registered pipeline (:mod:`anysr.data.degradation.bsrgan`) and crop the ``gt_size`` / ``gt_size // scale`` pair.
Every random draw comes from the sample's seed (the sampler's counter-based ``(seed, epoch, position)`` seed;
``ds[i]`` means seed ``i``), so the pairs do not depend on the worker count, the rank split or the resume point.
Items: ``{'lq', 'gt', 'lq_path', 'gt_path', 'seed', 'bits'}`` with fixed shapes (what XLA wants); any SR model
trains on it. A 16-bit GT stays 16-bit (``bits`` 16); the LQ ends on 8-bit levels (the final JPEG). Unlike KAIR,
images smaller than ``degrade_size`` are reflect-padded (KAIR replaces them by a random flat colour).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from anysr.data.degradation.bsrgan import BSRGANDraws, BSRGANPipeline, draw_rng, settings_from_options
from anysr.data.file_backends import build_backend
from anysr.data.paired_image_dataset import _Pair, image_bits
from anysr.data.realesrgan_dataset import GTImageDataset, pad_or_crop
from anysr.data.transforms import augment, img2tensor
from anysr.registry import DATASET_REGISTRY, DEGRADATION_REGISTRY

__all__ = ["BSRGANDataset"]

_TAG_IMAGE = 0  # the geometry stream of a sample's seed (the recipe has its own: draw_rng)


@DATASET_REGISTRY.register()
class BSRGANDataset(GTImageDataset):
    """HR images -> (LQ, GT) pairs by BSRGAN's degradation (``degradation_type``: bsrgan or bsrgan_plus).

    Options: dataroot_gt (a folder or an .lmdb), meta_info, io_backend, use_hflip, use_rot, gt_size, and the
    BSRGAN keys degradation_type, degrade_size, shuffle_prob, use_sharp (see docs/realworld.md).
    """

    role = "degradation_source"  # HR images only: the options check its keys (anysr.options.bsrgan)

    def __init__(self, opt: Mapping[str, Any], key_path: str | None = None) -> None:
        super().__init__(opt, key_path)
        self.gt_root = os.fspath(opt["dataroot_gt"])
        self.gt_backend = build_backend(self.io_type, self.gt_root)
        self.items = [_Pair(n, None) for n in self._names_from(self.gt_root, self.gt_backend, "GT")]
        self.settings = settings_from_options(opt)
        self.pipeline: BSRGANPipeline = DEGRADATION_REGISTRY.get(str(opt["degradation_type"]),
                                                                 f"{self.key_path}.degradation_type")(self.settings)
        self.use_hflip = bool(opt["use_hflip"])
        self.use_rot = bool(opt["use_rot"])

    def draws(self, seed: int) -> BSRGANDraws:
        """The recipe sample ``seed`` degrades its image with."""
        size = int(self.settings.degrade_size or self.settings.gt_size)
        return self.pipeline.draw(draw_rng(seed), (size, size))

    def degradation_record(self, seed: int) -> dict[str, Any]:
        """The recipe of sample ``seed`` as plain data (what ``anysr prepare degrade`` writes to degrade.json)."""
        return {"type": self.pipeline.name, **self.draws(seed).as_dict()}

    def __getitem__(self, index: Any) -> dict[str, Any]:
        i, seed, img = self._read_gt(index)
        rng = np.random.default_rng([seed, _TAG_IMAGE])
        img = augment(img, self.use_hflip, self.use_rot, rng)
        img = pad_or_crop(img, int(self.settings.degrade_size or self.settings.gt_size), rng)
        out = self.pipeline(img2tensor(img, gray_to_rgb=True), seed)
        path = self.path(i)
        return {"lq": out["lq"], "gt": out["gt"], "lq_path": path, "gt_path": path, "seed": seed,
                "bits": image_bits(img)}

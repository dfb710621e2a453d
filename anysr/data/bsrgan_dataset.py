"""``BSRGANDataset``: HR images degraded in the loader workers by BSRGAN's degradation models (KAIR's
``DatasetBlindSR``, with its keys ``degradation_type``, ``shuffle_prob``, ``use_sharp``).

Per sample: read the GT, flip / rotate it, reflect-pad it to ``degrade_size`` (KAIR's ``H_size``; default
``gt_size``) when smaller and crop a random ``degrade_size`` square when larger, then degrade it with the
registered pipeline (:mod:`anysr.data.degradation.bsrgan`) and crop the ``gt_size`` / ``gt_size // scale`` pair.
Every random draw comes from the sample's seed (the sampler's counter-based ``(seed, epoch, position)`` seed;
``ds[i]`` means seed ``i``), so the pairs do not depend on the worker count, the rank split or the resume point.
Items: ``{'lq', 'gt', 'lq_path', 'gt_path', 'seed', 'bits'}`` with fixed shapes (what XLA wants); any SR model
trains on it. With ``degrade_in: step`` the items hold the augmented ``degrade_size`` HR square (``hr``) instead,
and the trainer degrades each batch on the device with :class:`BSRGANStepSynthesis` (the same recipes and fields).
A 16-bit GT stays 16-bit (``bits`` 16); the LQ ends on 8-bit levels (the final JPEG). Unlike KAIR,
images smaller than ``degrade_size`` are reflect-padded (KAIR replaces them by a random flat colour).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from anysr.data.degradation.bsrgan import BSRGANDraws, BSRGANPipeline, draw_rng, settings_from_options
from anysr.data.file_backends import build_backend
from anysr.data.paired_image_dataset import _Pair, image_bits
from anysr.data.realesrgan_dataset import GTImageDataset, pad_or_crop
from anysr.data.transforms import augment, img2tensor
from anysr.errors import DataError, OptionError
from anysr.registry import DATASET_REGISTRY, DEGRADATION_REGISTRY

__all__ = ["BSRGANDataset", "BSRGANStepSynthesis"]

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
        self.gt_backend = build_backend(self.io_type, self.gt_root, self.io_opt)
        self.items = [_Pair(n, None) for n in self._names_from(self.gt_root, self.gt_backend, "GT")]
        self.settings = settings_from_options(opt)
        self.pipeline: BSRGANPipeline = DEGRADATION_REGISTRY.get(str(opt["degradation_type"]),
                                                                 f"{self.key_path}.degradation_type")(self.settings)
        self.use_hflip = bool(opt["use_hflip"])
        self.use_rot = bool(opt["use_rot"])
        self.degrade_in = str(opt.get("degrade_in") or "auto")
        self.in_step = False  # set by place_synthesis before the loader starts its workers

    def place_synthesis(self, static_shapes: bool) -> BSRGANStepSynthesis | None:
        """Where the degradation runs, told by the trainer before the loader starts: with ``degrade_in: step``
        the stage it applies to every batch on the device; else None (the loader workers degrade; ``auto``).
        ``static_shapes``: the accelerator compiles a graph per shape (XLA), where step is refused."""
        if self.degrade_in != "step":
            return None
        if static_shapes:
            raise OptionError(f"{self.key_path}.degrade_in: step would compile a new graph for every recipe's "
                              "intermediate sizes on this accelerator; use degrade_in: loader (or auto)")
        self.in_step = True
        return BSRGANStepSynthesis(self.pipeline)

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
        path = self.path(i)
        item = {"lq_path": path, "gt_path": path, "seed": seed, "bits": image_bits(img)}
        if self.in_step:
            return {"hr": img2tensor(img, gray_to_rgb=True), **item}
        out = self.pipeline(img2tensor(img, gray_to_rgb=True), seed)
        return {"lq": out["lq"], "gt": out["gt"], **item}


class BSRGANStepSynthesis:
    """``degrade_in: step``: a batch of HR squares (``hr``, on any device) -> its ``lq`` / ``gt`` pairs, each sample
    degraded by the recipe of its seed as :class:`BSRGANDataset` would in a loader worker (the random fields come
    from the CPU generator of that seed; OpenCV's JPEG crosses to the host and back)."""

    def __init__(self, pipeline: BSRGANPipeline) -> None:
        self.pipeline = pipeline

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        if "hr" not in batch or "seed" not in batch:
            raise DataError("BSRGAN's step synthesis expects a BSRGANDataset batch (hr, seed); this one has "
                            f"{', '.join(sorted(batch))}")
        hr, seeds = batch["hr"], [int(s) for s in batch["seed"]]
        pairs = [self.pipeline(hr[k], seed) for k, seed in enumerate(seeds)]
        out = {k: v for k, v in batch.items() if k != "hr"}
        out["lq"] = torch.stack([p["lq"] for p in pairs])
        out["gt"] = torch.stack([p["gt"] for p in pairs])
        return out

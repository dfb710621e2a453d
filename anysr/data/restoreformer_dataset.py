"""RestoreFormer++'s training sets: ``FFHQUnevenDegradationDataset`` (the restoration stage) and ``FFHQAugDataset``
(the HQ dictionary / ROHQD stage: high-quality faces alone).

``FFHQUnevenDegradationDataset`` is :class:`~anysr.data.ffhq_degradation_dataset.FFHQDegradationDataset` (GFPGAN's
faces, component boxes, counter-based recipes; ``ds[i]`` means seed ``i``) with the authors' additions
(:mod:`anysr.data.degradation.restoreformer`): the GT's exposure and shift (the boxes move with it), two branches
pasted together (uneven), haze and a ``[low, high]`` blur kernel size. With every addition off it is the authors'
``FFHQDegradationDataset`` of RestoreFormer (a kernel size range, otherwise GFPGAN's). Items: ``{'lq', 'gt',
'gt_path', 'seed'}`` plus the three boxes with ``crop_components``.

``FFHQAugDataset`` gives ``{'gt', 'gt_path', 'seed'}``: the face flipped, exposed, shifted and (``gray_prob``) turned
gray, as the authors' set does (their model's ``image_key: gt`` reads no LQ).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from anysr.data.degradation.restoreformer import (
    FaceAugmentDraws,
    UnevenDegradationDraws,
    UnevenDegradationSettings,
    augment_gray,
    degrade_uneven,
    draw_face_augment,
    draw_uneven_degradation,
    expose_and_shift,
)
from anysr.data.ffhq_dataset import FFHQDataset
from anysr.data.ffhq_degradation_dataset import FFHQDegradationDataset, _float_bgr
from anysr.data.transforms import img2tensor, normalize
from anysr.registry import DATASET_REGISTRY

__all__ = ["FFHQUnevenDegradationDataset", "FFHQAugDataset"]

_TAG_UNEVEN = 10  # the recipe stream of a sample's seed
_TAG_AUGMENT = 11


@DATASET_REGISTRY.register()
class FFHQUnevenDegradationDataset(FFHQDegradationDataset):
    """Face images -> same-size (LQ, GT) pairs by RestoreFormer++'s degradation, with facial component boxes.

    Options: FFHQDegradationDataset's (``blur_kernel_size`` an odd int or the authors' ``[low, high]``), plus
    exposure_prob, exposure_range, shift_prob, shift_unit, shift_max_num, uneven_prob, hazy_prob, hazy_alpha (see
    docs/realworld.md).
    """

    role = "uneven_face_degradation_source"  # the options check its keys (options.ffhq_degradation)

    def __init__(self, opt: Mapping[str, Any], key_path: str | None = None) -> None:
        self.uneven = UnevenDegradationSettings.from_options(opt)
        super().__init__({**opt, "blur_kernel_size": self.uneven.face.blur_kernel_size}, key_path)
        self.settings = self.uneven.face

    def draws(self, seed: int) -> UnevenDegradationDraws:  # type: ignore[override]
        """The recipe sample ``seed`` is augmented and degraded with."""
        rng = np.random.default_rng([int(seed), _TAG_UNEVEN])
        return draw_uneven_degradation(rng, self.uneven, self.out_size, use_hflip=self.use_hflip)

    def degradation_record(self, seed: int) -> dict[str, Any]:
        """The recipe of sample ``seed`` as plain data (what ``anysr prepare degrade`` writes to degrade.json)."""
        return {"type": "restoreformer", **self.draws(seed).as_dict()}

    def shifted_locations(self, i: int, draws: UnevenDegradationDraws) -> dict[str, torch.Tensor]:
        """Item ``i``'s boxes, mirrored with the flip and moved with the shift (the authors' float32 steps: the
        padding added, then the crop's offset taken off)."""
        boxes = self.component_locations(i, draws.hflip)
        shift = draws.augment.shift
        if shift is None:
            return boxes
        pad, unit = self.uneven.shift_pad, self.uneven.shift_unit
        offset = torch.tensor([unit * shift[1], unit * shift[0]] * 2, dtype=torch.float32)
        return {k: (b + pad) - offset for k, b in boxes.items()}

    def make_item(self, i: int, draws: UnevenDegradationDraws) -> dict[str, Any]:  # type: ignore[override]
        """Item ``i`` made with the recipe ``draws``: ``lq``, ``gt``, ``gt_path`` and, with crop_components, the
        three boxes."""
        gt = expose_and_shift(self.face(i, draws.hflip), draws.augment, self.uneven)
        out = self.pair_item(i, *degrade_uneven(gt, draws, self.uneven))
        if self.locations is not None:
            out.update(self.shifted_locations(i, draws))
        return out


@DATASET_REGISTRY.register()
class FFHQAugDataset(FFHQDataset):
    """High-quality faces with RestoreFormer++'s augmentations (its HQ dictionary / ROHQD stage): no LQ.

    Options (the authors'): dataroot_gt, meta_info_file, io_backend, use_hflip, mean, std, out_size (optional here:
    every face must have that side; the authors' code does not read it), gray_prob (the face turns gray), exposure_prob,
    exposure_range, shift_prob, shift_unit, shift_max_num.
    """

    augments_faces = True  # FFHQDataset's role (images alone, no LQ); its keys: face_augment_dataset_rule

    def __init__(self, opt: Mapping[str, Any], key_path: str | None = None) -> None:
        super().__init__(opt, key_path)
        self.out_size = None if opt.get("out_size") is None else int(opt["out_size"])
        self.gray_prob = opt.get("gray_prob")
        self.settings = UnevenDegradationSettings.from_options(opt)

    def _check_item(self, i: int, decode: bool) -> str | None:
        """FFHQDataset's check (every face one size), and that size ``out_size`` when it is set (a face of another
        size is then named once, here)."""
        problem = super()._check_item(i, decode)
        width, height = self._sizes.get(i, (self.out_size, self.out_size))
        if problem is None and self.out_size is not None and (width, height) != (self.out_size, self.out_size):
            del self._sizes[i]
            return (f"{self.path(i)} is {width}x{height}; {type(self).__name__} needs out_size x out_size "
                    f"({self.out_size}x{self.out_size}) faces: resize them or change out_size")
        return problem

    def draws(self, seed: int) -> tuple[FaceAugmentDraws, bool]:
        """Sample ``seed``'s augmentation and gray coin, drawn in the authors' order (flip, exposure, shift, gray)."""
        rng = np.random.default_rng([int(seed), _TAG_AUGMENT])
        augment = draw_face_augment(rng, self.settings, use_hflip=self.use_hflip)
        gray = self.gray_prob is not None and bool(rng.random() < self.gray_prob)
        return augment, gray

    def make_item(self, i: int, draws: tuple[FaceAugmentDraws, bool]) -> dict[str, Any]:
        """Item ``i`` augmented with ``draws``: ``gt`` and ``gt_path``."""
        augment, gray = draws
        _, _, img = self._read_gt(i)
        gt = _float_bgr(img, self.path(i))
        if augment.hflip:
            gt = np.ascontiguousarray(gt[:, ::-1])
        gt = expose_and_shift(gt, augment, self.settings)
        if gray:
            gt = augment_gray(gt)
        t = img2tensor(gt)
        if self.norm is not None:
            t = normalize(t, *self.norm)
        return {"gt": t, "gt_path": self.path(i)}

    def __getitem__(self, index: Any) -> dict[str, Any]:
        i, seed = self._split_index(index)
        seed = i if seed is None else seed
        return {**self.make_item(i, self.draws(seed)), "seed": seed}

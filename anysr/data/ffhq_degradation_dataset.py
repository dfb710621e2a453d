"""``FFHQDegradationDataset``: GFPGAN's training set, whole face images degraded in the loader workers.

Per sample: read the GT face (every image ``out_size`` x ``out_size``; checked before training), draw the sample's
recipe from its counter-based seed (:func:`anysr.data.degradation.gfpgan.draw_face_degradation`: the flip and every
degradation value, so the pairs do not depend on the worker count, the rank split or the resume point; ``ds[i]``
means seed ``i``), flip, degrade (:func:`~anysr.data.degradation.gfpgan.degrade_face`) and, when ``mean`` / ``std``
are set, normalise both images (GFPGAN's files: 0.5 / 0.5, so in [-1, 1]; without them, in [0, 1]). The LQ has the
GT's size (scale 1).

With ``crop_components``, ``component_path`` is GFPGAN's landmarks file (``FFHQ_eye_mouth_landmarks_512.pth``: image
name -> ``{left_eye, right_eye, mouth}``, each ``[centre x, centre y, half side]``), read with
``torch.load(weights_only=True)`` (the numpy scalars and arrays it holds allowed, nothing else), and each item has
``loc_left_eye`` / ``loc_right_eye`` / ``loc_mouth``: ``[x1, y1, x2, y2]`` float32 boxes (eyes enlarged by
``eye_enlarge_ratio``), mirrored with the image (the eyes swap). Items: ``{'lq', 'gt', 'gt_path', 'seed'}`` plus the
three boxes. Unlike GFPGAN, an image's landmarks are looked up by its name without extension (GFPGAN: by its index,
``f'{index:08d}'``, the same for FFHQ's 70,000 sorted names), every name is checked when the dataset is built, and a
flip does not alter the loaded table (GFPGAN's swaps it in place, so a worker's later samples read mirrored boxes).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from anysr.data.degradation.gfpgan import (
    FaceDegradationDraws,
    FaceDegradationSettings,
    degrade_face,
    draw_face_degradation,
)
from anysr.data.degradation.kernels import KERNEL_TYPES
from anysr.data.file_backends import build_backend
from anysr.data.paired_image_dataset import _Pair
from anysr.data.realesrgan_dataset import GTImageDataset
from anysr.data.transforms import normalize
from anysr.errors import DataError
from anysr.registry import DATASET_REGISTRY

__all__ = ["FFHQDegradationDataset", "COMPONENTS", "load_component_table", "component_array",
           "check_components_inside"]

COMPONENTS = ("left_eye", "right_eye", "mouth")  # GFPGAN's facial components, in its order
_TAG_DRAWS = 8  # the recipe stream of a sample's seed


def _numpy_globals() -> list[Any]:
    """Exactly what rebuilds numpy scalars and arrays in a pickle, under numpy 1's and numpy 2's module names."""
    try:
        from numpy._core.multiarray import _reconstruct, scalar  # noqa: PLC0415 - moved in numpy 2
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct, scalar  # noqa: PLC0415 - moved in numpy 2
    return [scalar, (scalar, "numpy.core.multiarray.scalar"), _reconstruct,
            (_reconstruct, "numpy.core.multiarray._reconstruct"), np.ndarray, np.dtype,
            *{type(np.dtype(t)) for t in (np.float64, np.float32, np.int64, np.int32)}]


def _load_error(exc: Exception) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    unsupported = next((ln for ln in lines if "Unsupported" in ln), "")
    if unsupported:
        return ("it holds objects other than numbers, lists, dicts, tensors and numpy arrays ["
                + unsupported.replace("WeightsUnpickler error: ", "").split(". Please use")[0] + "]")
    first = lines[0].split(". ")[0] if lines else "unreadable"  # torch's advice after the first sentence: noise
    return f"{type(exc).__name__}: {first[:200]}"


def load_component_table(path: str | os.PathLike[str], where: str) -> Mapping[str, Any]:
    """GFPGAN's landmarks file read safely (``torch.load(weights_only=True)``); a DataError naming ``where`` and the
    file when it is missing, unreadable or not a mapping."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{where}: '{p}' does not exist; give GFPGAN's landmarks file (FFHQ_eye_mouth_landmarks_512"
                        ".pth) or set crop_components: false")
    try:
        with torch.serialization.safe_globals(_numpy_globals()):
            table = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickler or archive failure means an unusable file
        raise DataError(f"{where}: '{p}' cannot be read as facial component locations ({_load_error(exc)}); "
                        "give GFPGAN's landmarks file (a torch .pth: image name -> {left_eye, right_eye, mouth})"
                        ) from None
    if not isinstance(table, Mapping):
        raise DataError(f"{where}: '{p}' holds a {type(table).__name__}; expected a mapping of image name -> "
                        "{left_eye, right_eye, mouth}")
    return table


def component_array(table: Mapping[str, Any], names: Sequence[str], path: str | os.PathLike[str],
                    where: str) -> np.ndarray:
    """The (len(names), 3, 3) float64 ``[centre x, centre y, half side]`` of each name's left eye, right eye and mouth;
    a DataError naming the file and the key that is missing or malformed."""
    missing = [n for n in names if n not in table]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise DataError(f"{where}: '{path}' has no entry '{missing[0]}'{more}; its keys must be the image names "
                        f"without extension ({len(table)} keys, e.g. {next(iter(table), 'none')!r})")
    out = np.empty((len(names), len(COMPONENTS), 3), dtype=np.float64)
    for i, name in enumerate(names):
        entry = table[name]
        for j, part in enumerate(COMPONENTS):
            value = entry.get(part) if isinstance(entry, Mapping) else None
            try:
                arr = np.asarray(value.numpy() if isinstance(value, torch.Tensor) else value, dtype=np.float64)
            except (TypeError, ValueError):
                arr = np.empty(0)
            if arr.size != 3 or not np.all(np.isfinite(arr)):
                raise DataError(f"{where}: '{path}' entry '{name}' {part} is {value!r}; expected "
                                "[centre x, centre y, half side]")
            out[i, j] = arr.reshape(3)
    return out


def check_components_inside(locations: np.ndarray, names: Sequence[str], out_size: int,
                            path: str | os.PathLike[str], where: str) -> None:
    """A DataError naming the first entry of ``locations`` (``component_array``'s) whose centre lies outside the
    ``out_size`` face or whose half side is not positive: RoIAlign would crop nothing of the face there, and the
    component discriminators would train on empty crops."""
    centres, halves = locations[..., :2], locations[..., 2]
    bad = ((centres < 0) | (centres > out_size)).any(-1) | (halves <= 0)
    if not bad.any():
        return
    i, j = (int(k) for k in np.argwhere(bad)[0])
    x, y, half = (float(v) for v in locations[i, j])
    raise DataError(f"{where}: '{path}' entry '{names[i]}' {COMPONENTS[j]} is [{x:g}, {y:g}, {half:g}], not a box "
                    f"inside the {out_size}x{out_size} face ({int(bad.sum())} such boxes); every centre must lie in "
                    "the face and every half side be > 0: give the landmarks of these faces at out_size (GFPGAN's "
                    "file is for 512-pixel FFHQ faces)")


def _float_bgr(img: np.ndarray, path: str) -> np.ndarray:
    """A read image as HWC float32 BGR in [0, 1] (gray repeated to three channels; 16-bit kept)."""
    if img.ndim == 2:
        img = np.repeat(img[:, :, None], 3, axis=2)
    if img.ndim != 3 or img.shape[2] != 3:
        raise DataError(f"{path}: expected a gray or colour image, got shape {img.shape}")
    return img.astype(np.float32) / np.float32(65535.0 if img.dtype == np.uint16 else 255.0)


@DATASET_REGISTRY.register()
class FFHQDegradationDataset(GTImageDataset):
    """Face images -> same-size (LQ, GT) pairs by GFPGAN's degradation, with facial component boxes.

    Options (GFPGAN's): dataroot_gt (a folder, an .lmdb or a shard set), meta_info_file, io_backend, use_hflip,
    mean, std, out_size, blur_kernel_size, kernel_list, kernel_prob, blur_sigma, downsample_range, noise_range,
    jpeg_range, color_jitter_prob, color_jitter_shift, color_jitter_pt_prob, brightness, contrast, saturation, hue,
    gray_prob, gt_gray, crop_components, component_path, eye_enlarge_ratio (see docs/realworld.md).
    """

    role = "face_degradation_source"  # GT faces only, degraded here: the options check its keys (options.ffhq_...)
    kernel_types = KERNEL_TYPES  # the kernel_list kinds it draws (the options check them)

    def __init__(self, opt: Mapping[str, Any], key_path: str | None = None) -> None:
        super().__init__(opt, key_path)
        self.gt_root = os.fspath(opt["dataroot_gt"])
        self.gt_backend = build_backend(self.io_type, self.gt_root, self.io_opt)
        self.items = [_Pair(n, None) for n in self._names_from(self.gt_root, self.gt_backend, "GT")]
        self.out_size = int(opt["out_size"])
        self.use_hflip = bool(opt["use_hflip"])
        self.settings = FaceDegradationSettings.from_options(opt)
        self.eye_enlarge_ratio = float(opt["eye_enlarge_ratio"])
        self.locations: np.ndarray | None = None
        if opt["crop_components"]:
            where = f"{self.key_path}.component_path"
            path = os.fspath(opt["component_path"])
            names = [os.path.splitext(p.gt or "")[0] for p in self.items]
            self.locations = component_array(load_component_table(path, where), names, path, where)
            check_components_inside(self.locations, names, self.out_size, path, where)

    def _check_item(self, i: int, decode: bool) -> str | None:
        name = self.items[i].gt
        assert name is not None
        info = self._info(self.gt_backend, name, decode)
        if (info.width, info.height) != (self.out_size, self.out_size):
            return (f"{self.path(i)} is {info.width}x{info.height}; {type(self).__name__} needs out_size x out_size "
                    f"({self.out_size}x{self.out_size}) faces: resize them or change out_size")
        return None

    def draws(self, seed: int) -> FaceDegradationDraws:
        """The recipe sample ``seed`` is flipped and degraded with."""
        rng = np.random.default_rng([int(seed), _TAG_DRAWS])
        return draw_face_degradation(rng, self.settings, use_hflip=self.use_hflip)

    def degradation_record(self, seed: int) -> dict[str, Any]:
        """The recipe of sample ``seed`` as plain data (what ``anysr prepare degrade`` writes to degrade.json)."""
        return {"type": "gfpgan", **self.draws(seed).as_dict()}

    def component_locations(self, i: int, hflip: bool) -> dict[str, torch.Tensor]:
        """Item ``i``'s ``loc_left_eye`` / ``loc_right_eye`` / ``loc_mouth`` boxes ``[x1, y1, x2, y2]`` (float32),
        mirrored (``x -> out_size - x``, eyes swapped) when the image is flipped; GFPGAN's box arithmetic."""
        if self.locations is None:
            raise DataError(f"{self.key_path}: crop_components is false; there are no component locations")
        parts = self.locations[i]
        if hflip:
            parts = parts[[1, 0, 2]].copy()
            parts[:, 0] = self.out_size - parts[:, 0]
        half = parts[:, 2] * np.array([self.eye_enlarge_ratio, self.eye_enlarge_ratio, 1.0])
        boxes = np.stack([parts[:, 0] - half + 1, parts[:, 1] - half + 1, parts[:, 0] + half, parts[:, 1] + half], 1)
        return {f"loc_{part}": torch.from_numpy(boxes[j]).float() for j, part in enumerate(COMPONENTS)}

    def face(self, i: int, hflip: bool) -> np.ndarray:
        """Item ``i``'s GT face as HWC float32 BGR, checked to be ``out_size`` square, mirrored with ``hflip``."""
        _, _, img = self._read_gt(i)
        path = self.path(i)
        gt = _float_bgr(img, path)
        if gt.shape[:2] != (self.out_size, self.out_size):
            raise DataError(f"{path} is {gt.shape[1]}x{gt.shape[0]}; {type(self).__name__} needs out_size x out_size "
                            f"({self.out_size}x{self.out_size}) faces: resize them or change out_size")
        return np.ascontiguousarray(gt[:, ::-1]) if hflip else gt

    def pair_item(self, i: int, lq: torch.Tensor, gt: torch.Tensor) -> dict[str, Any]:
        """``{'lq', 'gt', 'gt_path'}`` of item ``i``, both images normalised by ``mean`` / ``std`` when set."""
        if self.norm is not None:
            lq, gt = normalize(lq, *self.norm), normalize(gt, *self.norm)
        return {"lq": lq, "gt": gt, "gt_path": self.path(i)}

    def make_item(self, i: int, draws: FaceDegradationDraws) -> dict[str, Any]:
        """Item ``i`` made with the recipe ``draws`` (``ds[i]`` uses its seed's recipe): ``lq``, ``gt``, ``gt_path``
        and, with crop_components, the three boxes."""
        lq, gt_t = degrade_face(self.face(i, draws.hflip), draws, self.settings)
        out = self.pair_item(i, lq, gt_t)
        if self.locations is not None:
            out.update(self.component_locations(i, draws.hflip))
        return out

    def __getitem__(self, index: Any) -> dict[str, Any]:
        i, seed = self._split_index(index)
        seed = i if seed is None else seed
        return {**self.make_item(i, self.draws(seed)), "seed": seed}

"""Datasets of (LQ, GT) image pairs and of single LQ images, with BasicSR's option names.

Items are addressed by ``ds[i]`` or ``ds[(i, seed)]``: in the train phase the random crop and flips use
``np.random.default_rng(seed)`` only (``ds[i]`` means seed ``i``), so a sample depends on nothing but
(index, seed) - not on worker count, process or resume point. Val/test items are whole images.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from tqdm import tqdm

from anysr.data.degradation.bicubic import bicubic_degrade, bicubic_degrade_window
from anysr.data.file_backends import (
    BACKEND_TYPES,
    DiskBackend,
    FileBackend,
    LmdbBackend,
    build_backend,
    check_pixel_type,
    is_image_file,
)
from anysr.data.imageio import IMAGE_EXTENSIONS, ImageInfo, probe_bytes, probe_image, subfolder_hint
from anysr.data.transforms import (
    augment,
    bgr_to_y,
    img2tensor,
    lq_patch_size,
    match_gt_to_lq,
    mod_crop,
    normalize,
    paired_random_crop,
    random_crop_origin,
)
from anysr.errors import DataError
from anysr.registry import DATASET_REGISTRY

PHASES = ("train", "val", "test")
_MAX_LISTED = 10
_BAR_FROM = 500  # start-up checks of sets this large show a progress bar


def image_bits(img: np.ndarray) -> int:
    """The depth of a decoded image: 16 for uint16 pixels, else 8."""
    return 16 if img.dtype == np.uint16 else 8


def _listing(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_MAX_LISTED])
    more = len(names) - _MAX_LISTED
    return shown + (f" ... and {more} more" if more > 0 else "")


def meta_info_lines(meta_file: str, key_path: str) -> list[str]:
    """The non-blank lines of a meta info file, stripped (a UTF-8 BOM dropped); a DataError naming the file when it
    is missing or not UTF-8 text."""
    if not os.path.isfile(meta_file):
        raise DataError(f"{key_path}.meta_info_file: '{meta_file}' not found; fix the path or remove the "
                        "option to list the folder instead")
    try:
        with open(meta_file, encoding="utf-8-sig") as f:
            return [line.strip() for line in f if line.strip()]
    except UnicodeDecodeError as exc:
        raise DataError(f"{key_path}.meta_info_file: '{meta_file}' is not UTF-8 text (byte {exc.start} of a line); "
                        "re-create it (one image name per line)") from None


def _meta_info_names(meta_file: str, key_path: str) -> list[str]:
    names = [line.split()[0] for line in meta_info_lines(meta_file, key_path)]
    if not names:
        raise DataError(f"{key_path}.meta_info_file: '{meta_file}' lists no images")
    return names


def _check_files_exist(root: str, names: Sequence[str], what: str, key_path: str) -> None:
    missing = [n for n in names if not os.path.isfile(os.path.join(root, n))]
    if missing:
        raise DataError(f"{key_path}: {len(missing)} {what} image(s) listed but not found in '{root}': "
                        f"{_listing(missing)}")


def paired_names_from_folder(gt_root: str, lq_root: str, filename_tmpl: str = "{}",
                             key_path: str = "dataset") -> list[tuple[str, str]]:
    """(GT name, LQ name) pairs matched by stem: the LQ stem is ``filename_tmpl.format(GT stem)``.

    Any image extension is accepted on either side. A GT without its LQ, or an LQ without its GT, is a
    DataError listing the unmatched names.
    """
    gt_names = [n for n in sorted(os.listdir(gt_root)) if is_image_file(n) and
                os.path.isfile(os.path.join(gt_root, n))]
    lq_names = [n for n in sorted(os.listdir(lq_root)) if is_image_file(n) and
                os.path.isfile(os.path.join(lq_root, n))]
    if not gt_names:
        raise DataError(f"{key_path}.dataroot_gt: no images ({', '.join(IMAGE_EXTENSIONS)}) in '{gt_root}'"
                        f"{subfolder_hint(gt_root)}")
    lq_by_stem: dict[str, str] = {}
    for n in lq_names:
        stem = os.path.splitext(n)[0]
        if stem in lq_by_stem:
            raise DataError(f"{key_path}.dataroot_lq: '{lq_root}' holds two images with stem '{stem}': "
                            f"{lq_by_stem[stem]} and {n}; keep one")
        lq_by_stem[stem] = n
    pairs, no_lq = [], []
    for n in gt_names:
        want = filename_tmpl.format(os.path.splitext(n)[0])
        if want in lq_by_stem:
            pairs.append((n, lq_by_stem.pop(want)))
        else:
            no_lq.append(f"{n} (expected LQ '{want}.*')")
    if no_lq or lq_by_stem:
        parts = []
        if no_lq:
            parts.append(f"{len(no_lq)} GT image(s) in '{gt_root}' have no LQ in '{lq_root}': "
                         f"{_listing(no_lq)}")
        if lq_by_stem:
            parts.append(f"{len(lq_by_stem)} LQ image(s) in '{lq_root}' have no GT: "
                         f"{_listing(sorted(lq_by_stem.values()))}")
        raise DataError(f"{key_path}: unmatched image pairs (filename_tmpl '{filename_tmpl}'): "
                        + "; ".join(parts) + ". Fix the file names or set filename_tmpl.")
    return pairs


def paired_names_from_meta_info(meta_file: str, gt_root: str, lq_root: str, filename_tmpl: str = "{}",
                                key_path: str = "dataset") -> list[tuple[str, str]]:
    """(GT name, LQ name) pairs from a meta info file whose lines start with the GT file name.

    The LQ name is ``filename_tmpl.format(GT stem)`` plus the GT's extension (as BasicSR); every listed
    file must exist.
    """
    gt_names = _meta_info_names(meta_file, key_path)
    pairs = []
    for n in gt_names:
        stem, ext = os.path.splitext(n)
        pairs.append((n, filename_tmpl.format(stem) + ext))
    _check_files_exist(gt_root, [p[0] for p in pairs], "GT", key_path)
    _check_files_exist(lq_root, [p[1] for p in pairs], "LQ", key_path)
    return pairs


def paired_keys_from_lmdb(gt: FileBackend, lq: FileBackend,
                          key_path: str = "dataset") -> list[tuple[str, str]]:
    """(key, key) pairs: both LMDBs (or both sides of a shard set) must hold the same keys."""
    gt_keys, lq_keys = gt.keys(), lq.keys()
    if set(gt_keys) != set(lq_keys):
        only_gt = sorted(set(gt_keys) - set(lq_keys))
        only_lq = sorted(set(lq_keys) - set(gt_keys))
        what = "the shard sets" if gt.root != lq.root else "the GT and LQ images of the shard set"
        what = "the LMDBs" if isinstance(gt, LmdbBackend) else what
        raise DataError(
            f"{key_path}: {what} '{gt.root}' and '{lq.root}' hold different keys "
            f"(only in GT: {_listing(only_gt) or '-'}; only in LQ: {_listing(only_lq) or '-'}); rebuild them "
            "from matching folders."
        )
    return [(k, k) for k in gt_keys]


@dataclass(frozen=True)
class _Pair:
    gt: str | None
    lq: str | None


class _ImageDataset(Dataset):
    """Shared option reading and tensor conversion.

    ``opt`` is a dataset section of validated options (``anysr.options``): every key is there with its default,
    and the rules (paths exist, phase, sizes, mean/std) were checked once, by the options.
    """

    backend_types = BACKEND_TYPES  # the io_backend.type values it reads (the options check them)
    keeps_16bit = True  # 16-bit files stay 16-bit (``holds_16bit_images``: precision auto means fp32 for them)

    def __init__(self, opt: Mapping[str, Any], key_path: str | None) -> None:
        self.opt = opt
        self.key_path = key_path or f"datasets.{opt['phase']}"
        self.name = str(opt["name"])
        self._sides: dict[int, int] = {}  # filled by check(): each item's usable GT side
        self.phase = str(opt["phase"])
        self.color = opt["color"]
        self.norm = (list(opt["mean"]), list(opt["std"])) if opt["mean"] is not None else None
        self.io_opt = opt["io_backend"]
        self.io_type = str(self.io_opt["type"])
        self.items: list[_Pair] = []

    def __len__(self) -> int:
        return len(self.items)

    @staticmethod
    def _split_index(index: Any) -> tuple[int, int | None]:
        if isinstance(index, tuple):
            i, seed = index
            return int(i), int(seed)
        return int(index), None

    def _to_tensor(self, img: np.ndarray) -> torch.Tensor:
        if self.color == "y":
            t = img2tensor(bgr_to_y(img))
        else:
            t = img2tensor(img, gray_to_rgb=True)
        if self.norm is not None:
            t = normalize(t, *self.norm)
        return t

    def _path(self, root: str, key: str) -> str:
        return os.path.join(root, key) if self.io_type == "disk" else key

    # ---------------------------------------------------------------- start-up checks
    def check(self, *, decode: bool, progress: bool = True) -> list[str]:
        """Problems that would stop a run later, found now for every item, in parallel (one line each).

        ``decode``: read every image whole (catches corrupt pixel data; for small sets such as validation);
        otherwise only headers are read (size, type, a truncated PNG), fast enough for big training sets.
        """
        def one(i: int) -> str | None:
            try:
                return self._check_item(i, decode)
            except DataError as exc:
                return str(exc)

        self._sides = {}  # each item's usable GT side (_check_item), to suggest a patch size
        with ThreadPoolExecutor(max_workers=8) as pool:
            found = list(tqdm(pool.map(one, range(len(self))), total=len(self), desc=f"check {self.name}",
                              unit="img", disable=not progress or len(self) < _BAR_FROM, leave=False))
        small = [p for p in found if isinstance(p, _TooSmall)]
        # one line per distinct problem: a damaged LMDB or shard set says the same thing for every image
        others = list(dict.fromkeys(str(p) for p in found if p and not isinstance(p, _TooSmall)))
        if len(small) < 2:
            return others + [str(p) for p in small]
        scale = int(getattr(self, "scale", 1))
        fits = (min(self._sides.values()) // scale) * scale if self._sides else 0
        shown = ", ".join(p.name for p in small[:5]) + (f" and {len(small) - 5} more" if len(small) > 5 else "")
        key = f"{self.key_path}.gt_size"
        advice = (f"the largest gt_size every image allows is {fits}: set {key}: {fits} (on the command line: "
                  f"--force_yml {key}={fits}), or remove the small images" if fits >= scale
                  else "remove the small images")
        return [*others, f"{len(small)} of {len(found)} images are smaller than the {small[0].patch}x"
                f"{small[0].patch} GT patch (gt_size) ({shown}); {advice}"]

    def cropped_away(self, border: int) -> list[tuple[str, int]]:
        """After ``check()``: the (GT path, usable side) of the items that a metric's ``crop_border`` of ``border``
        pixels on every side leaves nothing of."""
        return [(self.paths(i)[0], side) for i, side in sorted(self._sides.items()) if side <= 2 * border]

    def _check_item(self, i: int, decode: bool) -> str | None:
        raise NotImplementedError

    @staticmethod
    def _info(backend: FileBackend, key: str, decode: bool) -> ImageInfo:
        if decode:
            img = backend.read(key)  # refuses pixel types training does not read
            return ImageInfo(img.shape[1], img.shape[0], 1 if img.ndim == 2 else img.shape[2], image_bits(img),
                             img.dtype.name)
        if isinstance(backend, DiskBackend):
            return check_pixel_type(probe_image(backend.path_of(key)), backend.describe(key))
        known = backend.header(key)  # a shard index holds every header: nothing is downloaded
        if known is not None:
            return check_pixel_type(known, backend.describe(key))
        return check_pixel_type(probe_bytes(backend.get(key), backend.describe(key)), backend.describe(key))

    def _names_from(self, root: str, backend: FileBackend, what: str) -> list[str]:
        """Image names of one side: from meta_info_file, the LMDB's keys, or the folder listing."""
        meta = self.opt["meta_info_file"]
        if self.io_type in ("lmdb", "shards"):
            names = backend.keys()
        elif meta:
            names = _meta_info_names(os.fspath(meta), self.key_path)
            _check_files_exist(root, names, what, self.key_path)
        else:
            names = backend.keys()
        if not names:
            raise DataError(f"{self.key_path}: no images ({', '.join(IMAGE_EXTENSIONS)}) in '{root}'"
                            f"{_lmdb_hint(root, self.io_type) or subfolder_hint(root)}")
        return names


def _lmdb_hint(root: str, io_type: str) -> str:
    """Advice for an empty listing: an LMDB folder read as a folder of images, or an LMDB listing no keys."""
    if io_type == "lmdb":
        return f"; its meta_info.txt lists no keys: rebuild it (anysr prepare lmdb --input FOLDER --output {root})"
    if os.path.isfile(os.path.join(root, "data.mdb")):
        return "; it is an LMDB: set io_backend: {type: lmdb}"
    return ""


class _TooSmall(str):
    """A start-up problem that is only a patch size: several are said as one line with the size that fits."""

    def __new__(cls, text: str, name: str, patch: int) -> _TooSmall:
        obj = super().__new__(cls, text)
        obj.name, obj.patch = name, patch
        return obj

    name: str
    patch: int


@DATASET_REGISTRY.register()
class PairedImageDataset(_ImageDataset):
    """Paired LQ/GT images for training and validation (BasicSR's ``PairedImageDataset`` options).

    Options: dataroot_gt, dataroot_lq (or ``lq_from_gt: true`` to make the LQ by MATLAB bicubic from the
    mod-cropped GT), meta_info_file, filename_tmpl ('{}'), io_backend {type: disk|lmdb}, scale, phase,
    gt_size (train), use_hflip (alias use_flip; default off), use_rot (default off), color ('y'), mean, std.
    Items: {'lq', 'gt': float CHW tensors, 'lq_path', 'gt_path': str, 'gray': bool, 'bits': int}; tensors have
    3 channels (a gray GT file is replicated) or 1 with ``color: y``. Images keep their depth: a 16-bit file
    gives ``x / 65535`` (``lq_from_gt`` makes a 16-bit LQ from it), and ``bits`` is the GT file's (8 or 16),
    which validation uses to save and score results at that depth.
    """

    role = "paired"  # the options apply PairedImageDataset's rules (subclasses: RealESRGANPairedDataset)

    def __init__(self, opt: Mapping[str, Any], key_path: str | None = None) -> None:
        super().__init__(opt, key_path)
        kp = self.key_path
        self.scale = int(opt["scale"])
        self.lq_from_gt = bool(opt["lq_from_gt"])
        self.filename_tmpl = str(opt["filename_tmpl"])
        self.gt_size = int(opt["gt_size"]) if self.phase == "train" else 0
        self.use_hflip = bool(opt["use_hflip"])
        self.use_rot = bool(opt["use_rot"])

        self.gt_root = os.fspath(opt["dataroot_gt"])
        self.gt_backend = build_backend(self.io_type, self.gt_root, self.io_opt)
        if self.lq_from_gt:
            self.lq_root = None
            self.lq_backend = None
            self.items = [_Pair(n, None) for n in self._names_from(self.gt_root, self.gt_backend, "GT")]
            return
        self.lq_root = os.fspath(opt["dataroot_lq"] or self.gt_root)  # shards: the LQ side of the same samples
        self.lq_backend = build_backend(self.io_type, self.lq_root, self.io_opt, field="lq")
        meta = opt["meta_info_file"]
        if self.io_type in ("lmdb", "shards"):
            pairs = paired_keys_from_lmdb(self.gt_backend, self.lq_backend, kp)
        elif meta:
            pairs = self._pairs_from_meta_info(os.fspath(meta))
        else:
            pairs = paired_names_from_folder(self.gt_root, self.lq_root, self.filename_tmpl, kp)
        self.items = [_Pair(g, q) for g, q in pairs]

    def _pairs_from_meta_info(self, meta: str) -> list[tuple[str, str]]:
        """(GT, LQ) names from the meta info file (BasicSR's PairedImageDataset format: GT names)."""
        assert self.lq_root is not None
        return paired_names_from_meta_info(meta, self.gt_root, self.lq_root, self.filename_tmpl, self.key_path)

    def _check_item(self, i: int, decode: bool) -> str | None:
        item, s = self.items[i], self.scale
        assert item.gt is not None
        gt_path, lq_path = self.paths(i)
        gt = self._info(self.gt_backend, item.gt, decode)
        if self.lq_from_gt:
            h, w = gt.height - gt.height % s, gt.width - gt.width % s
            self._sides[i] = min(h, w)
            if self.phase == "train" and (h < self.gt_size or w < self.gt_size):
                return _TooSmall(f"{gt_path} is {gt.width}x{gt.height} (WxH), smaller than the {self.gt_size}x"
                                 f"{self.gt_size} GT patch (gt_size) after the crop to a multiple of scale {s}; lower "
                                 "gt_size or remove it", os.path.basename(gt_path), self.gt_size)
            return f"{gt_path} is smaller than the scale {s}" if min(h, w) == 0 else None
        assert self.lq_backend is not None and item.lq is not None
        lq = self._info(self.lq_backend, item.lq, decode)
        if gt.height // s != lq.height or gt.width // s != lq.width:
            swapped = s > 1 and lq.height // s == gt.height and lq.width // s == gt.width
            return (f"{gt_path} ({gt.width}x{gt.height}) and {lq_path} ({lq.width}x{lq.height}) do not pair at "
                    f"scale {s}: the GT should be {lq.width * s}x{lq.height * s} (up to {s - 1} extra pixels)"
                    + ("; the LQ is the larger one: are dataroot_gt and dataroot_lq swapped?" if swapped else ""))
        p = lq_patch_size(self.gt_size, s)
        self._sides[i] = min(lq.height, lq.width) * s
        if self.phase == "train" and (lq.height < p or lq.width < p):
            return _TooSmall(f"{lq_path} is {lq.width}x{lq.height} (WxH), smaller than the {p}x{p} LQ patch "
                             f"(gt_size {self.gt_size} / scale {s}); lower gt_size or remove it",
                             os.path.basename(lq_path), self.gt_size)
        return None

    def paths(self, i: int) -> tuple[str, str]:
        """(gt_path, lq_path) of item ``i`` (for lq_from_gt both are the GT path)."""
        item = self.items[i]
        assert item.gt is not None
        gt_path = self._path(self.gt_root, item.gt)
        if item.lq is None or self.lq_root is None:
            return gt_path, gt_path
        return gt_path, self._path(self.lq_root, item.lq)

    def __getitem__(self, index: Any) -> dict[str, Any]:
        i, seed = self._split_index(index)
        item = self.items[i]
        assert item.gt is not None
        gt_path, lq_path = self.paths(i)
        img_gt = self.gt_backend.read(item.gt)
        gray = img_gt.ndim == 2
        s = self.scale
        rng = np.random.default_rng(i if seed is None else seed) if self.phase == "train" else None

        if self.lq_from_gt:
            img_gt = mod_crop(img_gt, s)
            if rng is not None:
                img_gt, img_lq = self._degraded_patch(img_gt, rng, gt_path)
            else:
                if min(img_gt.shape[:2]) == 0:
                    raise DataError(f"{gt_path}: image is smaller than scale {s}")
                img_lq = bicubic_degrade(img_gt, s)
        else:
            assert self.lq_backend is not None and item.lq is not None
            img_lq = self.lq_backend.read(item.lq)
            if rng is not None:
                img_gt, img_lq = paired_random_crop(img_gt, img_lq, self.gt_size, s, rng, gt_path, lq_path)
            else:
                img_gt = match_gt_to_lq(img_gt, img_lq, s, gt_path, lq_path)
        if rng is not None:
            img_gt, img_lq = augment([img_gt, img_lq], self.use_hflip, self.use_rot, rng)
        return {"lq": self._to_tensor(img_lq), "gt": self._to_tensor(img_gt),
                "lq_path": lq_path, "gt_path": gt_path, "gray": gray, "bits": image_bits(img_gt)}

    def _degraded_patch(self, gt: np.ndarray, rng: np.random.Generator,
                        gt_path: str) -> tuple[np.ndarray, np.ndarray]:
        """A random GT patch and its bicubic LQ, equal to cropping the whole degraded image."""
        s, size = self.scale, self.gt_size
        h, w = gt.shape[:2]
        if h < size or w < size:
            raise DataError(
                f"{gt_path} is {h}x{w} (HxW after mod-crop to scale {s}), smaller than the {size}x{size} "
                f"GT patch (gt_size). Lower gt_size, or remove images smaller than {size}x{size}."
            )
        p = lq_patch_size(size, s)
        top, left = random_crop_origin(h // s, w // s, p, rng)
        lq = bicubic_degrade_window(gt, s, top, left, p)
        return gt[top * s: top * s + size, left * s: left * s + size, ...], lq


@DATASET_REGISTRY.register()
class SingleImageDataset(_ImageDataset):
    """LQ images only, for inference (options: dataroot_lq, meta_info_file, io_backend, color, mean, std).

    Items: {'lq': float CHW tensor, 'lq_path': str, 'gray': bool, 'bits': int (the file's depth, 8 or 16)}.
    """

    def __init__(self, opt: Mapping[str, Any], key_path: str | None = None) -> None:
        super().__init__(opt, key_path)
        self.lq_root = os.fspath(opt["dataroot_lq"])
        try:
            self.lq_backend = build_backend(self.io_type, self.lq_root, self.io_opt, field="lq")
        except DataError:
            if self.io_type != "shards":
                raise
            # a set written from one folder holds its images as the 'gt' side
            self.lq_backend = build_backend(self.io_type, self.lq_root, self.io_opt, field="gt")
        self.items = [_Pair(None, n) for n in self._names_from(self.lq_root, self.lq_backend, "LQ")]

    def _check_item(self, i: int, decode: bool) -> str | None:
        name = self.items[i].lq
        assert name is not None
        self._info(self.lq_backend, name, decode)
        return None

    def __getitem__(self, index: Any) -> dict[str, Any]:
        i, _ = self._split_index(index)
        name = self.items[i].lq
        assert name is not None
        img = self.lq_backend.read(name)
        return {"lq": self._to_tensor(img), "lq_path": self._path(self.lq_root, name), "gray": img.ndim == 2,
                "bits": image_bits(img)}

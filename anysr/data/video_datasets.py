"""Video datasets with BasicSR's names and options: REDS and Vimeo-90K for training (a window of frames around a
GT centre frame for EDVR, or a whole clip for recurrent networks) and folders of frames for testing.

Layouts (as BasicSR's): REDS ``<root>/<clip>/<frame:08d>.png`` with a meta info file of lines
``<clip> <frames> (h,w,c)``; Vimeo-90K ``<root>/<clip>/<seq>/im<1..7>.png`` listed as ``<clip>/<seq> ...``;
test sets ``<root>/<folder>/<any frame names>`` (Vid4, REDS4). With ``io_backend: {type: lmdb}`` (or ``shards``)
the same paths without extension are the LMDB (or shard set) keys (BasicSR's ``create_lmdb`` layout). Without a
meta info file the folders are listed.

Randomness (the temporal interval, the window position, the reversal, the crop and flips) comes from
``np.random.default_rng(seed)`` of ``ds[(index, seed)]`` only (``ds[i]`` means seed ``i``), as for image datasets:
a sample depends on nothing but (index, seed). LQ frames come from ``dataroot_lq`` or, with ``lq_from_gt``, from the
GT frames by BasicSR's BI (MATLAB bicubic) or BD (Gaussian blur, then every ``scale``-th pixel) degradation.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F
from torch.utils.data import Dataset

from anysr.data.degradation.bicubic import bicubic_degrade
from anysr.data.degradation.realbasicvsr import RealBasicVSRDegradation, RealBasicVSRSettings
from anysr.data.degradation.video_codec import (
    VideoCompressionSettings,
    clip_rng,
    compress_clip,
    draw_video_compression,
)
from anysr.data.file_backends import (
    BACKEND_TYPES,
    DiskBackend,
    FileBackend,
    build_backend,
    check_pixel_type,
    is_image_file,
)
from anysr.data.imageio import ImageInfo, probe_bytes, probe_image
from anysr.data.paired_image_dataset import meta_info_lines
from anysr.data.transforms import augment, img2tensor, lq_patch_size, mod_crop, paired_random_crop
from anysr.errors import DataError
from anysr.registry import DATASET_REGISTRY, DEGRADATION_REGISTRY

REDS4_CLIPS = ("000", "011", "015", "020")
REDS_OFFICIAL_VAL = tuple(f"{v:03d}" for v in range(240, 270))
VIMEO_FRAMES = 7
FRAME_EXT = ".png"  # BasicSR's REDS / Vimeo frames


# ------------------------------------------------------------------------------------------ frame windows
def frame_window(center: int, length: int, num_frame: int, padding: str = "reflection_circle") -> list[int]:
    """The ``num_frame`` frame indices around ``center`` in a clip of ``length`` frames; indices past the ends are
    replaced as BasicSR's ``padding`` modes do (``replicate``, ``reflection``, ``reflection_circle``,
    ``circle``). E.g. centre 0 of 5: replicate [0, 0, 0, 1, 2], reflection [2, 1, 0, 1, 2], reflection_circle
    [4, 3, 0, 1, 2], circle [3, 4, 0, 1, 2]."""
    if num_frame % 2 == 0:
        raise DataError(f"frame_window: num_frame must be odd, got {num_frame}")
    last, half = length - 1, num_frame // 2
    out = []
    for i in range(center - half, center + half + 1):
        if i < 0:
            j = {"replicate": 0, "reflection": -i, "reflection_circle": center + half - i}.get(padding, num_frame + i)
        elif i > last:
            j = {"replicate": last, "reflection": 2 * last - i,
                 "reflection_circle": center - half - (i - last)}.get(padding, i - num_frame)
        else:
            j = i
        out.append(min(max(j, 0), last))  # clips shorter than the window stay inside
    return out


# ------------------------------------------------------------------------------------------ BD degradation
@lru_cache(maxsize=8)
def bd_kernel(scale: int, kernel_size: int = 13) -> np.ndarray:
    """BasicSR's BD blur: a ``kernel_size`` square of the normalised Gaussian with sigma ``0.4 * scale`` (the
    Gaussian is cut at 4 sigma, as the filter of a delta image computes it; the rest of the square is zero)."""
    sigma = 0.4 * scale
    radius = int(4.0 * sigma + 0.5)
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    g = np.exp(-0.5 * (x / sigma) ** 2)
    g /= g.sum()
    k = np.zeros((kernel_size, kernel_size))
    c = kernel_size // 2
    lo, hi = max(0, c - radius), min(kernel_size, c + radius + 1)
    k[lo:hi, lo:hi] = np.outer(g, g)[lo - c + radius: hi - c + radius, lo - c + radius: hi - c + radius]
    return k


def bd_degrade(frames: torch.Tensor, scale: int, kernel_size: int = 13) -> torch.Tensor:
    """BD downsampling of float frames (..., c, h, w) in [0, 1] (BasicSR's ``duf_downsample``): reflect padding,
    the ``bd_kernel`` blur sampled every ``scale`` pixels, two border pixels dropped; h, w multiples of scale."""
    if scale not in (2, 3, 4):
        raise DataError(f"BD degradation is defined for scale 2, 3 and 4 (BasicSR's), got {scale}")
    *lead, h, w = frames.shape
    x = frames.reshape(-1, 1, h, w).double()
    pad = kernel_size // 2 + 2 * scale
    x = F.pad(x, (pad, pad, pad, pad), mode="reflect")
    k = torch.from_numpy(bd_kernel(scale, kernel_size)).to(x)[None, None]
    x = F.conv2d(x, k, stride=scale)[:, :, 2:-2, 2:-2]
    return x.reshape(*lead, x.shape[-2], x.shape[-1]).to(frames.dtype)


def _bd_uint8(img: np.ndarray, scale: int) -> np.ndarray:
    t = torch.from_numpy(np.ascontiguousarray(img)).float() / 255.0
    t = t.permute(2, 0, 1) if t.ndim == 3 else t[None]
    out = bd_degrade(t, scale)
    out = out.permute(1, 2, 0) if img.ndim == 3 else out[0]
    return np.clip(np.rint(out.numpy() * 255.0), 0, 255).astype(np.uint8)


def degrade_frame(gt: np.ndarray, scale: int, kind: str) -> np.ndarray:
    """A uint8 GT frame (mod-cropped to ``scale``) to its LQ frame: ``BI`` MATLAB bicubic, ``BD`` blur-downsample."""
    return _bd_uint8(gt, scale) if kind == "BD" else bicubic_degrade(gt, scale)


# ------------------------------------------------------------------------------------------ the datasets
@dataclass(frozen=True)
class _Clip:
    name: str
    frames: tuple[str, ...]  # frame keys relative to the root, without extension (the LMDB key)


class _VideoDataset(Dataset):
    """What every video dataset shares: options, backends, frame reading and the LQ-from-GT degradation.

    Subclasses set ``video_kind``: 'window' (train: GT centre frame + LQ window), 'recurrent' (train: LQ and GT
    clips), 'test_window' (one item per frame) or 'test_clip' (one item per clip). The options' rules read it.
    """

    video_kind = ""
    needs_num_frame = False  # the options require num_frame
    odd_num_frame = False  # ... and an odd one (a window centred on the GT frame)
    backend_types = BACKEND_TYPES  # the io_backend.type values it reads (the options check them)

    def __init__(self, opt: Mapping[str, Any], key_path: str | None = None) -> None:
        self.opt = opt
        self.key_path = key_path or f"datasets.{opt['phase']}"
        self.name = str(opt["name"])
        self.phase = str(opt["phase"])
        self.scale = int(opt["scale"])
        self.io_type = str(opt["io_backend"]["type"])
        self.lq_from_gt = bool(opt["lq_from_gt"])
        self.degradation = str(opt["degradation"])
        self.gt_root = os.fspath(opt["dataroot_gt"])
        self.gt_backend = build_backend(self.io_type, self.gt_root, opt["io_backend"])
        self.lq_root = None if self.lq_from_gt else os.fspath(opt["dataroot_lq"] or self.gt_root)  # shards: one set
        self.lq_backend = None if self.lq_root is None else build_backend(self.io_type, self.lq_root,
                                                                          opt["io_backend"], field="lq")
        self.use_hflip = bool(opt["use_hflip"])
        self.use_rot = bool(opt["use_rot"])
        self.gt_size = int(opt["gt_size"]) if self.phase == "train" and opt["gt_size"] else 0
        self.random_reverse = bool(opt["random_reverse"])
        self.interval_list = [int(i) for i in opt["interval_list"]]
        self.cache: dict[tuple[str, str], np.ndarray] | None = {} if opt["cache_data"] else None
        comp = opt.get("video_compression")
        self.compression = None if comp is None else VideoCompressionSettings.from_options(
            comp, f"{self.key_path}.video_compression")
        self.clip_degradation: RealBasicVSRDegradation | None = None
        if self.degradation == "realbasicvsr":
            if self.video_kind != "recurrent" or self.phase != "train" or not self.lq_from_gt:
                raise DataError(f"{self.key_path}.degradation: realbasicvsr degrades the GT clips of recurrent "
                                "training datasets with lq_from_gt: true")
            lq = lq_patch_size(self.gt_size, self.scale)
            settings = RealBasicVSRSettings(opt.get("degradation_params"), lq_size=(lq, lq), gt_size=self.gt_size,
                                            where=f"{self.key_path}.degradation_params")
            self.clip_degradation = DEGRADATION_REGISTRY.get("realbasicvsr")(settings)

    @classmethod
    def sample_frames(cls, opt: Mapping[str, Any]) -> int | None:
        """Frames of one item's LQ input under the options ``opt`` (None: it depends on the clip)."""
        n = opt["num_frame"]
        return int(n) if n is not None and n > 0 and cls.video_kind != "test_clip" else None

    # ---------------------------------------------------------------- reading
    def _file(self, key: str) -> str:
        return key if self.io_type in ("lmdb", "shards") else key + self._ext.get(key, FRAME_EXT)

    _ext: dict[str, str] = {}  # frame key -> its file extension, for listed folders (REDS / Vimeo: .png)

    def _read(self, side: str, key: str) -> np.ndarray:
        """One uint8 frame (HWC BGR) of ``side`` 'gt' or 'lq' (made from the GT frame with ``lq_from_gt``)."""
        if self.cache is not None and (side, key) in self.cache:
            return self.cache[(side, key)]
        if side == "lq" and self.lq_backend is None:
            img = degrade_frame(mod_crop(self._read("gt", key), self.scale), self.scale, self.degradation)
        else:
            backend = self.gt_backend if side == "gt" else self.lq_backend
            assert backend is not None
            img = backend.read_uint8(self._file(key))
            if img.ndim == 2:
                img = np.repeat(img[:, :, None], 3, axis=2)
        if self.cache is not None:
            self.cache[(side, key)] = img
        return img

    def describe(self, side: str, key: str) -> str:
        backend = self.gt_backend if side == "gt" or self.lq_backend is None else self.lq_backend
        return backend.describe(self._file(key))

    @staticmethod
    def _split_index(index: Any) -> tuple[int, int | None]:
        if isinstance(index, tuple):
            i, seed = index
            return int(i), int(seed)
        return int(index), None

    @staticmethod
    def _stack(frames: Sequence[np.ndarray]) -> torch.Tensor:
        return torch.stack([img2tensor(f) for f in frames], dim=0)

    def _compress(self, lqs: list[np.ndarray], seed: int) -> list[np.ndarray]:
        """The LQ clip through ``video_compression`` (one draw per clip, from the sample seed), or as it is."""
        if self.compression is None:
            return lqs
        draw = draw_video_compression(clip_rng(seed), self.compression)
        if draw.codec is None:
            return lqs
        return compress_clip(lqs, draw.codec, bitrate=draw.bitrate, crf=draw.crf)

    def _degrade_clip(self, gts: list[np.ndarray], rng: np.random.Generator, seed: int, gt_key: str,
                      mirror: bool = False) -> dict[str, torch.Tensor]:
        """``degradation: realbasicvsr``: crop and flip the GT clip (``mirror``: append it reversed), then degrade it
        (RealBasicVSR's order): the LQ clip and the GT (unsharp-masked with ``gt_usm``), float in [0, 1]."""
        h, w = gts[0].shape[:2]
        p = self.gt_size
        if h < p or w < p:
            raise DataError(f"{self.describe('gt', gt_key)} is {w}x{h}, smaller than gt_size {p}; lower gt_size")
        top, left = int(rng.integers(0, h - p + 1)), int(rng.integers(0, w - p + 1))
        gts = augment([g[top: top + p, left: left + p] for g in gts], self.use_hflip, self.use_rot, rng)
        if mirror:
            gts = gts + gts[::-1]
        assert self.clip_degradation is not None
        rgb = [np.ascontiguousarray(g[:, :, ::-1]) for g in gts]
        lqs, usm = self.clip_degradation(rgb, seed)
        target = usm if self.clip_degradation.settings.gt_usm else rgb

        def stack(frames: list[np.ndarray]) -> torch.Tensor:
            x = torch.from_numpy(np.stack([np.asarray(f, dtype=np.float32) for f in frames]))
            return (x / 255.0).permute(0, 3, 1, 2).contiguous()

        return {"lq": stack(lqs), "gt": stack(target)}

    def _crop_and_augment(self, gts: list[np.ndarray], lqs: list[np.ndarray], rng: np.random.Generator,
                          gt_key: str, lq_key: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
        if self.lq_backend is None:
            gts = [mod_crop(g, self.scale) for g in gts]
        gts, lqs = paired_random_crop(gts, lqs, self.gt_size, self.scale, rng, self.describe("gt", gt_key),
                                      self.describe("lq", lq_key))
        out = augment([*lqs, *gts], self.use_hflip, self.use_rot, rng)
        return out[len(lqs):], out[: len(lqs)]

    # ---------------------------------------------------------------- listing
    def _clip_names_from_meta(self) -> list[tuple[str, int | None]]:
        """``(clip, frame count or None)`` of each meta info line (``<clip> [<frames> (h,w,c)]``)."""
        meta = self.opt["meta_info_file"]
        out = []
        for line in meta_info_lines(os.fspath(meta), self.key_path):
            parts = line.split()
            count = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
            out.append((parts[0], count))
        if not out:
            raise DataError(f"{self.key_path}.meta_info_file: '{meta}' lists no clips")
        return out

    def _list_frames(self, backend: FileBackend, clip: str) -> list[str]:
        """Frame keys (``clip/stem``) of one clip folder (or LMDB key prefix), sorted by name."""
        if isinstance(backend, DiskBackend):
            folder = os.path.join(backend.root, clip)
            if not os.path.isdir(folder):
                raise DataError(f"{self.key_path}: clip folder '{folder}' not found; check the dataroot and the "
                                "meta info file")
            names = sorted(n for n in os.listdir(folder) if is_image_file(n) and not n.startswith("."))
            keys = []
            for n in names:
                stem, ext = os.path.splitext(n)
                key = f"{clip}/{stem}"
                if ext != FRAME_EXT:
                    self._ext = {**self._ext, key: ext}
                keys.append(key)
            return keys
        prefix = clip.rstrip("/") + "/"
        return sorted(k for k in backend.keys() if k.startswith(prefix) and "/" not in k[len(prefix):])

    def _list_clips(self, backend: FileBackend) -> list[str]:
        """Clip names: the sub-folders of the root (or the first part of the LMDB keys), sorted."""
        if isinstance(backend, DiskBackend):
            if not os.path.isdir(backend.root):
                raise DataError(f"{self.key_path}: '{backend.root}' is not a folder of clips")
            return sorted(e.name for e in os.scandir(backend.root) if e.is_dir() and not e.name.startswith("."))
        return sorted({k.split("/", 1)[0] for k in backend.keys() if "/" in k})

    # ---------------------------------------------------------------- start-up checks
    def check(self, *, decode: bool, progress: bool = True) -> list[str]:
        """Problems found now rather than mid-run: every frame's header (a frame of each clip decoded when
        ``decode``), the LQ / GT sizes pairing at ``scale``, and frames big enough for ``gt_size``."""
        del progress
        problems: list[str] = []
        s, p = self.scale, lq_patch_size(self.gt_size, self.scale)
        for gt_key, lq_key in self._check_pairs():
            try:
                gt = self._info("gt", gt_key, decode)
                if self.lq_backend is None:
                    continue
                lq = self._info("lq", lq_key, decode)
            except DataError as exc:
                problems.append(str(exc))
                continue
            if gt.height // s != lq.height or gt.width // s != lq.width:
                problems.append(f"{self.describe('gt', gt_key)} ({gt.width}x{gt.height}) and "
                                f"{self.describe('lq', lq_key)} ({lq.width}x{lq.height}) do not pair at scale {s}")
            elif self.gt_size and (lq.height < p or lq.width < p):
                problems.append(f"{self.describe('lq', lq_key)} is {lq.width}x{lq.height}, smaller than the "
                                f"{p}-pixel LQ patch (gt_size {self.gt_size} / scale {s}); "
                                "lower gt_size")
        return problems

    def _check_pairs(self) -> list[tuple[str, str]]:
        return []

    def _info(self, side: str, key: str, decode: bool) -> ImageInfo:
        if decode:
            img = self._read(side, key)
            return ImageInfo(img.shape[1], img.shape[0], img.shape[2] if img.ndim == 3 else 1, 8)
        backend = self.gt_backend if side == "gt" else self.lq_backend
        assert backend is not None
        name = backend.describe(self._file(key))
        if isinstance(backend, DiskBackend):
            return check_pixel_type(probe_image(backend.path_of(self._file(key))), name)
        known = backend.header(self._file(key))  # a shard index holds every header: nothing is downloaded
        if known is not None:
            return check_pixel_type(known, name)
        return check_pixel_type(probe_bytes(backend.get(self._file(key)), name), name)


class _REDSBase(_VideoDataset):
    """REDS clips (every clip but the ``val_partition`` ones, or only those with ``test_mode``)."""

    def __init__(self, opt: Mapping[str, Any], key_path: str | None = None) -> None:
        super().__init__(opt, key_path)
        held_out = REDS4_CLIPS if opt["val_partition"] == "REDS4" else REDS_OFFICIAL_VAL
        listed = self._clip_names_from_meta() if opt["meta_info_file"] else \
            [(c, None) for c in self._list_clips(self.gt_backend)]
        keep = (lambda c: c in held_out) if opt["test_mode"] else (lambda c: c not in held_out)
        self.clips: list[_Clip] = []
        for name, count in listed:
            if not keep(name):
                continue
            if count is not None and self.io_type == "disk":
                frames = tuple(f"{name}/{i:08d}" for i in range(count))
            else:
                frames = tuple(self._list_frames(self.gt_backend, name))
            if not frames:
                raise DataError(f"{self.key_path}: clip '{name}' has no frames in '{self.gt_root}'")
            self.clips.append(_Clip(name, frames))
        if not self.clips:
            which = "in" if opt["test_mode"] else "outside"
            raise DataError(f"{self.key_path}: no clip {which} val_partition {opt['val_partition']} "
                            f"({', '.join(held_out[:4])}...); check the meta info file or val_partition")
        # one sample per frame, as BasicSR: (clip index, frame index)
        self.samples = [(c, i) for c, clip in enumerate(self.clips) for i in range(len(clip.frames))]
        self.num_frame = int(opt["num_frame"])

    def __len__(self) -> int:
        return len(self.samples)

    def _check_pairs(self) -> list[tuple[str, str]]:
        return [(k, k) for clip in self.clips for k in clip.frames]


@DATASET_REGISTRY.register()
class REDSDataset(_REDSBase):
    """REDS training for EDVR: ``num_frame`` LQ frames (odd) around a GT centre frame, ``interval_list`` temporal
    strides, ``random_reverse``; a window that would leave the clip is moved to a random valid centre (BasicSR's
    rule). Items: {'lq': (t, 3, p, p), 'gt': (3, P, P), 'key': 'clip/frame'}."""

    video_kind = "window"
    needs_num_frame = True
    odd_num_frame = True

    def __getitem__(self, index: Any) -> dict[str, Any]:
        i, seed = self._split_index(index)
        rng = np.random.default_rng(i if seed is None else seed)
        c, center = self.samples[i]
        clip = self.clips[c]
        n, half = len(clip.frames), self.num_frame // 2
        interval = int(self.interval_list[int(rng.integers(len(self.interval_list)))])
        reach = half * interval
        if n < 2 * reach + 1:
            raise DataError(f"{self.key_path}: clip '{clip.name}' has {n} frames, fewer than a window of "
                            f"{self.num_frame} frames at interval {interval}; lower num_frame or interval_list")
        redraw = int(rng.integers(reach, n - reach))
        if center - reach < 0 or center + reach > n - 1:
            center = redraw
        order = list(range(center - reach, center + reach + 1, interval))
        if self.random_reverse and rng.random() < 0.5:
            order.reverse()
        gt_key = clip.frames[center]
        lqs = [self._read("lq", clip.frames[j]) for j in order]
        (gt,), lqs = self._crop_and_augment([self._read("gt", gt_key)], lqs, rng, gt_key, clip.frames[order[0]])
        lqs = self._compress(lqs, i if seed is None else seed)
        return {"lq": self._stack(lqs), "gt": img2tensor(gt), "key": gt_key}


@DATASET_REGISTRY.register()
class REDSRecurrentDataset(_REDSBase):
    """REDS training for recurrent networks: ``num_frame`` consecutive LQ and GT frames (stride from
    ``interval_list``) starting at the sample's frame, moved to a random valid start near the clip's end (BasicSR's
    rule). Items: {'lq': (t, 3, p, p), 'gt': (t, 3, P, P), 'key'}."""

    video_kind = "recurrent"
    needs_num_frame = True

    def __getitem__(self, index: Any) -> dict[str, Any]:
        i, seed = self._split_index(index)
        rng = np.random.default_rng(i if seed is None else seed)
        c, start = self.samples[i]
        clip = self.clips[c]
        n = len(clip.frames)
        interval = int(self.interval_list[int(rng.integers(len(self.interval_list)))])
        span = self.num_frame * interval
        if span > n:
            raise DataError(f"{self.key_path}: clip '{clip.name}' has {n} frames, fewer than num_frame "
                            f"{self.num_frame} x interval {interval}; lower num_frame or interval_list")
        redraw = int(rng.integers(0, n - span + 1))
        if start > n - span:
            start = redraw
        order = list(range(start, start + span, interval))
        if self.random_reverse and rng.random() < 0.5:
            order.reverse()
        keys = [clip.frames[j] for j in order]
        if self.clip_degradation is not None:
            pair = self._degrade_clip([self._read("gt", k) for k in keys], rng, i if seed is None else seed, keys[-1])
            return {**pair, "key": clip.frames[order[0]]}
        gts, lqs = self._crop_and_augment([self._read("gt", k) for k in keys], [self._read("lq", k) for k in keys],
                                          rng, keys[-1], keys[-1])
        lqs = self._compress(lqs, i if seed is None else seed)
        return {"lq": self._stack(lqs), "gt": self._stack(gts), "key": clip.frames[order[0]]}


class _VimeoBase(_VideoDataset):
    """Vimeo-90K septuplets ``<clip>/<seq>/im1..im7`` listed by the meta info file (or found two folders deep)."""

    def __init__(self, opt: Mapping[str, Any], key_path: str | None = None) -> None:
        super().__init__(opt, key_path)
        if opt["meta_info_file"]:
            self.keys = [name for name, _ in self._clip_names_from_meta()]
        else:
            self.keys = [f"{c}/{s}" for c in self._list_clips(self.gt_backend)
                         for s in self._list_clips(build_backend(self.io_type, os.path.join(self.gt_root, c)))] \
                if self.io_type == "disk" else sorted({k.rsplit("/", 1)[0] for k in self.gt_backend.keys()})
        if not self.keys:
            raise DataError(f"{self.key_path}: no Vimeo-90K sequences in '{self.gt_root}'")

    def __len__(self) -> int:
        return len(self.keys)


@DATASET_REGISTRY.register()
class Vimeo90KDataset(_VimeoBase):
    """Vimeo-90K training for EDVR: the ``num_frame`` (odd, <= 7) LQ frames centred on im4, the GT im4.
    Items: {'lq': (t, 3, p, p), 'gt': (3, P, P), 'key': 'clip/seq'}."""

    video_kind = "window"
    needs_num_frame = True
    odd_num_frame = True

    def __init__(self, opt: Mapping[str, Any], key_path: str | None = None) -> None:
        super().__init__(opt, key_path)
        t = int(opt["num_frame"])
        if t > VIMEO_FRAMES:
            raise DataError(f"{self.key_path}.num_frame: a Vimeo-90K septuplet has 7 frames, got {t}")
        self.neighbors = [k + (9 - t) // 2 for k in range(t)]

    def __getitem__(self, index: Any) -> dict[str, Any]:
        i, seed = self._split_index(index)
        rng = np.random.default_rng(i if seed is None else seed)
        key = self.keys[i]
        order = list(self.neighbors)
        if self.random_reverse and rng.random() < 0.5:
            order.reverse()
        gt_key = f"{key}/im4"
        lqs = [self._read("lq", f"{key}/im{j}") for j in order]
        (gt,), lqs = self._crop_and_augment([self._read("gt", gt_key)], lqs, rng, gt_key, f"{key}/im{order[0]}")
        lqs = self._compress(lqs, i if seed is None else seed)
        return {"lq": self._stack(lqs), "gt": img2tensor(gt), "key": key}

    def _check_pairs(self) -> list[tuple[str, str]]:
        return [(f"{k}/im4", f"{k}/im{j}") for k in self.keys for j in self.neighbors]


@DATASET_REGISTRY.register()
class Vimeo90KRecurrentDataset(_VimeoBase):
    """Vimeo-90K training for recurrent networks: all 7 LQ and GT frames (14 with ``flip_sequence``: the clip
    then its reverse). Items: {'lq': (t, 3, p, p), 'gt': (t, 3, P, P), 'key'}."""

    video_kind = "recurrent"

    @classmethod
    def sample_frames(cls, opt: Mapping[str, Any]) -> int | None:
        return VIMEO_FRAMES * (2 if opt["flip_sequence"] else 1)

    def __getitem__(self, index: Any) -> dict[str, Any]:
        i, seed = self._split_index(index)
        rng = np.random.default_rng(i if seed is None else seed)
        key = self.keys[i]
        order = list(range(1, VIMEO_FRAMES + 1))
        if self.random_reverse and rng.random() < 0.5:
            order.reverse()
        keys = [f"{key}/im{j}" for j in order]
        if self.clip_degradation is not None:
            pair = self._degrade_clip([self._read("gt", k) for k in keys], rng, i if seed is None else seed, keys[-1],
                                      mirror=bool(self.opt["flip_sequence"]))
            return {**pair, "key": key}
        gts, lqs = self._crop_and_augment([self._read("gt", k) for k in keys], [self._read("lq", k) for k in keys],
                                          rng, keys[-1], keys[-1])
        if self.opt["flip_sequence"]:  # the mirrored clip is what is compressed (RealBasicVSR's order)
            gts, lqs = gts + gts[::-1], lqs + lqs[::-1]
        lqs = self._compress(lqs, i if seed is None else seed)
        return {"lq": self._stack(lqs), "gt": self._stack(gts), "key": key}

    def _check_pairs(self) -> list[tuple[str, str]]:
        return [(f"{k}/im{j}", f"{k}/im{j}") for k in self.keys for j in range(1, VIMEO_FRAMES + 1)]


# ------------------------------------------------------------------------------------------ test datasets
class _ClipTestBase(_VideoDataset):
    """Folders of frames (``<root>/<folder>/<frames>``), LQ and GT with the same frame count.

    For clip validation: ``clip_names`` and ``clip_lengths`` (frames scored per clip); each item says its clip
    (``clip`` index) and the frames its outputs belong to (``frames``).
    """

    def __init__(self, opt: Mapping[str, Any], key_path: str | None = None) -> None:
        super().__init__(opt, key_path)
        if opt["meta_info_file"]:
            names = [name for name, _ in self._clip_names_from_meta()]
        else:
            names = self._list_clips(self.lq_backend or self.gt_backend)
        if not names:
            raise DataError(f"{self.key_path}: no clip folders in '{self.lq_root or self.gt_root}'")
        self.clips = []
        self.lq_frames: list[tuple[str, ...]] = []
        for name in names:
            gt = self._list_frames(self.gt_backend, name)
            lq = gt if self.lq_backend is None else self._list_frames(self.lq_backend, name)
            if len(gt) != len(lq):
                raise DataError(f"{self.key_path}: clip '{name}' has {len(lq)} LQ frames but {len(gt)} GT frames")
            if not gt:
                raise DataError(f"{self.key_path}: clip '{name}' has no frames")
            self.clips.append(_Clip(name, tuple(gt)))
            self.lq_frames.append(tuple(lq))
        self.clip_names = [c.name for c in self.clips]
        self.clip_lengths = [len(c.frames) for c in self.clips]
        self.gt_ext = dict(self._ext)

    def _check_pairs(self) -> list[tuple[str, str]]:
        return [(g, q) for clip, lq in zip(self.clips, self.lq_frames) for g, q in zip(clip.frames, lq)]

    def _gt_frame(self, key: str) -> np.ndarray:
        img = self._read("gt", key)
        return mod_crop(img, self.scale) if self.lq_backend is None else img

    def lq_path(self, c: int, j: int) -> str:
        return self.describe("lq", self.lq_frames[c][j])

    def frame_name(self, c: int, j: int) -> str:
        """The file stem results of frame ``j`` of clip ``c`` are saved under (its LQ frame's)."""
        return self.lq_frames[c][j].rsplit("/", 1)[-1]


@DATASET_REGISTRY.register()
class VideoTestDataset(_ClipTestBase):
    """Test / validation for window networks (EDVR): one item per frame, the ``num_frame`` LQ frames around it
    (``padding`` at the clip ends) and its GT frame. Items: {'lq': (t, 3, h, w), 'gt': (3, H, W), 'folder',
    'idx': 'i/n', 'border', 'lq_path', 'clip', 'frames': [i], 'gray': False}."""

    video_kind = "test_window"
    needs_num_frame = True
    odd_num_frame = True

    def __init__(self, opt: Mapping[str, Any], key_path: str | None = None) -> None:
        super().__init__(opt, key_path)
        self.num_frame = int(opt["num_frame"])
        self.padding = str(opt["padding"])
        self.samples = [(c, i) for c, n in enumerate(self.clip_lengths) for i in range(n)]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: Any) -> dict[str, Any]:
        i, _ = self._split_index(index)
        c, j = self.samples[i]
        n = self.clip_lengths[c]
        window = frame_window(j, n, self.num_frame, self.padding)
        lq = self._stack([self._read("lq", self.lq_frames[c][k]) for k in window])
        half = self.num_frame // 2
        return {"lq": lq, "gt": img2tensor(self._gt_frame(self.clips[c].frames[j])), "folder": self.clip_names[c],
                "idx": f"{j}/{n}", "border": int(j < half or j >= n - half), "lq_path": self.lq_path(c, j),
                "clip": c, "frames": [j], "gray": False}


@DATASET_REGISTRY.register()
class VideoRecurrentTestDataset(_ClipTestBase):
    """Test / validation for recurrent networks: one item per clip, all its LQ and GT frames.
    Items: {'lq': (t, 3, h, w), 'gt': (t, 3, H, W), 'folder', 'lq_path' (first frame), 'clip', 'frames',
    'gray': False}."""

    video_kind = "test_clip"

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, index: Any) -> dict[str, Any]:
        c, _ = self._split_index(index)
        lq = self._stack([self._read("lq", k) for k in self.lq_frames[c]])
        gt = self._stack([self._gt_frame(k) for k in self.clips[c].frames])
        return {"lq": lq, "gt": gt, "folder": self.clip_names[c], "lq_path": self.lq_path(c, 0), "clip": c,
                "frames": list(range(self.clip_lengths[c])), "gray": False}


@DATASET_REGISTRY.register()
class VideoTestVimeo90KDataset(_VideoDataset):
    """Vimeo-90K test: per sequence of the meta info file, the ``num_frame`` LQ frames centred on im4 and the GT
    im4; all sequences form one clip 'vimeo90k' (scored on the centre frame, averaged over sequences)."""

    video_kind = "test_window"
    needs_num_frame = True
    odd_num_frame = True

    def __init__(self, opt: Mapping[str, Any], key_path: str | None = None) -> None:
        super().__init__(opt, key_path)
        if not opt["meta_info_file"]:
            raise DataError(f"{self.key_path}.meta_info_file: VideoTestVimeo90KDataset lists its sequences in a "
                            "meta info file (BasicSR's meta_info_Vimeo90K_test_GT.txt)")
        self.keys = [name for name, _ in self._clip_names_from_meta()]
        t = int(opt["num_frame"])
        self.neighbors = [k + (9 - t) // 2 for k in range(t)]
        self.clip_names = ["vimeo90k"]
        self.clip_lengths = [len(self.keys)]

    def __len__(self) -> int:
        return len(self.keys)

    def _check_pairs(self) -> list[tuple[str, str]]:
        return [(f"{k}/im4", f"{k}/im{j}") for k in self.keys for j in self.neighbors]

    def frame_name(self, c: int, j: int) -> str:
        """``<clip>_<seq>`` of sequence ``j`` (BasicSR's result names)."""
        del c
        return self.keys[j].replace("/", "_")

    def __getitem__(self, index: Any) -> dict[str, Any]:
        i, _ = self._split_index(index)
        key = self.keys[i]
        lq = self._stack([self._read("lq", f"{key}/im{j}") for j in self.neighbors])
        gt = self._read("gt", f"{key}/im4")
        if self.lq_backend is None:
            gt = mod_crop(gt, self.scale)
        return {"lq": lq, "gt": img2tensor(gt), "folder": "vimeo90k", "idx": f"{i}/{len(self.keys)}", "border": 0,
                "lq_path": self.describe("lq", f"{key}/im{self.neighbors[len(self.neighbors) // 2]}"), "clip": 0,
                "frames": [i], "gray": False}


__all__ = ["REDSDataset", "REDSRecurrentDataset", "Vimeo90KDataset", "Vimeo90KRecurrentDataset", "VideoTestDataset",
           "VideoRecurrentTestDataset", "VideoTestVimeo90KDataset", "bd_degrade", "bd_kernel", "degrade_frame",
           "frame_window"]

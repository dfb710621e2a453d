"""``PairedVideoDataset``: traiNNer-redux's dataset of the same name (its video templates' ``pairedvideodataset``),
on anysr's video dataset code (``anysr.data.video_datasets``: reading, backends, crops, flips, compression).

Layout (traiNNer-redux's): flat folders of frames, ``dataroot_lq`` and ``dataroot_gt`` (or lists of folders, paired
in order), the same file names on both sides; a frame's *scene* is its name up to the first ``_``
(``sceneA_0001.png``), its order the sorted name order. An item is ``num_frame`` (odd; traiNNer-redux's
``clip_size``, which the options map onto it) consecutive LQ frames of one scene and the GT of the middle one: every
window whose middle frame has a GT file is an item (GT files may be sparse). Training crops all frames at one place
(``gt_size``) and flips / rotates them alike; validation and tests take whole frames and score each middle frame
once (per scene, then averaged over scenes: anysr's clip evaluation).

Items: {'lq': (t, c, h, w), 'gt': (c, H, W), 'key', 'lq_path', 'gt_path'}; outside training also 'folder',
'idx', 'border', 'clip' (the scene's index), 'frames' ([the window's index in its scene]), 'gray'.
Randomness (crop, flips, reversal, compression) comes from the (index, seed) of the item only, as everywhere.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from anysr.data.file_backends import DiskBackend, is_image_file
from anysr.data.transforms import img2tensor, mod_crop
from anysr.data.video_datasets import FRAME_EXT, _VideoDataset
from anysr.errors import DataError
from anysr.registry import DATASET_REGISTRY

SCENE_SEPARATOR = "_"


class _FramesFolder(_VideoDataset):
    """One (LQ folder, GT folder) pair: its scenes and their windows."""

    video_kind = "window"

    def __init__(self, opt: Mapping[str, Any], key_path: str | None = None) -> None:
        super().__init__(opt, key_path)
        self.num_frame = int(opt["num_frame"])
        side = self.lq_backend if self.lq_backend is not None else self.gt_backend
        lq_keys = self._stems(side)
        gt_keys = set(self._stems(self.gt_backend)) if self.lq_backend is not None else set(lq_keys)
        scenes: dict[str, list[str]] = {}
        for key in lq_keys:
            scenes.setdefault(posixpath.basename(key).split(SCENE_SEPARATOR)[0], []).append(key)
        self.scene_names: list[str] = []
        self.windows: list[tuple[int, tuple[str, ...]]] = []  # (scene index, the window's frame keys)
        self.scene_lengths: list[int] = []
        for name, keys in scenes.items():
            found = [tuple(keys[s:s + self.num_frame]) for s in range(len(keys) - self.num_frame + 1)
                     if keys[s + self.num_frame // 2] in gt_keys]
            if found:
                self.windows += [(len(self.scene_names), w) for w in found]
                self.scene_names.append(name)
                self.scene_lengths.append(len(found))

    def _stems(self, backend: Any) -> list[str]:
        """The frame keys of a flat folder (file names without extension; the extension remembered), sorted."""
        if isinstance(backend, DiskBackend):
            if not os.path.isdir(backend.root):
                raise DataError(f"{self.key_path}: '{backend.root}' is not a folder of frames")
            names = sorted(n for n in os.listdir(backend.root) if is_image_file(n) and not n.startswith("."))
            keys = []
            for n in names:
                stem, ext = os.path.splitext(n)
                if ext != FRAME_EXT:
                    self._ext = {**self._ext, stem: ext}
                keys.append(stem)
            return keys
        return sorted(backend.keys())

    def _check_pairs(self) -> list[tuple[str, str]]:
        seen = {w[len(w) // 2]: w[0] for _, w in self.windows}
        return sorted(seen.items())

    def read_window(self, i: int, seed: int | None) -> tuple[torch.Tensor, torch.Tensor, str, str]:
        """LQ window and GT middle frame of window ``i`` (training: cropped, flipped, maybe reversed, compressed)."""
        _, keys = self.windows[i]
        gt_key = keys[len(keys) // 2]
        order = list(keys)
        lqs = [self._read("lq", k) for k in order]
        gt = self._read("gt", gt_key)
        if self.phase == "train":
            rng = np.random.default_rng(i if seed is None else seed)
            if self.random_reverse and rng.random() < 0.5:
                lqs.reverse()
            (gt,), lqs = self._crop_and_augment([gt], lqs, rng, gt_key, order[0])
            lqs = self._compress(lqs, i if seed is None else seed)
        elif self.lq_backend is None:
            gt = mod_crop(gt, self.scale)
        return self._stack(lqs), img2tensor(gt), self.describe("lq", gt_key), self.describe("gt", gt_key)


@DATASET_REGISTRY.register()
class PairedVideoDataset(Dataset):
    """traiNNer-redux's PairedVideoDataset (see the module docstring). ``dataroot_lq`` / ``dataroot_gt``: a folder or
    lists of folders (paired in order), read here as one dataset."""

    video_kind = "window"  # what the options' video rules read (training: a window and its GT centre frame)
    needs_num_frame = True
    odd_num_frame = True
    reads_folder_lists = True  # the loader hands it the lists (no per-folder union)

    def __init__(self, opt: Mapping[str, Any], key_path: str | None = None) -> None:
        self.key_path = key_path or f"datasets.{opt['phase']}"
        self.phase = str(opt["phase"])
        gts, lqs = opt["dataroot_gt"], opt.get("dataroot_lq")
        gts = list(gts) if isinstance(gts, (list, tuple)) else [gts]
        lqs = list(lqs) if isinstance(lqs, (list, tuple)) else [lqs] * len(gts)
        if len(lqs) != len(gts):
            raise DataError(f"{self.key_path}: dataroot_gt lists {len(gts)} folders and dataroot_lq {len(lqs)}; give "
                            "one LQ folder per GT folder, in the same order")
        self.folders = [_FramesFolder({**opt, "dataroot_gt": g, "dataroot_lq": q}, self.key_path)
                        for g, q in zip(gts, lqs)]
        self.items = [(f, i) for f, folder in enumerate(self.folders) for i in range(len(folder.windows))]
        if not self.items:
            raise DataError(f"{self.key_path}: no {opt['num_frame']}-frame window with a GT middle frame in "
                            f"{', '.join(map(str, lqs if lqs[0] else gts))} (scenes: the file names up to the "
                            f"first '{SCENE_SEPARATOR}'; each needs num_frame frames)")
        if self.phase != "train":
            self.video_kind = "test_window"  # scored per scene by the clip evaluation
        self.clip_names: list[str] = []
        self.clip_lengths: list[int] = []
        self._scene_base: list[int] = []
        for f, folder in enumerate(self.folders):
            self._scene_base.append(len(self.clip_names))
            prefix = f"{f}:" if len(self.folders) > 1 else ""
            self.clip_names += [prefix + n for n in folder.scene_names]
            self.clip_lengths += folder.scene_lengths

    @classmethod
    def sample_frames(cls, opt: Mapping[str, Any]) -> int | None:
        """Frames of one item's LQ input (``num_frame``)."""
        return int(opt["num_frame"]) if opt["num_frame"] else None

    def __len__(self) -> int:
        return len(self.items)

    def _locate(self, c: int, j: int) -> tuple[_FramesFolder, tuple[str, ...]]:
        f = max(k for k, base in enumerate(self._scene_base) if base <= c)
        folder = self.folders[f]
        scene = c - self._scene_base[f]
        windows = [w for s, w in folder.windows if s == scene]
        return folder, windows[j]

    def frame_name(self, c: int, j: int) -> str:
        """The file stem of the middle LQ frame of window ``j`` of scene ``c`` (results are saved under it)."""
        _, keys = self._locate(c, j)
        return posixpath.basename(keys[len(keys) // 2])

    def check(self, *, decode: bool, progress: bool = True) -> list[str]:
        return [p for folder in self.folders for p in folder.check(decode=decode, progress=progress)]

    def __getitem__(self, index: Any) -> dict[str, Any]:
        i, seed = (int(index[0]), int(index[1])) if isinstance(index, tuple) else (int(index), None)
        f, w = self.items[i]
        folder = self.folders[f]
        lq, gt, lq_path, gt_path = folder.read_window(w, seed)
        scene, keys = folder.windows[w]
        item: dict[str, Any] = {"lq": lq, "gt": gt, "key": keys[len(keys) // 2], "lq_path": lq_path,
                                "gt_path": gt_path}
        if self.phase != "train":
            c = self._scene_base[f] + scene
            j = sum(1 for s, _ in folder.windows[:w] if s == scene)
            item.update({"folder": self.clip_names[c], "idx": f"{j}/{self.clip_lengths[c]}", "border": 0,
                         "clip": c, "frames": [j], "gray": False})
        return item


__all__ = ["PairedVideoDataset"]

"""A few of the pairs the model trained on, kept at each validation for the report page.

At each validation the main rank writes crops of the first samples of the last micro-batch the model trained on
(after synthesis, pair pool and batch augmentations: what the losses compared), with no extra data loading:
``report_files/training_pairs/iter_<N>/<k>_gt.png`` and ``<k>_lq.png``, listed in
``report_files/training_pairs/index.json``. The count, the crop size and the number of validations kept are bounded
(older folders are removed), so the experiment folder stays small however long the run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from anysr.atomic import atomic_write_json
from anysr.data.imageio import write_image
from anysr.engine.report.history import CROPS_DIR

__all__ = ["PAIRS_DIR", "PAIRS_KEPT", "PAIRS_PER_VALIDATION", "PAIR_CROP", "frame_pair", "read_pair_index",
           "save_training_pairs"]

PAIRS_DIR = f"{CROPS_DIR}/training_pairs"
PAIRS_PER_VALIDATION = 4  # samples of the batch kept at each validation
PAIR_CROP = 128  # the GT crop's largest side, in pixels (the LQ crop is the same region)
PAIRS_KEPT = 8  # validations whose pairs are kept (the latest ones)


def frame_pair(lq: torch.Tensor, gt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Image batches (B, C, h, w) and (B, C, H, W) of a training batch; a clip batch gives its centre frames.

    ``lq`` (B, T, C, h, w) with ``gt`` (B, C, H, W) (the centre frame, EDVR), (B, T, C, H, W) (recurrent networks)
    or (B * T, C, H, W) (a clip's frames flattened, as GAN video models train on them)."""
    if lq.dim() == 5:
        b, t = int(lq.shape[0]), int(lq.shape[1])
        if gt.dim() == 5:
            gt = gt[:, t // 2]
        elif int(gt.shape[0]) == b * t and t > 1:
            gt = gt.reshape(b, t, *gt.shape[1:])[:, t // 2]
        lq = lq[:, t // 2]
    return lq, gt


def _to_image(t: torch.Tensor) -> np.ndarray:
    """A CHW tensor in [0, 1] as an 8-bit BGR (or gray) image."""
    arr = t.detach().float().clamp(0, 1).mul(255).round().to(torch.uint8).cpu().numpy()
    if arr.shape[0] == 1:
        return np.ascontiguousarray(arr[0])
    arr = arr[:3].transpose(1, 2, 0)
    return np.ascontiguousarray(arr[:, :, ::-1])


def read_pair_index(exp_dir: Path) -> list[dict[str, Any]]:
    """The entries of ``training_pairs/index.json`` (oldest first); ``[]`` when missing or unreadable."""
    path = Path(exp_dir) / PAIRS_DIR / "index.json"
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    entries = data.get("validations") if isinstance(data, dict) else None
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def save_training_pairs(exp_dir: Path, it: int, lq: torch.Tensor, gt: torch.Tensor, *,
                        count: int = PAIRS_PER_VALIDATION, crop: int = PAIR_CROP,
                        keep: int = PAIRS_KEPT) -> list[Path]:
    """Write centre crops of the first ``count`` pairs of a training batch (``lq``, ``gt`` as the losses saw them;
    clips: their centre frames) for iteration ``it``, and keep the latest ``keep`` validations' pairs.

    The GT crop is at most ``crop`` pixels a side, aligned to the scale (GT size / LQ size) so the LQ crop is the
    same region. Returns the files written."""
    lq, gt = frame_pair(lq, gt)
    if lq.dim() != 4 or gt.dim() != 4 or int(lq.shape[0]) == 0:
        return []
    n = min(count, int(lq.shape[0]), int(gt.shape[0]))
    lh, lw = int(lq.shape[-2]), int(lq.shape[-1])
    gh, gw = int(gt.shape[-2]), int(gt.shape[-1])
    scale = max(1, gh // max(1, lh))
    ch, cw = min(lh, max(1, crop // scale)), min(lw, max(1, crop // scale))  # LQ crop
    top, left = (lh - ch) // 2, (lw - cw) // 2
    lq_crop = lq[:n, :, top:top + ch, left:left + cw]
    gt_crop = gt[:n, :, top * scale:(top + ch) * scale, left * scale:(left + cw) * scale]
    root = Path(exp_dir) / PAIRS_DIR
    folder = root / f"iter_{int(it):08d}"
    written: list[Path] = []
    pairs = []
    for k in range(n):
        files = {}
        for role, t in (("gt", gt_crop[k]), ("lq", lq_crop[k])):
            name = f"{k}_{role}.png"
            written.append(write_image(folder / name, _to_image(t)))
            files[role] = f"{folder.name}/{name}"
        pairs.append({"batch_position": k, "files": files})
    entry = {"iter": int(it), "scale": scale, "lq_size": [lh, lw], "gt_size": [gh, gw],
             "box_lq": [top, left, ch, cw], "batch": int(lq.shape[0]), "pairs": pairs}
    entries = [e for e in read_pair_index(exp_dir) if e.get("iter") != int(it)] + [entry]
    entries.sort(key=lambda e: int(e.get("iter", 0)))
    dropped, entries = entries[:-keep], entries[-keep:]
    for e in dropped:
        old = root / f"iter_{int(e.get('iter', 0)):08d}"
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    written.append(atomic_write_json(root / "index.json", {"validations": entries}))
    return written

"""Tiny synthetic video datasets in BasicSR's layouts (REDS, Vimeo-90K, Vid4-style test folders, LMDB).

Frames are windows of a real photograph (Set14's baboon) that drift a pixel or two per frame, so there is motion
for flow networks to follow; LQ frames are MATLAB bicubic (BI) x4 of the GT frames.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from anysr.data.degradation.bicubic import bicubic_degrade
from anysr.data.imageio import read_image, write_image

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "datasets" / "Set14" / "HR" / "baboon.png"
SCALE = 4


def clip_frames(n: int, size: tuple[int, int], seed: int) -> list[np.ndarray]:
    """``n`` GT frames (h, w) cut from the source image along a drifting path (seeded)."""
    src = read_image(SOURCE)
    rng = np.random.default_rng(seed)
    h, w = size
    y, x = int(rng.integers(0, src.shape[0] - h - 3 * n)), int(rng.integers(0, src.shape[1] - w - 3 * n))
    dy, dx = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    return [np.ascontiguousarray(src[y + i * dy: y + i * dy + h, x + i * dx: x + i * dx + w]) for i in range(n)]


def make_reds(root: Path, clips: tuple[str, ...] = ("000", "001", "002"), frames: int = 6,
              size: tuple[int, int] = (64, 64)) -> dict[str, Path]:
    """REDS layout: GT/<clip>/<frame:08d>.png, LQ/<clip>/..., meta_info.txt ('<clip> <frames> (h,w,3)')."""
    gt, lq = root / "GT", root / "LQ"
    for k, clip in enumerate(clips):
        for i, img in enumerate(clip_frames(frames, size, seed=k)):
            write_image(gt / clip / f"{i:08d}.png", img)
            write_image(lq / clip / f"{i:08d}.png", bicubic_degrade(img, SCALE))
    meta = root / "meta_info.txt"
    meta.write_text("".join(f"{c} {frames} ({size[0]},{size[1]},3)\n" for c in clips))
    return {"gt": gt, "lq": lq, "meta": meta}


def make_vimeo(root: Path, seqs: tuple[str, ...] = ("00001/0001", "00001/0002", "00002/0001"),
               size: tuple[int, int] = (64, 64)) -> dict[str, Path]:
    """Vimeo-90K layout: GT/<clip>/<seq>/im1..im7.png, BIx4/..., meta_info.txt ('<clip>/<seq> 7 (h,w,3)')."""
    gt, lq = root / "GT", root / "BIx4"
    for k, seq in enumerate(seqs):
        for i, img in enumerate(clip_frames(7, size, seed=10 + k), start=1):
            write_image(gt / seq / f"im{i}.png", img)
            write_image(lq / seq / f"im{i}.png", bicubic_degrade(img, SCALE))
    meta = root / "meta_info.txt"
    meta.write_text("".join(f"{s} 7 ({size[0]},{size[1]},3)\n" for s in seqs))
    return {"gt": gt, "lq": lq, "meta": meta}


def make_lmdb(folder: Path, out: Path) -> Path:
    """Every PNG under ``folder`` (any depth) into ``out`` (.lmdb), keyed by its path without extension, with
    BasicSR's meta_info.txt: what BasicSR's create_lmdb makes of REDS / Vimeo-90K."""
    import lmdb

    files = sorted(folder.rglob("*.png"))
    env = lmdb.open(str(out), map_size=1 << 28)
    lines = []
    with env.begin(write=True) as txn:
        for p in files:
            key = p.relative_to(folder).with_suffix("").as_posix()
            img = read_image(p)
            ok, buf = cv2.imencode(".png", img, [cv2.IMWRITE_PNG_COMPRESSION, 1])
            assert ok
            txn.put(key.encode(), buf.tobytes())
            lines.append(f"{key}.png ({img.shape[0]},{img.shape[1]},{img.shape[2]}) 1\n")
    env.close()
    (out / "meta_info.txt").write_text("".join(lines))
    return out

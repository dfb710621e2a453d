"""``anysr eval``: PSNR / SSIM of a folder of SR images against a folder of ground truth (BasicSR numbers)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from anysr.atomic import atomic_write_json
from anysr.data.imageio import list_images, read_image
from anysr.errors import DataError, OptionError
from anysr.metrics.psnr_ssim import calculate_psnr, calculate_ssim
from anysr.ops.color import full_range_luma

__all__ = ["pair_by_stem", "evaluate_folders"]

PathLike = str | os.PathLike[str]
_MAX_LISTED = 10


def _listing(paths: list[str]) -> str:
    shown = ", ".join(paths[:_MAX_LISTED])
    return shown + (f" (and {len(paths) - _MAX_LISTED} more)" if len(paths) > _MAX_LISTED else "")


def pair_by_stem(gt_files: list[Path], sr_files: list[Path]) -> list[tuple[Path, Path]]:
    """Pair each SR file with the GT file whose stem equals its stem or is its prefix before ``_``.

    ``baby_x2.png`` and ``baby_bicubic.png`` both match ``baby.png``; the longest matching GT stem wins.
    Every file must find exactly one partner, else DataError naming the odd files.
    """
    gt_by_stem: dict[str, Path] = {}
    for g in gt_files:
        if g.stem in gt_by_stem:
            raise DataError(f"ground-truth files {gt_by_stem[g.stem]} and {g} share the stem '{g.stem}'; "
                            "keep one of them")
        gt_by_stem[g.stem] = g
    by_length = sorted(gt_by_stem, key=len, reverse=True)
    matched: dict[str, list[Path]] = {}
    orphans: list[str] = []
    for s in sr_files:
        hit = next((k for k in by_length if s.stem == k or s.stem.startswith(k + "_")), None)
        if hit is None:
            orphans.append(s.name)
        else:
            matched.setdefault(hit, []).append(s)
    problems = []
    if orphans:
        problems.append(f"SR files without a ground-truth image: {_listing(orphans)}")
    lonely = [gt_by_stem[k].name for k in gt_by_stem if k not in matched]
    if lonely:
        problems.append(f"ground-truth images without an SR file: {_listing(lonely)}")
    doubles = [f"{gt_by_stem[k].name} <- {', '.join(p.name for p in v)}"
               for k, v in matched.items() if len(v) > 1]
    if doubles:
        problems.append(f"ground-truth images matched by several SR files: {_listing(doubles)}")
    if problems:
        raise DataError("cannot pair the folders: " + "; ".join(problems) +
                        ". SR names must be '<gt stem>.<ext>' or '<gt stem>_<suffix>.<ext>'")
    return [(gt_by_stem[k], matched[k][0]) for k in sorted(matched)]


def _load(path: Path) -> np.ndarray:
    img = read_image(path)
    if img.dtype != np.uint8:
        raise DataError(f"image {path} has {img.dtype} pixels; the metrics need 8-bit images, "
                        "save it as an 8-bit PNG")
    if img.ndim == 3 and img.shape[2] == 4:
        img = img[..., :3]  # drop alpha
    if img.ndim == 3 and img.shape[2] == 1:
        img = img[..., 0]
    return img


def _align(gt: np.ndarray, sr: np.ndarray, scale: int, gt_path: Path, sr_path: Path) -> np.ndarray:
    """GT cropped (bottom / right) to SR's size when SR is smaller by fewer than ``scale`` pixels."""
    (gh, gw), (sh, sw) = gt.shape[:2], sr.shape[:2]
    if (gh, gw) == (sh, sw):
        return gt
    if 0 <= gh - sh < scale and 0 <= gw - sw < scale:
        return gt[:sh, :sw, ...]
    raise DataError(f"size mismatch: {sr_path} is {sw}x{sh} but {gt_path} is {gw}x{gh}; SR must have the GT "
                    f"size (or the GT size cropped to a multiple of scale={scale}); check the scale")


def _match_channels(gt: np.ndarray, sr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A gray image against a colour one: compare the gray values with the colour image's full-range luma."""
    if gt.ndim == 2 and sr.ndim == 3:
        return gt, full_range_luma(sr)
    if gt.ndim == 3 and sr.ndim == 2:
        return full_range_luma(gt), sr
    return gt, sr


def evaluate_folders(gt_dir: PathLike, sr_dir: PathLike, scale: int, crop_border: int | None = None,
                     y_channel: bool = True, json_path: PathLike | None = None, *,
                     echo: Callable[[str], Any] = print) -> dict[str, Any]:
    """PSNR and SSIM of every SR image against its ground truth, BasicSR's way; prints a table.

    Files pair by stem (see ``pair_by_stem``). ``crop_border`` defaults to ``scale``. GT is cropped to
    a multiple of ``scale`` when SR is that much smaller. With ``y_channel`` colour images are compared on
    MATLAB's Y; a grayscale image is its own Y, and a gray GT against a colour SR uses the SR's full-range
    luma. The last printed line is ``average PSNR=<dB> SSIM=<value> n=<count>``. Returns (and writes to
    ``json_path`` if given) a dict with ``psnr``, ``ssim``, ``n``, the settings and per-image ``images``.
    """
    if isinstance(scale, bool) or not isinstance(scale, int | np.integer) or scale < 1:
        raise OptionError(f"scale: must be a positive integer, got {scale!r}")
    border = int(scale) if crop_border is None else crop_border
    if isinstance(border, bool) or not isinstance(border, int | np.integer) or border < 0:
        raise OptionError(f"crop_border: must be an integer >= 0, got {crop_border!r}")
    gt_files, sr_files = list_images(gt_dir), list_images(sr_dir)
    for folder, files in ((gt_dir, gt_files), (sr_dir, sr_files)):
        if not files:
            raise DataError(f"image folder {folder} holds no image files; check the path")
    pairs = pair_by_stem(gt_files, sr_files)

    rows: list[dict[str, Any]] = []
    for gt_path, sr_path in pairs:
        gt, sr = _load(gt_path), _load(sr_path)
        gt, sr = _match_channels(_align(gt, sr, int(scale), gt_path, sr_path), sr)
        try:
            psnr = calculate_psnr(sr, gt, border, test_y_channel=y_channel)
            ssim = calculate_ssim(sr, gt, border, test_y_channel=y_channel)
        except DataError as exc:
            raise DataError(f"{sr_path} vs {gt_path}: {exc}") from exc
        rows.append({"name": sr_path.name, "gt": str(gt_path), "sr": str(sr_path),
                     "psnr": psnr, "ssim": ssim})

    n = len(rows)
    result: dict[str, Any] = {
        "psnr": float(np.mean([r["psnr"] for r in rows])),
        "ssim": float(np.mean([r["ssim"] for r in rows])),
        "n": n,
        "scale": int(scale),
        "crop_border": int(border),
        "y_channel": bool(y_channel),
        "gt_dir": str(gt_dir),
        "sr_dir": str(sr_dir),
        "images": rows,
    }
    width = max(len("image"), *(len(r["name"]) for r in rows))
    echo(f"GT {gt_dir}  SR {sr_dir}  scale={scale} crop_border={border} "
         f"channel={'Y' if y_channel else 'BGR'}")
    echo(f"{'image':<{width}}  {'PSNR':>8}  {'SSIM':>6}")
    for r in rows:
        echo(f"{r['name']:<{width}}  {r['psnr']:8.4f}  {r['ssim']:6.4f}")
    if json_path is not None:
        atomic_write_json(json_path, result)
    echo(f"average PSNR={result['psnr']:.4f} SSIM={result['ssim']:.4f} n={n}")
    return result

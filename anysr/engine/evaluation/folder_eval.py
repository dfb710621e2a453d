"""``anysr eval``: metrics of folders of results against a folder of ground truth, BasicSR's way.

PSNR / SSIM (numpy, BasicSR's numbers), NIQE (no-reference, on the result), LPIPS / DISTS (on the device of the
accelerator handed in; weights from files) per image, and FID (Inception features of the results against those
of the ground truth, or against a statistics file) per folder. Several result folders are compared side by side
in one table; per-image values go to JSON / CSV; ``report_path`` writes a page with the image viewer.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from anysr.atomic import atomic_write_bytes, atomic_write_json
from anysr.data.imageio import list_images, read_image
from anysr.engine.evaluation.eval_report import write_eval_report
from anysr.engine.evaluation.val_metrics import build_metric_module, read_fid_reference
from anysr.errors import AnysrError, DataError, OptionError, did_you_mean
from anysr.metrics.fid import calculate_fid, feature_statistics, fid_from_features
from anysr.metrics.info import METRIC_INFOS, metric_info
from anysr.metrics.niqe import calculate_niqe
from anysr.metrics.psnr_ssim import calculate_psnr, calculate_ssim
from anysr.ops.color import full_range_luma

__all__ = ["pair_by_stem", "evaluate_folders", "eval_worker", "METRIC_CHOICES", "parse_metrics"]

PathLike = str | os.PathLike[str]
_MAX_LISTED = 10


def _listing(paths: list[str]) -> str:
    shown = ", ".join(paths[:_MAX_LISTED])
    return shown + (f" (and {len(paths) - _MAX_LISTED} more)" if len(paths) > _MAX_LISTED else "")


def pair_by_stem(gt_files: list[Path], sr_files: list[Path], what: str = "the folders") -> list[tuple[Path, Path]]:
    """Pair each SR file with the GT file whose stem equals its stem or is its prefix before ``_``.

    ``baby_x2.png`` and ``baby_bicubic.png`` both match ``baby.png``; the longest matching GT stem wins.
    Every file must find exactly one partner, else DataError naming the odd files (and ``what`` was paired).
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
        raise DataError(f"cannot pair {what}: " + "; ".join(problems) +
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


METRIC_CHOICES = ("psnr", "ssim", "niqe", "lpips", "dists", "raw_dists", "topiq", "fid")
# Paired metrics run by a network on the device, and the flag naming each one's weight files
DEVICE_PAIRED = {"lpips": "--lpips-weights", "dists": "--dists-weights", "raw_dists": "--dists-weights",
                 "topiq": "--topiq-weights"}
DEVICE_METRICS = (*DEVICE_PAIRED, "fid")
_PER_IMAGE = ("psnr", "ssim", "niqe", "lpips", "dists", "raw_dists", "topiq")
_SHOWN = {"psnr": "PSNR", "ssim": "SSIM", "niqe": "NIQE", "lpips": "LPIPS", "dists": "DISTS",
          "raw_dists": "DISTS(raw)", "topiq": "TOPIQ", "fid": "FID"}
_WIDTH = {"psnr": 8, "ssim": 6, "niqe": 7, "lpips": 6, "dists": 6, "raw_dists": 10, "topiq": 6}
_DIGITS = {"psnr": 4, "ssim": 4, "niqe": 4, "lpips": 4, "dists": 4, "raw_dists": 4, "topiq": 4, "fid": 4}


def parse_metrics(text: str | Sequence[str]) -> list[str]:
    """``'psnr,ssim,niqe'`` (or a list of such) -> known short names in the given order (BasicSR names accepted)."""
    items = [t for part in ([text] if isinstance(text, str) else text) for t in str(part).split(",")]
    out: list[str] = []
    for item in (t.strip() for t in items):
        if not item:
            continue
        info = metric_info(item)
        if info is None:
            raise OptionError(f"--metrics: unknown metric '{item}'{did_you_mean(item, METRIC_CHOICES)}; "
                              f"choose from {', '.join(METRIC_CHOICES)}")
        if info.name not in out:
            out.append(info.name)
    if not out:
        raise OptionError(f"--metrics: name at least one of {', '.join(METRIC_CHOICES)}")
    return out


def _rgb_tensor(img: np.ndarray, border: int, device: torch.device) -> torch.Tensor:
    """An 8-bit image (HW gray or HWC BGR) as a (1, 3, H, W) RGB tensor on [0, 1], ``border`` pixels shaved."""
    if border:
        img = img[border:img.shape[0] - border, border:img.shape[1] - border, ...]
    arr = np.repeat(img[:, :, None], 3, axis=2) if img.ndim == 2 else img[:, :, ::-1]
    t = torch.from_numpy(np.ascontiguousarray(arr)).permute(2, 0, 1)[None].float().div_(255.0)
    return t.to(device)


def _labels(folders: Sequence[PathLike]) -> list[str]:
    names = [Path(f).name or str(f) for f in folders]
    return [n if names.count(n) == 1 else f"{n}[{i + 1}]" for i, n in enumerate(names)]


def evaluate_folders(gt_dir: PathLike, sr_dir: PathLike | Sequence[PathLike], scale: int,
                     crop_border: int | None = None, y_channel: bool = True, json_path: PathLike | None = None, *,
                     metrics: Sequence[str] = ("psnr", "ssim"), csv_path: PathLike | None = None,
                     report_path: PathLike | None = None, weights: Mapping[str, Sequence[PathLike]] | None = None,
                     lpips_net: str = "alex", fid_stats: PathLike | None = None, acc: Any = None,
                     echo: Callable[[str], Any] = print) -> dict[str, Any]:
    """Metrics of every SR image against its ground truth, BasicSR's way; prints a table.

    Files pair by stem (see ``pair_by_stem``). ``crop_border`` defaults to ``scale`` (FID uses whole images).
    GT is cropped to a multiple of ``scale`` when SR is that much smaller. With ``y_channel`` colour images are
    compared on MATLAB's Y; a grayscale image is its own Y, and a gray GT against a colour SR uses the SR's
    full-range luma. ``metrics``: any of ``METRIC_CHOICES``; LPIPS, DISTS and FID need ``weights[name]`` (files)
    and run on ``acc``'s device (the CPU without one). ``sr_dir``: one folder, or several compared side by side.

    One folder: the last printed line is ``average PSNR=<dB> SSIM=<value> n=<count>`` (with the chosen metrics);
    returns (and writes to ``json_path``) a dict with each metric's average, ``n``, the settings and per-image
    ``images``. Several folders: one table, one ``average <folder>: ...`` line each; returns ``{'results': [one
    such dict per folder], ...}``. ``csv_path``: one row per folder and image; ``report_path``: an HTML page with
    the averages and an image viewer (centre crops of every result and the ground truth).
    """
    if isinstance(scale, bool) or not isinstance(scale, int | np.integer) or scale < 1:
        raise OptionError(f"scale: must be a positive integer, got {scale!r}")
    border = int(scale) if crop_border is None else crop_border
    if isinstance(border, bool) or not isinstance(border, int | np.integer) or border < 0:
        raise OptionError(f"crop_border: must be an integer >= 0, got {crop_border!r}")
    chosen = parse_metrics(list(metrics))
    folders = [sr_dir] if isinstance(sr_dir, str | os.PathLike) else list(sr_dir)
    if not folders:
        raise OptionError("--sr: give at least one results folder")
    gt_files = list_images(gt_dir)
    if not gt_files:
        raise DataError(f"image folder {gt_dir} holds no image files; check the path")
    models = _metric_models(chosen, weights or {}, lpips_net, fid_stats, acc)
    device = acc.device if acc is not None else torch.device("cpu")
    gt_feats: np.ndarray | None = None
    results = []
    pairs_per_folder = []
    for out_path, flag in ((json_path, "--json"), (csv_path, "--csv"), (report_path, "--report")):
        _check_output(out_path, flag)
    all_pairs = []
    for folder in folders:  # every folder paired before any is scored
        sr_files = list_images(folder)
        if not sr_files:
            raise DataError(f"image folder {folder} holds no image files; check the path")
        all_pairs.append(pair_by_stem(gt_files, sr_files, f"--sr {folder} with --gt {gt_dir}"))
    for folder, pairs in zip(folders, all_pairs):
        rows, sr_feats, gf = _score_folder(pairs, chosen, models, int(scale), int(border), y_channel, device,
                                           need_gt_feats=gt_feats is None)
        if "fid" in chosen and gt_feats is None:
            gt_feats = gf
        result: dict[str, Any] = {k: float(np.mean([r[k] for r in rows])) for k in chosen if k in _PER_IMAGE}
        if "fid" in chosen:
            result["fid"] = _fid(sr_feats, gt_feats, models["fid_stats"], folder)
        result.update({"n": len(rows), "scale": int(scale), "crop_border": int(border), "y_channel": bool(y_channel),
                       "metrics": chosen, "gt_dir": str(gt_dir), "sr_dir": str(folder), "images": rows})
        results.append(result)
        pairs_per_folder.append(pairs)
    labels = _labels(folders)
    _print_table(results, labels, chosen, gt_dir, scale, border, y_channel, echo)
    out: dict[str, Any] = results[0] if len(results) == 1 else {
        "gt_dir": str(gt_dir), "scale": int(scale), "crop_border": int(border), "y_channel": bool(y_channel),
        "metrics": chosen, "labels": labels, "results": results}
    _print_averages(results, labels, chosen, echo)
    if json_path is not None:
        echo(f"wrote {atomic_write_json(json_path, out)}")
    if csv_path is not None:
        echo(f"wrote {_write_csv(csv_path, results, labels, chosen)}")
    if report_path is not None:
        echo(f"wrote {write_eval_report(report_path, results, labels, chosen, pairs_per_folder, int(scale))}")
    return out


def _check_output(path: PathLike | None, flag: str) -> None:
    """Refuse, before any scoring, an output path that cannot be written: a folder, or a file on the way."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise DataError(f"{flag} {p}: is a folder; give a file name")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise DataError(f"{flag} {p}: {parent} is a file, not a folder; fix the path")
            return


def _metric_models(chosen: list[str], weights: Mapping[str, Sequence[PathLike]], lpips_net: str,
                   fid_stats: PathLike | None, acc: Any) -> dict[str, Any]:
    models: dict[str, Any] = {"fid_stats": None}
    device = acc.device if acc is not None else torch.device("cpu")
    flags = {**DEVICE_PAIRED, "fid": "--fid-weights"}
    for name in DEVICE_METRICS:
        if name not in chosen:
            continue
        given = weights.get(name) or (weights.get("dists") if name == "raw_dists" else None)
        files = list(given or [])  # none: the standard files, found by name (TOPIQ: refused, it has none)
        models[name] = build_metric_module(METRIC_INFOS[name], files, net=lpips_net, where=flags[name]).to(device)
    if "fid" in chosen and fid_stats is not None:
        models["fid_stats"] = read_fid_reference(fid_stats, "--fid-stats")
    return models


def _score_folder(pairs: list[tuple[Path, Path]], chosen: list[str], models: dict[str, Any], scale: int,
                  border: int, y_channel: bool, device: torch.device,
                  need_gt_feats: bool) -> tuple[list[dict[str, Any]], np.ndarray | None, np.ndarray | None]:
    rows: list[dict[str, Any]] = []
    sr_feats, gt_feats = [], []
    paired = bool({"psnr", "ssim", *DEVICE_PAIRED} & set(chosen))
    for gt_path, sr_path in pairs:
        sr_raw = _load(sr_path)
        gt_raw = _load(gt_path) if paired or (need_gt_feats and models["fid_stats"] is None) else None
        if paired:  # FID and NIQE compare no pixels: any sizes
            gt, sr = _match_channels(_align(gt_raw, sr_raw, scale, gt_path, sr_path), sr_raw)
        row: dict[str, Any] = {"name": sr_path.name, "gt": str(gt_path), "sr": str(sr_path)}
        try:
            if "psnr" in chosen:
                row["psnr"] = calculate_psnr(sr, gt, border, test_y_channel=y_channel)
            if "ssim" in chosen:
                row["ssim"] = calculate_ssim(sr, gt, border, test_y_channel=y_channel)
            if "niqe" in chosen:
                row["niqe"] = calculate_niqe(sr_raw, border, input_order="HWC", convert_to="y")
            with torch.no_grad():
                for name in DEVICE_PAIRED:
                    if name in chosen:
                        x, y = _rgb_tensor(sr, border, device), _rgb_tensor(gt, border, device)
                        row[name] = float(models[name](x, y).reshape(-1)[0].cpu())
                if "fid" in chosen:
                    sr_feats.append(models["fid"](_rgb_tensor(sr_raw, 0, device)).double().cpu().numpy())
                    if need_gt_feats and models["fid_stats"] is None:
                        gt_feats.append(models["fid"](_rgb_tensor(gt_raw, 0, device)).double().cpu().numpy())
        except AnysrError as exc:
            raise DataError(f"{sr_path} vs {gt_path}: {exc}") from exc
        rows.append(row)
    return (rows, np.concatenate(sr_feats) if sr_feats else None,
            np.concatenate(gt_feats) if gt_feats else None)


def _fid(sr_feats: np.ndarray | None, gt_feats: np.ndarray | None, stats: tuple[np.ndarray, np.ndarray] | None,
         folder: PathLike) -> float:
    if sr_feats is None or len(sr_feats) < 2:
        raise DataError(f"FID of {folder}: needs at least 2 images")
    if stats is not None:
        return calculate_fid(*feature_statistics(sr_feats), *stats)
    assert gt_feats is not None
    return fid_from_features(sr_feats, gt_feats)


def _fmt(key: str, value: float) -> str:
    return f"{value:{_WIDTH.get(key, 8)}.{_DIGITS[key]}f}"


def _print_table(results: list[dict[str, Any]], labels: list[str], chosen: list[str], gt_dir: PathLike,
                 scale: int, border: int, y_channel: bool, echo: Callable[[str], Any]) -> None:
    per_image = [k for k in chosen if k in _PER_IMAGE]
    sr_text = results[0]["sr_dir"] if len(results) == 1 else ", ".join(r["sr_dir"] for r in results)
    echo(f"GT {gt_dir}  SR {sr_text}  scale={scale} crop_border={border} channel={'Y' if y_channel else 'BGR'}")
    if not per_image:
        return
    names = [r["name"] for r in results[0]["images"]]
    width = max(len("image"), *(len(n) for n in names))
    if len(results) == 1:
        echo(f"{'image':<{width}}  " + "  ".join(f"{_SHOWN[k]:>{_WIDTH[k]}}" for k in per_image))
        for r in results[0]["images"]:
            echo(f"{r['name']:<{width}}  " + "  ".join(_fmt(k, r[k]) for k in per_image))
        return
    cols = [(k, j) for k in per_image for j in range(len(results))]
    heads = [f"{_SHOWN[k]}[{labels[j]}]" for k, j in cols]
    widths = [max(len(h), _WIDTH[k]) for h, (k, _) in zip(heads, cols)]
    echo(f"{'image':<{width}}  " + "  ".join(f"{h:>{w}}" for h, w in zip(heads, widths)))
    for i in range(len(names)):
        cells = [f"{results[j]['images'][i][k]:{w}.{_DIGITS[k]}f}" for (k, j), w in zip(cols, widths)]
        echo(f"{Path(results[0]['images'][i]['gt']).stem:<{width}}  " + "  ".join(cells))


def _print_averages(results: list[dict[str, Any]], labels: list[str], chosen: list[str],
                    echo: Callable[[str], Any]) -> None:
    for r, label in zip(results, labels):
        values = " ".join(f"{_SHOWN[k]}={r[k]:.{_DIGITS[k]}f}" for k in chosen)
        echo(f"average {values} n={r['n']}" if len(results) == 1 else f"average {label}: {values} n={r['n']}")


def _write_csv(path: PathLike, results: list[dict[str, Any]], labels: list[str], chosen: list[str]) -> Path:
    per_image = [k for k in chosen if k in _PER_IMAGE]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["folder", "image", "gt", "sr", *per_image])
    for r, label in zip(results, labels):
        for row in r["images"]:
            w.writerow([label, row["name"], row["gt"], row["sr"], *(f"{row[k]:.6f}" for k in per_image)])
        extra = {k: r[k] for k in chosen}
        w.writerow([label, "(average)", r["gt_dir"], r["sr_dir"], *(f"{extra[k]:.6f}" for k in per_image)])
        if "fid" in chosen:
            w.writerow([label, f"(fid {r['fid']:.6f})", r["gt_dir"], r["sr_dir"], *([""] * len(per_image))])
    return atomic_write_bytes(path, buf.getvalue().encode("utf-8"))


def eval_worker(acc: Any, gt_dir: PathLike, sr_dir: PathLike | Sequence[PathLike], scale: int,
                kwargs: dict[str, Any]) -> dict[str, Any]:
    """``anysr eval`` on one worker of an accelerator (LPIPS, DISTS and FID run on its device)."""
    return evaluate_folders(gt_dir, sr_dir, scale, acc=acc, **kwargs)

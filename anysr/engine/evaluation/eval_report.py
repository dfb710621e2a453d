"""``anysr eval --report``: one page comparing result folders (averages, and the image viewer of ``anysr report``)."""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from anysr.atomic import atomic_write_bytes
from anysr.data.imageio import read_image
from anysr.engine.report.page import (
    Layer,
    ViewerItem,
    html_table,
    page,
    png_data_uri,
    relative_link,
    thumbnail_uri,
    viewer_html,
)
from anysr.metrics.info import METRIC_INFOS

__all__ = ["write_eval_report", "CROP_SIDE"]

CROP_SIDE = 128
_SHOWN = {"psnr": "PSNR", "ssim": "SSIM", "niqe": "NIQE", "lpips": "LPIPS", "dists": "DISTS", "fid": "FID"}


def _rgb(path: Path) -> np.ndarray:
    img = read_image(path, flag="color")
    if img.dtype != np.uint8:
        img = (img // 257).astype(np.uint8)
    return np.ascontiguousarray(img[:, :, ::-1])


def _centre(img: np.ndarray, h: int, w: int) -> np.ndarray:
    """The centre crop (at most CROP_SIDE a side) of the top-left (h, w) of ``img``."""
    ch, cw = min(CROP_SIDE, h), min(CROP_SIDE, w)
    top, left = (h - ch) // 2, (w - cw) // 2
    return np.ascontiguousarray(img[top:top + ch, left:left + cw])


def write_eval_report(path: str | os.PathLike[str], results: Sequence[dict[str, Any]], labels: Sequence[str],
                      metrics: Sequence[str], pairs: Sequence[Sequence[tuple[Path, Path]]], scale: int) -> Path:
    """Write the comparison page: a table of averages per folder, and per image the centre crops of every
    folder's result and of the ground truth (the slider goes through them in that order)."""
    out = Path(path)
    if out.suffix.lower() not in (".html", ".htm"):
        out = out / "report.html" if out.is_dir() or not out.suffix else out
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [[html.escape(label), *(f"{r[k]:.4f}" for k in metrics), str(r["n"]), html.escape(r["sr_dir"])]
            for label, r in zip(labels, results)]
    head = ["folder", *(f"{_SHOWN[k]} ({'&darr;' if METRIC_INFOS[k].better == 'lower' else '&uarr;'})"
                        for k in metrics), "n", "path"]
    items = []
    first_gt = str(results[0]["gt_dir"])
    group = "ground truth " + "/".join(Path(first_gt).resolve().parts[-2:])
    by_gt = [{str(g): s for g, s in folder_pairs} for folder_pairs in pairs]
    for i, (gt_path, _) in enumerate(pairs[0]):
        gt = _rgb(gt_path)
        layers, links, values = [], [], {}
        size = None
        for label, found, r in zip(labels, by_gt, results):
            sr_path = found[str(gt_path)]
            sr = _rgb(sr_path)
            size = size or (min(sr.shape[0], gt.shape[0]), min(sr.shape[1], gt.shape[1]))
            layers.append(Layer(label, png_data_uri(_centre(sr, *size))))
            links.append((label, relative_link(sr_path, out.parent)))
            row = r["images"][i]
            bits = [f"{_SHOWN[k]} {row[k]:.4f}" for k in metrics if k in row]
            if bits:
                values[label] = ", ".join(bits)
        assert size is not None
        layers.append(Layer("ground truth", png_data_uri(_centre(gt, *size))))
        links.append(("ground truth", relative_link(gt_path, out.parent)))
        items.append(ViewerItem(gt_path.stem, group, layers, thumbnail_uri(gt_path), links, values,
                                note=f"centre crop of at most {CROP_SIDE} pixels, x{scale}"))
    first = results[0]
    compared = ", ".join(labels)
    names = ", ".join(_SHOWN[k] for k in metrics)
    how = f"{'on the Y channel' if first['y_channel'] else 'on RGB'}, crop_border {first['crop_border']}"
    folders = " &middot; ".join(f"{html.escape(label)}: {html.escape(str(r['sr_dir']))}"
                                for label, r in zip(labels, results))
    n = len(pairs[0])
    body = (f"<h1>anysr eval: {html.escape(compared)} against the ground truth (x{scale})</h1>"
            f"<p class=\"muted\">ground truth: {html.escape(str(first['gt_dir']))} &middot; {folders} &middot; "
            f"{html.escape(names)} {how}</p>"
            f"<h2>Averages over {n} image{'s' if n != 1 else ''}: {html.escape(names)}</h2>"
            f"{html_table(head, rows, left=1)}"
            f"<h2>Per image: {html.escape(compared)} and the ground truth (centre crops, x{scale})</h2>"
            f"{viewer_html(items, group_notes={group: f'all {n} images of {first_gt}'})}")
    atomic_write_bytes(out, page(f"anysr eval: {', '.join(labels)} (x{scale})", body).encode("utf-8"))
    return out

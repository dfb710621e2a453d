"""A run's history, its validation crops, and ``report.html``: one self-contained page to look at a run.

* ``History``: the losses at every report and the metrics at every validation, kept by the trainer in
  ``<experiment>/history.json`` (written atomically at validations, saves and the end; on resume the entries after
  the resumed iteration are dropped, so a replayed stretch is not counted twice).
* ``save_crops``: the fixed centre crops of the validation images (LQ, MATLAB bicubic, result, ground truth) as
  PNGs in ``<experiment>/report_files/<dataset>/``, with ``index.json`` saying what they are; the result crop is the
  latest validation's.
* ``write_report``: ``<experiment>/report.html``: loss and metric curves (inline SVG), the best-checkpoint table,
  and a per-image viewer (``viewer_html``): bicubic, result and ground truth side by side with synchronised zoom
  and pan, and a slider that blends between them on a larger canvas. Images are embedded as data URIs (small
  crops and thumbnails); full-size images are linked by relative paths. No script, style or font is fetched:
  the page works offline from the file system (a Content-Security-Policy forbids any network access).

The page reads files on disk that an older version or an interrupted run may have left incomplete (not options),
so its lookups there are tolerant (``.get`` with a default) and a missing piece only leaves a section empty.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from anysr.atomic import atomic_write_bytes, atomic_write_json
from anysr.data.imageio import read_image, write_image
from anysr.errors import DataError, OptionError

__all__ = ["History", "save_crops", "write_report", "viewer_html", "ViewerItem", "Layer", "png_data_uri",
           "REPORT_NAME", "HISTORY_NAME", "CROPS_DIR"]

REPORT_NAME = "report.html"
HISTORY_NAME = "history.json"
CROPS_DIR = "report_files"
THUMB_SIDE = 96
_LOWER = ("niqe", "lpips", "dists", "fid")


# --------------------------------------------------------------------------------------------- history
class History:
    """Losses per report and metrics per validation, in iteration order."""

    def __init__(self) -> None:
        self.train: list[dict[str, Any]] = []
        self.val: list[dict[str, Any]] = []

    def add_train(self, it: int, epoch: int, lr: float, losses: Mapping[str, float]) -> None:
        self.train.append({"iter": int(it), "epoch": int(epoch), "lr": float(lr),
                           "losses": {k: float(v) for k, v in losses.items()}})

    def add_val(self, it: int, dataset: str, metrics: Mapping[str, float], better: Mapping[str, str]) -> None:
        self.val.append({"iter": int(it), "dataset": dataset, "metrics": {k: float(v) for k, v in metrics.items()},
                         "better": dict(better)})

    def truncate(self, it: int) -> None:
        """Forget what came after iteration ``it`` (a resumed run replays it)."""
        self.train = [e for e in self.train if e["iter"] <= it]
        self.val = [e for e in self.val if e["iter"] <= it]

    def to_dict(self) -> dict[str, Any]:
        return {"version": 1, "train": self.train, "val": self.val}

    def save(self, exp_dir: Path) -> Path:
        return atomic_write_json(exp_dir / HISTORY_NAME, self.to_dict())

    @classmethod
    def load(cls, exp_dir: Path) -> History:
        """The history of an experiment folder (empty when there is none yet)."""
        h = cls()
        path = exp_dir / HISTORY_NAME
        if path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise DataError(f"{path} cannot be read ({exc}); delete it (only the report's curves use it)") \
                    from None
            h.train = [e for e in data.get("train", []) if isinstance(e, dict) and "iter" in e]
            h.val = [e for e in data.get("val", []) if isinstance(e, dict) and "iter" in e]
        return h


# --------------------------------------------------------------------------------------------- crops
def _bgr(rgb: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rgb[:, :, ::-1])


def save_crops(exp_dir: Path, dataset: str, crops: Sequence[Any], it: int, sr_dir: Path | None = None,
               suffix: str | None = None) -> None:
    """Write one validation's crops (``evaluator.ImageCrop``) and update ``report_files/index.json``.

    ``sr_dir`` / ``suffix``: where this validation saved full results (``val.save_img``), to link them.
    """
    if not crops:
        return
    root = exp_dir / CROPS_DIR
    folder = root / _safe(dataset)
    index_path = root / "index.json"
    index: dict[str, Any] = {}
    if index_path.is_file():
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            index = {}
    entries = []
    for c in crops:
        files = {}
        for layer in ("lq", "bicubic", "sr", "gt"):
            img = getattr(c, layer)
            if img is None:
                continue
            name = f"{_safe(c.name)}_{layer}.png"
            write_image(folder / name, _bgr(img))
            files[layer] = f"{_safe(dataset)}/{name}"
        full_sr = ""
        if sr_dir is not None:
            candidate = sr_dir / (f"{c.name}_{suffix}.png" if suffix else f"{c.name}.png")
            full_sr = str(candidate) if candidate.is_file() else ""
        entries.append({"name": c.name, "index": c.index, "box": list(c.box), "files": files,
                        "lq_path": c.lq_path, "gt_path": c.gt_path, "sr_path": full_sr})
    index[dataset] = {"iter": int(it), "images": entries}
    atomic_write_json(index_path, index)


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in str(name)) or "_"


# --------------------------------------------------------------------------------------------- HTML pieces
def png_data_uri(img: np.ndarray) -> str:
    """An RGB (or gray) uint8 image as a ``data:image/png;base64`` URI."""
    arr = np.asarray(img)
    ok, buf = cv2.imencode(".png", _bgr(arr) if arr.ndim == 3 else arr, [cv2.IMWRITE_PNG_COMPRESSION, 9])
    if not ok:
        raise DataError(f"cannot encode an image of shape {arr.shape} as PNG")
    return "data:image/png;base64," + base64.b64encode(buf.tobytes()).decode("ascii")


def _jpeg_data_uri(img_bgr: np.ndarray, quality: int = 85) -> str:
    ok, buf = cv2.imencode(".jpg", img_bgr, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise DataError("cannot encode a thumbnail")
    return "data:image/jpeg;base64," + base64.b64encode(buf.tobytes()).decode("ascii")


def thumbnail_uri(path: str | os.PathLike[str] | None, fallback: np.ndarray | None = None) -> str:
    """A small JPEG thumbnail of an image file (or of ``fallback``, RGB) as a data URI; '' when neither works."""
    img = None
    if path:
        try:
            img = read_image(path, flag="color")
        except (DataError, OSError):
            img = None
    if img is None and fallback is not None:
        img = _bgr(fallback)
    if img is None:
        return ""
    if img.dtype != np.uint8:
        img = (img / 257).astype(np.uint8)
    h, w = img.shape[:2]
    f = THUMB_SIDE / max(h, w)
    if f < 1:
        img = cv2.resize(img, (max(1, round(w * f)), max(1, round(h * f))), interpolation=cv2.INTER_AREA)
    return _jpeg_data_uri(img)


def relative_link(target: str | os.PathLike[str], start: Path) -> str:
    """A link from a page in ``start`` to ``target`` (relative when possible, else a file: URI)."""
    t = Path(target).resolve()
    try:
        return Path(os.path.relpath(t, start.resolve())).as_posix()
    except ValueError:  # another drive (Windows)
        return t.as_uri()


@dataclass
class Layer:
    """One image of a viewer item: its label and a data URI (all layers of an item have one size)."""

    label: str
    src: str


@dataclass
class ViewerItem:
    """One image in the viewer: name, group (dataset or folder), layers in slider order, links, metric values."""

    name: str
    group: str
    layers: list[Layer]
    thumb: str = ""
    links: list[tuple[str, str]] = field(default_factory=list)
    values: dict[str, str] = field(default_factory=dict)
    note: str = ""


_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1200px;
padding:16px;color:#222;background:#fafafa}
h1{font-size:22px;margin:4px 0 2px}h2{font-size:18px;margin:24px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f0f0f0}td.l,th.l{text-align:left}.muted{color:#777}.charts{display:flex;flex-wrap:wrap;gap:12px}
.chart{background:#fff;border:1px solid #ddd;padding:4px}.chart h3{font-size:13px;margin:2px 4px}
.thumbs{display:flex;flex-wrap:wrap;gap:6px;margin:6px 0}.thumb{border:2px solid transparent;cursor:pointer;
background:#fff;padding:2px;text-align:center;font-size:11px}.thumb.sel{border-color:#1f6feb}
.thumb img{display:block;max-width:96px;max-height:96px}.panes{display:flex;gap:8px;flex-wrap:wrap}
.pane{text-align:center}canvas{background:#222;image-rendering:pixelated;cursor:grab;display:block}
.controls{margin:8px 0;display:flex;gap:8px;align-items:center;flex-wrap:wrap}
.controls input[type=range]{width:320px}#slider-label{min-width:220px;display:inline-block}
"""

_JS = r"""
(function(){
  'use strict';
  const data = JSON.parse(document.getElementById('viewer-data').textContent);
  const items = data.items;
  if (!items.length) return;
  const paneCanvases = Array.from(document.querySelectorAll('canvas.layer'));
  const cmp = document.getElementById('compare');
  const slider = document.getElementById('slider');
  const label = document.getElementById('slider-label');
  const zoomText = document.getElementById('zoom');
  const info = document.getElementById('item-info');
  const view = {zoom: 1, cx: 0, cy: 0};
  let current = null, images = [];

  function load(i) {
    current = items[i];
    document.querySelectorAll('.thumb').forEach(function(t){ t.classList.toggle('sel', +t.dataset.i === i); });
    const layers = current.layers;
    images = layers.map(function(l){ const im = new Image(); im.src = l.src; return im; });
    let pending = images.length;
    images.forEach(function(im){
      const done = function(){ if (--pending === 0) { reset(); } };
      if (im.complete && im.naturalWidth) { done(); } else { im.onload = done; im.onerror = done; }
    });
    slider.max = String((layers.length - 1) * 100);
    slider.value = String(Math.min(+slider.value, +slider.max));
    paneCanvases.forEach(function(c, k){
      const pane = c.parentElement;
      pane.style.display = k < layers.length ? '' : 'none';
      pane.querySelector('.pane-label').textContent = k < layers.length ? layers[k].label : '';
    });
    info.innerHTML = current.info;
  }
  function reset() {
    const im = images[0];
    view.cx = im.naturalWidth / 2; view.cy = im.naturalHeight / 2;
    view.zoom = Math.max(1, Math.floor(Math.min(paneCanvases[0].width / im.naturalWidth,
                                                paneCanvases[0].height / im.naturalHeight)));
    draw();
  }
  function blit(ctx, im, alpha) {
    const c = ctx.canvas;
    ctx.imageSmoothingEnabled = false;
    ctx.globalAlpha = alpha;
    ctx.setTransform(view.zoom, 0, 0, view.zoom, c.width / 2 - view.cx * view.zoom, c.height / 2 - view.cy * view.zoom);
    ctx.drawImage(im, 0, 0);
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.globalAlpha = 1;
  }
  function clear(ctx) { ctx.fillStyle = '#222'; ctx.fillRect(0, 0, ctx.canvas.width, ctx.canvas.height); }
  function draw() {
    if (!current) return;
    paneCanvases.forEach(function(c, k){
      const ctx = c.getContext('2d'); clear(ctx);
      if (k < images.length) blit(ctx, images[k], 1);
    });
    const s = +slider.value / 100, lo = Math.min(Math.floor(s), images.length - 1);
    const t = lo + 1 < images.length ? s - lo : 0;
    const ctx = cmp.getContext('2d'); clear(ctx);
    blit(ctx, images[lo], 1);
    if (t > 0 && lo + 1 < images.length) blit(ctx, images[lo + 1], t);
    const names = current.layers.map(function(l){ return l.label; });
    label.textContent = t > 0 && lo + 1 < names.length
      ? names[lo] + ' \u2192 ' + names[lo + 1] + ' (' + Math.round(t * 100) + '%)' : names[lo];
    zoomText.textContent = view.zoom.toFixed(view.zoom < 1 ? 2 : 1) + '\u00d7';
  }
  function zoomAt(f) { view.zoom = Math.min(64, Math.max(0.25, view.zoom * f)); draw(); }
  const all = paneCanvases.concat([cmp]);
  all.forEach(function(c){
    c.addEventListener('wheel', function(e){ e.preventDefault(); zoomAt(e.deltaY < 0 ? 1.25 : 0.8); },
                       {passive: false});
    let drag = null;
    c.addEventListener('mousedown', function(e){ drag = {x: e.clientX, y: e.clientY}; c.style.cursor = 'grabbing'; });
    window.addEventListener('mouseup', function(){ drag = null; c.style.cursor = 'grab'; });
    window.addEventListener('mousemove', function(e){
      if (!drag) return;
      view.cx -= (e.clientX - drag.x) / view.zoom; view.cy -= (e.clientY - drag.y) / view.zoom;
      drag = {x: e.clientX, y: e.clientY}; draw();
    });
  });
  document.getElementById('zoom-in').addEventListener('click', function(){ zoomAt(2); });
  document.getElementById('zoom-out').addEventListener('click', function(){ zoomAt(0.5); });
  document.getElementById('zoom-reset').addEventListener('click', reset);
  slider.addEventListener('input', draw);
  document.querySelectorAll('.thumb').forEach(function(t){
    t.addEventListener('click', function(){ load(+t.dataset.i); });
  });
  load(0);
})();
"""


def viewer_html(items: Sequence[ViewerItem], canvas_side: int = 256) -> str:
    """The per-image viewer: thumbnails per group, one pane per layer (synchronised zoom / pan: wheel or the
    buttons, drag to pan), and a larger canvas whose slider blends from one layer to the next."""
    if not items:
        return '<p class="muted">No validation images yet (set val.log_images > 0 and validate once).</p>'
    n_layers = max(len(i.layers) for i in items)
    data = {"items": [{"name": it.name, "layers": [{"label": layer.label, "src": layer.src} for layer in it.layers],
                       "info": _item_info(it)} for it in items]}
    parts = []
    groups: dict[str, list[int]] = {}
    for k, it in enumerate(items):
        groups.setdefault(it.group, []).append(k)
    for group, ks in groups.items():
        parts.append(f"<h3>{html.escape(group)}</h3><div class=\"thumbs\">")
        for k in ks:
            it = items[k]
            img = f'<img alt="{html.escape(it.name)}" src="{it.thumb}">' if it.thumb else ""
            parts.append(f'<div class="thumb" data-i="{k}" title="{html.escape(it.name)}">{img}'
                         f"{html.escape(it.name)}</div>")
        parts.append("</div>")
    panes = "".join(f'<div class="pane"><canvas class="layer" width="{canvas_side}" height="{canvas_side}">'
                    f'</canvas><div class="pane-label"></div></div>' for _ in range(n_layers))
    big = canvas_side * 2
    payload = json.dumps(data).replace("</", "<\\/")
    return (f'<div id="viewer">{"".join(parts)}<div id="item-info"></div>'
            f'<div class="controls"><button id="zoom-out" type="button">&minus;</button>'
            f'<button id="zoom-in" type="button">+</button><button id="zoom-reset" type="button">fit</button>'
            f'<span id="zoom"></span><span class="muted">wheel: zoom, drag: pan (all views together)</span></div>'
            f'<div class="panes">{panes}</div>'
            f'<div class="controls"><input id="slider" type="range" min="0" max="{(n_layers - 1) * 100}" '
            f'step="1" value="100"><span id="slider-label"></span></div>'
            f'<canvas id="compare" width="{big}" height="{big}"></canvas></div>'
            f'<script type="application/json" id="viewer-data">{payload}</script><script>{_JS}</script>')


def _item_info(it: ViewerItem) -> str:
    bits = [f"<b>{html.escape(it.name)}</b> <span class=\"muted\">{html.escape(it.group)}</span>"]
    if it.values:
        bits.append(" &middot; ".join(f"{html.escape(k)} {html.escape(v)}" for k, v in it.values.items()))
    if it.links:
        bits.append("full size: " + ", ".join(f'<a href="{html.escape(href)}">{html.escape(lbl)}</a>'
                                              for lbl, href in it.links))
    if it.note:
        bits.append(f'<span class="muted">{html.escape(it.note)}</span>')
    return " &nbsp;|&nbsp; ".join(bits)


def page(title: str, body: str) -> str:
    """A whole self-contained page (inline style and script; no network access allowed)."""
    csp = ("default-src 'none'; img-src data: file:; style-src 'unsafe-inline'; script-src 'unsafe-inline'")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>{body}</body></html>\n")


# --------------------------------------------------------------------------------------------- charts
_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def _fmt(v: float) -> str:
    if v == 0 or not math.isfinite(v):
        return str(v)
    return f"{v:.3g}" if abs(v) < 1e-2 or abs(v) >= 1e4 else f"{v:.4g}"


def svg_chart(title: str, series: Mapping[str, Sequence[tuple[float, float]]], *, log_y: bool = False,
              width: int = 360, height: int = 200) -> str:
    """A small line chart as inline SVG (x: iteration), one polyline per series, with its legend."""
    pts = {k: [(float(x), float(y)) for x, y in v if math.isfinite(float(y)) and (not log_y or float(y) > 0)]
           for k, v in series.items()}
    pts = {k: v for k, v in pts.items() if v}
    if not pts:
        return ""
    xs = [x for v in pts.values() for x, _ in v]
    ys = [math.log10(y) if log_y else y for v in pts.values() for _, y in v]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - (abs(y0) * 0.05 or 1), y1 + (abs(y1) * 0.05 or 1)
    left, right, top, bottom = 52, 8, 8, 22
    pw, ph = width - left - right, height - top - bottom

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        v = math.log10(y) if log_y else y
        return top + (1 - (v - y0) / (y1 - y0)) * ph

    shown_y = (10 ** y0, 10 ** y1) if log_y else (y0, y1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">',
           f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#ccc"/>',
           f'<text x="{left - 4}" y="{top + 10}" font-size="10" text-anchor="end">{_fmt(shown_y[1])}</text>',
           f'<text x="{left - 4}" y="{top + ph}" font-size="10" text-anchor="end">{_fmt(shown_y[0])}</text>',
           f'<text x="{left}" y="{height - 6}" font-size="10">{int(x0)}</text>',
           f'<text x="{left + pw}" y="{height - 6}" font-size="10" text-anchor="end">{int(x1)}</text>']
    for k, (name, v) in enumerate(pts.items()):
        colour = _COLOURS[k % len(_COLOURS)]
        if len(v) == 1:
            out.append(f'<circle cx="{px(v[0][0]):.1f}" cy="{py(v[0][1]):.1f}" r="3" fill="{colour}"/>')
        else:
            line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in v)
            out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{line}"/>')
        out.append(f'<text x="{left + 6}" y="{top + 12 + 12 * k}" font-size="10" fill="{colour}">'
                   f"{html.escape(name)}{' (log)' if log_y and k == 0 else ''}</text>")
    out.append("</svg>")
    return f'<div class="chart"><h3>{html.escape(title)}</h3>{"".join(out)}</div>'


# --------------------------------------------------------------------------------------------- the run's page
def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _best_rows(summary: Mapping[str, Any], history: History, exp_dir: Path) -> list[list[str]]:
    rows = []
    validation = summary.get("validation") or {}
    for dataset, metrics in validation.items():
        for metric, slot in metrics.items():
            best, best_iter = slot.get("best"), slot.get("best_iter")
            better = next((e["better"].get(metric) for e in reversed(history.val)
                           if e["dataset"] == dataset and metric in e.get("better", {})), None)
            better = better or ("lower" if metric.lower() in _LOWER else "higher")
            weights = exp_dir / "models" / f"net_g_{best_iter}.safetensors"
            link = (f'<a href="{html.escape(relative_link(weights, exp_dir))}">{html.escape(weights.name)}</a>'
                    if best_iter is not None and weights.is_file() else '<span class="muted">not kept</span>')
            rows.append([html.escape(dataset), html.escape(metric), better,
                         _fmt(best) if best is not None else "", str(best_iter if best_iter is not None else ""),
                         link, _fmt(slot.get("value")) if slot.get("value") is not None else ""])
    return rows


def html_table(head: Sequence[str], rows: Iterable[Sequence[str]], left: int = 2) -> str:
    th = "".join(f'<th class="{"l" if i < left else ""}">{h}</th>' for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(f'<td class="{"l" if i < left else ""}">{c}</td>' for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def _curves(history: History) -> str:
    charts = []
    losses: dict[str, list[tuple[float, float]]] = {}
    lrs: list[tuple[float, float]] = []
    for e in history.train:
        for k, v in e.get("losses", {}).items():
            losses.setdefault(k, []).append((e["iter"], v))
        lrs.append((e["iter"], e.get("lr", 0.0)))
    if losses:
        positive = all(y > 0 for v in losses.values() for _, y in v)
        charts.append(svg_chart("training losses", losses, log_y=positive))
    if lrs:
        charts.append(svg_chart("learning rate", {"lr": lrs}))
    per_metric: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for e in history.val:
        for k, v in e.get("metrics", {}).items():
            per_metric.setdefault(k, {}).setdefault(e["dataset"], []).append((e["iter"], v))
    for metric, series in per_metric.items():
        charts.append(svg_chart(f"validation {metric}", series))
    charts = [c for c in charts if c]
    if not charts:
        return '<p class="muted">No reports yet.</p>'
    return f'<div class="charts">{"".join(charts)}</div>'


def _run_items(exp_dir: Path) -> list[ViewerItem]:
    root = exp_dir / CROPS_DIR
    index = _read_json(root / "index.json")
    items = []
    for dataset, block in index.items():
        it = block.get("iter")
        for e in block.get("images", []):
            files = e.get("files", {})
            layers = []
            for key, label in (("bicubic", "bicubic"), ("sr", f"result (iter {it})"), ("gt", "ground truth")):
                if key in files and (root / files[key]).is_file():
                    img = read_image(root / files[key], flag="color")
                    layers.append(Layer(label, png_data_uri(img[:, :, ::-1])))
            if not layers:
                continue
            links = []
            for label, key in (("result", "sr_path"), ("ground truth", "gt_path"), ("input", "lq_path")):
                if e.get(key) and Path(e[key]).is_file():
                    links.append((label, relative_link(e[key], exp_dir)))
            top, left, h, w = e.get("box", [0, 0, 0, 0])
            thumb = thumbnail_uri(e.get("gt_path") or e.get("lq_path") or None)
            items.append(ViewerItem(e.get("name", "?"), dataset, layers, thumb, links,
                                    note=f"crop {w}x{h} at ({left}, {top})"))
    return items


def write_report(exp_dir: str | os.PathLike[str]) -> Path:
    """Write ``<exp_dir>/report.html`` from the folder's summary.json, history.json and report_files/."""
    exp = Path(exp_dir)
    if not exp.is_dir():
        raise OptionError(f"{exp} is not an experiment folder; give experiments/<name> (or the run's name)")
    summary = _read_json(exp / "summary.json")
    history = History.load(exp)
    if not summary and not history.train and not (exp / CROPS_DIR / "index.json").is_file():
        raise DataError(f"{exp} holds no summary.json, history.json or validation crops: is it an anysr "
                        "experiment folder that has trained at least one report interval?")
    name = summary.get("name") or exp.name
    acc = summary.get("accelerator") or {}
    head = [f"<h1>{html.escape(str(name))}</h1>",
            '<p class="muted">'
            + " &middot; ".join(html.escape(str(x)) for x in (
                f"iteration {summary.get('iterations_done', '?')} / {summary.get('total_iter', '?')}",
                "finished" if summary.get("finished") else "in progress or stopped",
                f"{acc.get('kind', '?')} x{acc.get('world_size', '?')}, {acc.get('precision', '?')}",
                f"{summary['wall_time_s']:.0f} s" if isinstance(summary.get("wall_time_s"), int | float) else ""))
            + "</p>"]
    best = _best_rows(summary, history, exp)
    body = "".join(head)
    body += "<h2>Best checkpoints</h2>" + (
        html_table(["dataset", "metric", "better", "best", "at iteration", "weights", "last"], best)
        if best else '<p class="muted">No validation yet.</p>')
    body += "<h2>Curves</h2>" + _curves(history)
    body += "<h2>Validation images</h2>" + viewer_html(_run_items(exp))
    out = exp / REPORT_NAME
    atomic_write_bytes(out, page(f"{name} - anysr report", body).encode("utf-8"))
    return out

"""The pieces of anysr's self-contained HTML pages (``anysr report``, ``anysr eval --report``): embedded images,
the image viewer (``viewer_html``: bicubic, result and ground truth side by side with synchronised zoom and pan,
and a slider that blends between them on a larger canvas), SVG charts, tables and the page shell. Images are
embedded as data URIs (small crops and thumbnails); full-size images are linked by relative paths. No script,
style or font is fetched: a page works offline from the file system (a Content-Security-Policy forbids any
network access)."""

from __future__ import annotations

import base64
import html
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from anysr.data.imageio import read_image
from anysr.errors import DataError

__all__ = ["Layer", "ViewerItem", "format_number", "html_table", "page", "png_data_uri", "relative_link",
           "svg_chart", "thumbnail_uri", "viewer_html"]

THUMB_SIDE = 96


def _bgr(rgb: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rgb[:, :, ::-1])


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
h1{font-size:22px;margin:4px 0 2px}h2{font-size:18px;margin:16px 0 6px;border-bottom:1px solid #ddd}h3{margin:8px 0 4px}
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f0f0f0}td.l,th.l{text-align:left}.muted{color:#777}.charts{display:flex;flex-wrap:wrap;gap:12px}
.chart{background:#fff;border:1px solid #ddd;padding:4px}.chart h3{font-size:13px;margin:2px 4px}
.thumbs{display:flex;gap:6px;margin:4px 0;overflow-x:auto;padding-bottom:2px}
.thumb{border:2px solid transparent;cursor:pointer;flex:none;
background:#fff;padding:2px;text-align:center;font-size:11px}.thumb.sel{border-color:#1f6feb}
.tbox{display:flex;align-items:center;justify-content:center;width:72px;height:72px}
.thumb img{display:block;max-width:72px;max-height:72px}.thumb .cap{display:block;width:72px;overflow:hidden;
text-overflow:ellipsis;white-space:nowrap}.panes{display:flex;gap:8px;flex-wrap:wrap}
.pane{text-align:center}canvas{background:#222;image-rendering:pixelated;cursor:grab;display:block;max-width:100%}
.shown{margin:0 0 4px}
.pairs{display:flex;flex-wrap:wrap;gap:10px;margin:6px 0}.pair{margin:0;background:#fff;border:1px solid #ddd;
padding:4px;font-size:11px;text-align:center}.pair img{image-rendering:pixelated;margin:0 1px;max-width:45vw;
height:auto}details.pairs-at summary{cursor:pointer;margin:4px 0}
.controls{margin:4px 0;display:flex;gap:8px;align-items:center;flex-wrap:wrap}
.controls input[type=range]{width:320px;max-width:100%}#slider-label{min-width:220px;display:inline-block;
font-weight:600;margin-left:12px}
.end{font-size:12px;color:#555}nav.sections{margin:4px 0 0}nav.sections a{margin-right:12px}
"""

_JS = r"""
(function(){
  'use strict';
  const data = JSON.parse(document.getElementById('viewer-data').textContent);
  const items = data.items;
  if (!items.length) return;
  const viewer = document.getElementById('viewer');
  const paneCanvases = Array.from(document.querySelectorAll('canvas.layer'));
  const cmp = document.getElementById('compare');
  const slider = document.getElementById('slider');
  const label = document.getElementById('slider-label');
  const ends = [document.getElementById('slider-lo'), document.getElementById('slider-hi')];
  const zoomText = document.getElementById('zoom');
  const info = document.getElementById('item-info');
  // view.zoom is relative to each canvas's fit scale (1: the whole crop fills every canvas); cx, cy: image pixels
  const view = {zoom: 1, cx: 0, cy: 0};
  const fit = new Map();
  let current = null, images = [];

  // the scale that fits a w x h image in a box (whole pixels when it is enlarged, so pixels stay square)
  function fitScale(w, h, bw, bh) {
    const s = Math.min(bw / w, bh / h);
    return s >= 1 ? Math.floor(s) : s;
  }
  // canvases take the crop's aspect: the panes fit a PANE box, the slider view the page's width (and height)
  function layout() {
    if (!images.length || !images[0].naturalWidth) return;
    const w = images[0].naturalWidth, h = images[0].naturalHeight;
    const ps = fitScale(w, h, data.pane, data.pane);
    paneCanvases.forEach(function(c){
      c.width = Math.max(1, Math.round(w * ps)); c.height = Math.max(1, Math.round(h * ps)); fit.set(c, ps);
    });
    const avail = Math.max(64, Math.min(viewer.clientWidth || data.big, data.big));
    const tall = Math.max(160, Math.min(data.big, window.innerHeight - 140));
    const cs = fitScale(w, h, avail, tall);
    cmp.width = Math.max(1, Math.round(w * cs)); cmp.height = Math.max(1, Math.round(h * cs)); fit.set(cmp, cs);
  }
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
    ends[0].textContent = layers[0].label;
    ends[1].textContent = layers[layers.length - 1].label;
    slider.title = 'blends ' + layers.map(function(l){ return l.label; }).join(' \u2192 ');
    paneCanvases.forEach(function(c, k){
      const pane = c.parentElement;
      pane.style.display = k < layers.length ? '' : 'none';
      pane.querySelector('.pane-label').textContent = k < layers.length ? layers[k].label : '';
    });
    info.innerHTML = current.info;
  }
  function reset() {
    const im = images[0];
    view.cx = im.naturalWidth / 2; view.cy = im.naturalHeight / 2; view.zoom = 1;
    layout();
    draw();
  }
  function scaleOf(c) { return (fit.get(c) || 1) * view.zoom; }
  function blit(ctx, im, alpha) {
    const c = ctx.canvas, z = scaleOf(c);
    ctx.imageSmoothingEnabled = false;
    ctx.globalAlpha = alpha;
    ctx.setTransform(z, 0, 0, z, c.width / 2 - view.cx * z, c.height / 2 - view.cy * z);
    ctx.drawImage(im, 0, 0);
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.globalAlpha = 1;
  }
  function clear(ctx) { ctx.fillStyle = '#222'; ctx.fillRect(0, 0, ctx.canvas.width, ctx.canvas.height); }
  function draw() {
    if (!current || !images.length) return;
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
    const z = scaleOf(paneCanvases[0]);
    zoomText.textContent = z.toFixed(z < 1 ? 2 : 1) + '\u00d7';
  }
  function zoomAt(f) { view.zoom = Math.min(32, Math.max(0.125, view.zoom * f)); draw(); }
  const all = paneCanvases.concat([cmp]);
  let drag = null;
  all.forEach(function(c){
    c.addEventListener('wheel', function(e){ e.preventDefault(); zoomAt(e.deltaY < 0 ? 1.25 : 0.8); },
                       {passive: false});
    c.addEventListener('mousedown', function(e){
      drag = {c: c, x: e.clientX, y: e.clientY}; c.style.cursor = 'grabbing';
    });
  });
  window.addEventListener('mouseup', function(){ if (drag) drag.c.style.cursor = 'grab'; drag = null; });
  window.addEventListener('mousemove', function(e){
    if (!drag) return;
    const r = drag.c.getBoundingClientRect(), z = scaleOf(drag.c) * r.width / drag.c.width;
    view.cx -= (e.clientX - drag.x) / z; view.cy -= (e.clientY - drag.y) / z;
    drag.x = e.clientX; drag.y = e.clientY; draw();
  });
  window.addEventListener('resize', function(){ layout(); draw(); });
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


def viewer_html(items: Sequence[ViewerItem], canvas_side: int = 256,
                group_notes: Mapping[str, str] | None = None) -> str:
    """The per-image viewer: thumbnails per group (each with its ``group_notes`` line, e.g. how many of the
    dataset's images are shown), one pane per layer (synchronised zoom / pan: wheel or the buttons, drag to pan),
    and a larger canvas whose slider blends from one layer to the next (its ends are named beside it). Every
    canvas takes the crop's aspect and fits it: the panes a ``canvas_side`` box, the slider view the page's width
    (at most ``3 * canvas_side``)."""
    if not items:
        return '<p class="muted">No validation images yet (set val.log_images > 0 and validate once).</p>'
    notes = group_notes or {}
    n_layers = max(len(i.layers) for i in items)
    data = {"pane": canvas_side, "big": 3 * canvas_side,
            "items": [{"name": it.name, "layers": [{"label": layer.label, "src": layer.src} for layer in it.layers],
                       "info": _item_info(it)} for it in items]}
    parts = []
    groups: dict[str, list[int]] = {}
    for k, it in enumerate(items):
        groups.setdefault(it.group, []).append(k)
    for group, ks in groups.items():
        parts.append(f"<h3>{html.escape(group)}</h3>")
        if notes.get(group):
            parts.append(f'<p class="muted shown">{html.escape(notes[group])}</p>')
        parts.append('<div class="thumbs">')
        for k in ks:
            it = items[k]
            img = f'<img alt="{html.escape(it.name)}" src="{it.thumb}">' if it.thumb else ""
            parts.append(f'<div class="thumb" data-i="{k}" title="{html.escape(it.name)}">'
                         f'<span class="tbox">{img}</span><span class="cap">{html.escape(it.name)}</span></div>')
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
            f'<div class="controls"><label for="slider">blend</label><span class="end" id="slider-lo"></span>'
            f'<input id="slider" type="range" min="0" max="{(n_layers - 1) * 100}" step="1" value="100">'
            f'<span class="end" id="slider-hi"></span><span id="slider-label"></span></div>'
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


def format_number(v: float) -> str:
    """A number as the pages show it (3 to 4 significant digits)."""
    if v == 0 or not math.isfinite(v):
        return str(v)
    return f"{v:.3g}" if abs(v) < 1e-2 or abs(v) >= 1e4 else f"{v:.4g}"


def _legend_rows(names: Sequence[str], width: int) -> list[list[tuple[int, str, int]]]:
    """Legend entries (series index, name, x) in rows that fit ``width`` (10-pixel text, about 6 pixels a character)."""
    rows: list[list[tuple[int, str, int]]] = [[]]
    x = 0
    for k, name in enumerate(names):
        w = 22 + 6 * len(name) + 12
        if rows[-1] and x + w > width:
            rows.append([])
            x = 0
        rows[-1].append((k, name, x))
        x += w
    return rows


def svg_chart(title: str, series: Mapping[str, Sequence[tuple[float, float]]], *, log_y: bool = False,
              width: int = 360, height: int = 212, x_title: str = "iteration", y_title: str = "",
              grid: int = 4) -> str:
    """A small line chart as inline SVG, one polyline per series, with axis titles (``x_title``, ``y_title``:
    the chart's title when empty) and a ``grid`` x ``grid`` grid whose lines are labelled on the axes; the
    legend sits below the plot area (never over the lines), in as many rows as it needs."""
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
    left, right, top, bottom = 66, 10, 8, 34
    pw, ph = width - left - right, height - top - bottom
    legend = _legend_rows(list(pts), width - left - right)
    full_height = height + 14 * len(legend) + 2
    y_title = y_title or title

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        v = math.log10(y) if log_y else y
        return top + (1 - (v - y0) / (y1 - y0)) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{full_height}" role="img">',
           '<g class="grid" stroke="#eee">']
    labels = []
    for i in range(grid + 1):  # evenly spaced in the drawn scale (decades apart on a log axis)
        v = y0 + (y1 - y0) * i / grid
        y = top + (1 - i / grid) * ph
        if 0 < i < grid:
            out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}"/>')
        labels.append(f'<text x="{left - 4}" y="{y + 3:.1f}" font-size="10" text-anchor="end">'
                      f'{format_number(10 ** v if log_y else v)}</text>')
    shown_x: set[int] = set()
    for i in range(grid + 1):
        v = round(x0 + (x1 - x0) * i / grid)
        if v in shown_x or not x0 <= v <= x1:
            continue
        shown_x.add(v)
        x = px(v)
        if x0 < v < x1:
            out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}"/>')
        labels.append(f'<text x="{x:.1f}" y="{top + ph + 12}" font-size="10" text-anchor="middle">{v}</text>')
    out.append("</g>")
    out.append(f'<rect class="plot" x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#bbb"/>')
    out.extend(labels)
    out.append(f'<text class="x-title" x="{left + pw / 2:.1f}" y="{height - 4}" font-size="10" '
               f'text-anchor="middle" fill="#555">{html.escape(x_title)}</text>')
    out.append(f'<text class="y-title" x="0" y="0" font-size="10" text-anchor="middle" fill="#555" '
               f'transform="translate(12,{top + ph / 2:.1f}) rotate(-90)">'
               f'{html.escape(y_title + (" (log)" if log_y else ""))}</text>')
    for k, v in enumerate(pts.values()):
        colour = _COLOURS[k % len(_COLOURS)]
        if len(v) == 1:
            out.append(f'<circle cx="{px(v[0][0]):.1f}" cy="{py(v[0][1]):.1f}" r="3" fill="{colour}"/>')
        else:
            line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in v)
            out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{line}"/>')
    out.append('<g class="legend">')
    for r, row in enumerate(legend):
        y = height + 14 * r + 8
        for k, name, x in row:
            colour = _COLOURS[k % len(_COLOURS)]
            out.append(f'<line x1="{left + x}" y1="{y - 3}" x2="{left + x + 16}" y2="{y - 3}" stroke="{colour}" '
                       f'stroke-width="2"/><text x="{left + x + 20}" y="{y}" font-size="10" fill="{colour}">'
                       f"{html.escape(name)}</text>")
    out.append("</g></svg>")
    shown_title = f"{title} (log scale)" if log_y else title
    return f'<div class="chart"><h3>{html.escape(shown_title)}</h3>{"".join(out)}</div>'


def html_table(head: Sequence[str], rows: Iterable[Sequence[str]], left: int = 2) -> str:
    th = "".join(f'<th class="{"l" if i < left else ""}">{h}</th>' for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(f'<td class="{"l" if i < left else ""}">{c}</td>' for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"

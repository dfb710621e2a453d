"""``anysr report``: ``<experiment>/report.html``, one self-contained page to look at a training run: the
best-checkpoint table, the viewer of the validation crops, loss and metric curves (inline SVG), the NaN
recoveries and the training pairs saved at each validation.

The page reads files on disk that an older version or an interrupted run may have left incomplete (not options),
so its lookups there are tolerant (``.get`` with a default) and a missing piece only leaves a section empty.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from anysr.atomic import atomic_write_bytes
from anysr.data.imageio import read_image
from anysr.engine.report.history import CROPS_DIR, History
from anysr.engine.report.page import (
    Layer,
    ViewerItem,
    format_number,
    html_table,
    page,
    png_data_uri,
    relative_link,
    svg_chart,
    thumbnail_uri,
    viewer_html,
)
from anysr.engine.report.pair_samples import PAIRS_DIR, read_pair_index
from anysr.errors import DataError, OptionError
from anysr.metrics.info import metric_info

__all__ = ["REPORT_NAME", "find_experiment", "write_report"]

REPORT_NAME = "report.html"


def find_experiment(name: str) -> Path:
    """``anysr report``'s argument: an experiment folder, or a run's name under ./experiments."""
    folder = Path(name)
    if not folder.is_dir() and not any(sep in name for sep in "/\\"):
        folder = Path("experiments") / name  # a run's name
    if not folder.is_dir():
        raise OptionError(f"{name}: no such experiment folder; give experiments/<name> or a run's name "
                          "(looked in ./experiments)")
    return folder


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
            info = metric_info(metric)
            better = better or (info.better if info is not None else "higher")
            weights = exp_dir / "models" / f"net_g_{best_iter}.safetensors"
            link = (f'<a href="{html.escape(relative_link(weights, exp_dir))}">{html.escape(weights.name)}</a>'
                    if best_iter is not None and weights.is_file() else '<span class="muted">not kept</span>')
            rows.append([html.escape(dataset), html.escape(metric), better,
                         format_number(best) if best is not None else "",
                         str(best_iter if best_iter is not None else ""), link,
                         format_number(slot.get("value")) if slot.get("value") is not None else ""])
    return rows


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
        charts.append(svg_chart("training losses", losses, log_y=positive, y_title="loss"))
    if lrs:
        charts.append(svg_chart("learning rate", {"lr": lrs}, y_title="lr"))
    per_metric: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for e in history.val:
        for k, v in e.get("metrics", {}).items():
            per_metric.setdefault(k, {}).setdefault(e["dataset"], []).append((e["iter"], v))
    for metric, series in per_metric.items():
        charts.append(svg_chart(f"validation {metric}", series, y_title=metric))
    charts = [c for c in charts if c]
    if not charts:
        return '<p class="muted">No reports yet.</p>'
    return f'<div class="charts">{"".join(charts)}</div>'


def _shown_note(block: Mapping[str, Any], shown: int) -> str:
    """How many of a dataset's images the page shows, e.g. '8 of 14 images (val.log_images: 8)'."""
    count, log_images = block.get("count"), block.get("log_images")
    limit = f" (val.log_images: {log_images})" if isinstance(log_images, int) else ""
    if not isinstance(count, int):  # an index.json from before the count was kept
        return f"{shown} image{'s' if shown != 1 else ''}, the dataset's first{limit}"
    if shown < count:
        return f"{shown} of {count} images{limit}"
    return f"all {count} images"


def _made_from_gt(entry: Mapping[str, Any]) -> bool:
    """Whether a logged crop's input path is its ground truth's (the LQ was synthesised from it)."""
    lq, gt = entry.get("lq_path"), entry.get("gt_path")
    return bool(lq and gt) and os.path.realpath(lq) == os.path.realpath(gt)


def _run_items(exp_dir: Path) -> tuple[list[ViewerItem], dict[str, str]]:
    """The viewer's items (one per logged validation crop) and, per dataset, how many of its images they are."""
    root = exp_dir / CROPS_DIR
    index = _read_json(root / "index.json")
    items: list[ViewerItem] = []
    notes: dict[str, str] = {}
    for dataset, block in index.items():
        it = block.get("iter")
        before = len(items)
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
            note = f"crop {w}x{h} at ({left}, {top})"
            if _made_from_gt(e):  # the dataset synthesised its LQ from the GT: no input file of its own to open
                links = [link for link in links if link[0] != "input"]
                note += "; the input was made from the ground truth"
            thumb = thumbnail_uri(e.get("gt_path") or e.get("lq_path") or None)
            items.append(ViewerItem(e.get("name", "?"), dataset, layers, thumb, links, note=note))
        if len(items) > before:
            notes[dataset] = _shown_note(block, len(items) - before)
    return items, notes


def _pair_figures(exp_dir: Path, entry: Mapping[str, Any]) -> str:
    """One validation's training pairs: GT and the LQ upscaled to it (nearest neighbour, drawn pixelated)."""
    root = exp_dir / PAIRS_DIR
    scale = entry.get("scale", 1) if isinstance(entry.get("scale"), int) else 1
    figs = []
    for pair in entry.get("pairs", []):
        files = pair.get("files", {}) if isinstance(pair, dict) else {}
        imgs = {}
        for role in ("gt", "lq"):
            path = root / str(files.get(role, ""))
            try:
                imgs[role] = read_image(path, flag="color")[:, :, ::-1] if role in files and path.is_file() else None
            except (DataError, OSError):
                imgs[role] = None
        gt, lq = imgs["gt"], imgs["lq"]
        if gt is None or lq is None:
            continue
        h, w = gt.shape[:2]
        cells = [f'<img class="pair-gt" src="{png_data_uri(gt)}" width="{w}" height="{h}" alt="GT">',
                 f'<img class="pair-lq" src="{png_data_uri(lq)}" width="{w}" height="{h}" alt="LQ">']
        figs.append(f'<figure class="pair">{"".join(cells)}<figcaption>sample {pair.get("batch_position", "?")}: '
                    f'GT | LQ x{scale} ({lq.shape[1]}x{lq.shape[0]} upscaled)</figcaption></figure>')
    return f'<div class="pairs">{"".join(figs)}</div>' if figs else ""


def _training_pairs(exp_dir: Path) -> str:
    """The pairs the model trained on, saved at each validation: the latest open, the earlier ones folded."""
    entries = sorted(read_pair_index(exp_dir), key=lambda e: int(e.get("iter", 0)), reverse=True)
    blocks = []
    for e in entries:
        figs = _pair_figures(exp_dir, e)
        if not figs:
            continue
        batch = e.get("batch", "?")
        title = (f"iteration {e.get('iter', '?')}: {len(e.get('pairs', []))} of the batch's {batch} pairs, "
                 "centre crops")
        blocks.append(f'<details class="pairs-at" data-iter="{html.escape(str(e.get("iter", "")))}"'
                      f'{" open" if not blocks else ""}><summary>{html.escape(title)}</summary>{figs}</details>')
    if not blocks:
        return '<p class="muted">No training pairs yet (they are saved at each validation).</p>'
    return ('<p class="muted">What the losses compared at the last step before each validation (after synthesis, '
            'pair pool and batch augmentations); the LQ is drawn upscaled to the GT (nearest neighbour).</p>'
            + "".join(blocks))


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
    items, notes = _run_items(exp)
    # the viewer comes right after the best checkpoints (it is what a laptop's first screen should show)
    sections = [("best", "Best checkpoints",
                 html_table(["dataset", "metric", "better", "best", "at iteration", "weights", "last"], best)
                 if best else '<p class="muted">No validation yet.</p>'),
                ("images", "Validation images", viewer_html(items, group_notes=notes)),
                ("curves", "Curves", _curves(history))]
    if history.events:
        sections.append(("nan", "NaN recoveries", html_table(
            ["non-finite at iteration", "what", "rolled back to", "batch skipped", "lr factor", "recovery"],
            [[str(e.get("iter", "")), html.escape(str(e.get("what", ""))), str(e.get("rolled_back_to", "")),
              str(e.get("skipped_batch", "")), format_number(e["lr_factor"]) if "lr_factor" in e else "",
              f"{e.get('retry', '?')} / {e.get('max_retries', '?')}"] for e in history.events])))
    sections.append(("pairs", "Training pairs", _training_pairs(exp)))
    head.append('<nav class="sections">' + "".join(f'<a href="#{key}">{title}</a>' for key, title, _ in sections)
                + "</nav>")
    body = "".join(head) + "".join(f'<h2 id="{key}">{title}</h2>{part}' for key, title, part in sections)
    out = exp / REPORT_NAME
    atomic_write_bytes(out, page(f"{name} - anysr report", body).encode("utf-8"))
    return out

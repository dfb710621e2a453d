"""Validation during training and ``anysr test``: one path for images and clips (a video test dataset), sharded
over ranks, metrics (``ValMetrics``) reduced on the device once per dataset.

Images: one value per image and metric, averaged over the images. Clips (as BasicSR reports them): window
networks (EDVR, TOF, DUF) map ``num_frame`` LQ frames to the centre frame and ``VideoTestDataset`` gives one window
per frame; recurrent networks (BasicVSR, IconVSR, BasicVSR++) map a clip to a clip and
``VideoRecurrentTestDataset`` gives whole clips, run in temporal chunks (``val.chunk``, ``val.chunk_pad``). Every
frame's metrics land in one slot of a per-dataset table (slots of other ranks stay exact zeros), reduced once at
the end: averaged per clip, then over clips, from the same numbers whatever the world size. ``val.flip_seq`` runs
a window and its reverse and averages them; ``val.center_frame_only`` scores only the centre frame (Vimeo-90K's
protocol). Frames may also be tiled in space (``val.tile``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from anysr.accelerators import Accelerator
from anysr.archs.arch_util import input_channels
from anysr.atomic import atomic_write_json
from anysr.data import build_dataset, build_eval_loader
from anysr.data.imageio import write_image
from anysr.data.transforms import tensor2img
from anysr.engine import checkpoint as ckpt
from anysr.engine.evaluation.forward import (
    CALIBRATION_SIDE,
    calibration_side,
    clip_outputs,
    quantize,
    run_network,
    window_forward,
)
from anysr.engine.evaluation.val_metrics import ValMetrics
from anysr.engine.logger import get_logger, log_start, setup_logging
from anysr.errors import DataError, OptionError
from anysr.models import build_model
from anysr.ops.color import LUMA_RGB
from anysr.ops.imresize import imresize
from anysr.ops.tiling import aligned_tile, tile_multiple

__all__ = ["CROP_SIDE", "EvalResult", "ImageCrop", "clip_dataset", "evaluate", "test_worker", "to_gray_where"]

CROP_SIDE = 128  # side (result pixels) of the fixed crop kept per validation image (TensorBoard, report page)
_BICUBIC_MARGIN = 4  # LQ pixels around a crop, so its bicubic upscaling equals the whole image's there


@dataclass
class ImageCrop:
    """The fixed centre crop of one validation image: uint8 RGB (H, W, 3) arrays of one size (the LQ pixels
    repeated and their MATLAB-bicubic upscaling, at result scale); ``gt`` is None without ground truth."""

    name: str
    index: int
    lq: np.ndarray
    bicubic: np.ndarray
    sr: np.ndarray
    gt: np.ndarray | None
    box: tuple[int, int, int, int]  # top, left, height, width in result pixels
    lq_path: str = ""
    gt_path: str = ""

    def side_by_side(self) -> np.ndarray:
        """LQ, result and ground truth next to each other (what TensorBoard shows)."""
        parts = [self.lq, self.sr] + ([self.gt] if self.gt is not None else [])
        gap = np.full((self.sr.shape[0], 2, 3), 255, dtype=np.uint8)
        out = []
        for i, part in enumerate(parts):
            out += [gap, part] if i else [part]
        return np.concatenate(out, axis=1)


@dataclass
class EvalResult:
    """Averages per metric (one dataset value for FID), per-image values in dataset order, and the fixed crops of
    the first images (gathered to every rank)."""

    dataset: str
    metrics: dict[str, float]
    count: int
    images: list[dict[str, Any]] = field(default_factory=list)
    crops: list[ImageCrop] = field(default_factory=list)


def to_gray_where(x: torch.Tensor, gray: torch.Tensor) -> torch.Tensor:
    """Replace images flagged grayscale by their full-range luma in every channel."""
    if x.shape[1] != 3:
        return x
    w = torch.tensor(LUMA_RGB, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    luma = (x * w).sum(1, keepdim=True).expand_as(x)
    return torch.where(gray.view(-1, 1, 1, 1), luma, x)


def clip_dataset(loader: Any) -> Any | None:
    """The video test dataset behind an eval loader (None for image datasets)."""
    ds = getattr(getattr(loader, "dataset", None), "dataset", None)
    return ds if getattr(ds, "video_kind", "").startswith("test_") else None


def evaluate(net: nn.Module, loader: Iterable[dict[str, Any]], acc: Accelerator, *, dataset: str, scale: int,
             metrics_opt: Any = None, val_opt: Any = None, tile: int | None = None, tile_pad: int = 10,
             save_dir: Path | None = None, suffix: str | None = None, progress: bool = False,
             phase: str = "val", metrics: ValMetrics | None = None, crops: int = 0) -> EvalResult:
    """Run ``net`` over a (rank-sharded, padded) loader of images or clips and reduce the metrics over all ranks.

    Every rank runs the same number of forward passes (padding items repeat an image or clip and are masked out),
    so no rank waits alone on a collective. Metric values stay on the device until the single reduction at the
    end (NIQE alone is measured on the host, per image). ``metrics``: built once by the caller (weights read);
    otherwise built here from ``metrics_opt``. ``val_opt``: the ``val`` options of clips (flip_seq,
    center_frame_only, chunk, chunk_pad). ``crops``: keep the fixed centre crop (LQ, bicubic, result, ground
    truth) of the images whose dataset index is below it. ``phase`` labels the progress bar ('val' bars vanish
    when done, 'test' bars stay). The ``images`` of a clip dataset's result hold one row per clip.
    """
    vm = metrics if metrics is not None else ValMetrics(metrics_opt, acc)
    clips = clip_dataset(loader)
    run: _Images | _Clips
    if clips is not None:
        run = _Clips(net, acc, vm, clips, val_opt, dataset=dataset, scale=scale, tile=tile, tile_pad=tile_pad,
                     save_dir=save_dir, suffix=suffix)
    else:
        run = _Images(net, acc, vm, loader, dataset=dataset, scale=scale, tile=tile, tile_pad=tile_pad,
                      save_dir=save_dir, suffix=suffix, crops=crops)
    was_training = net.training
    net.eval()
    vm.start()
    bar = None
    if progress and acc.is_main:
        bar = tqdm(total=len(loader) if hasattr(loader, "__len__") else None,  # type: ignore[arg-type]
                   desc=f"{phase} {dataset}", leave=phase != "val", dynamic_ncols=True, unit=run.unit)
    for batch in acc.prepare_loader(loader):
        run.step(batch)
        acc.mark_step()
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    if was_training:
        net.train()
    return run.reduce()


# --------------------------------------------------------------------------------------------- images
class _Images:
    """One image per dataset item: the per-image values of every metric, averaged over the images."""

    unit = "img"

    def __init__(self, net: nn.Module, acc: Accelerator, vm: ValMetrics, loader: Any, *, dataset: str, scale: int,
                 tile: int | None, tile_pad: int, save_dir: Path | None, suffix: str | None, crops: int) -> None:
        self.net, self.acc, self.vm, self.dataset, self.scale = net, acc, vm, dataset, scale
        self.tile, self.tile_pad, self.save_dir, self.suffix, self.crops = tile, tile_pad, save_dir, suffix, crops
        self.names: list[str] = []
        self.indices: list[int] = []
        self.valid_flags: list[torch.Tensor] = []
        self.kept: list[ImageCrop] = []
        shard = getattr(loader, "dataset", None)
        self.plan = (list(shard.indices), list(shard.pads)) \
            if hasattr(shard, "indices") and hasattr(shard, "pads") else None

    def step(self, batch: dict[str, Any]) -> None:
        acc, indices = self.acc, self.indices
        lq = batch["lq"]
        bits = [int(b) for b in batch["bits"]] if "bits" in batch else [8] * lq.shape[0]  # host list: 8 or 16
        out = quantize(run_network(self.net, lq, acc, scale=self.scale, tile=self.tile, tile_pad=self.tile_pad),
                       bits)
        pad = torch.as_tensor(batch["pad"]).to(out.device)  # the eval loader marks every item
        gray = torch.as_tensor(batch["gray"]).to(out.device)  # every dataset says whether an image is gray
        out = to_gray_where(out, gray)
        self.valid_flags.append((~pad.bool()).float())
        self.names.extend(Path(p).stem for p in batch["lq_path"])
        n = lq.shape[0]
        if self.plan is not None:  # the host's own copy: no device read per batch
            plan = self.plan
            batch_index, batch_pad = plan[0][len(indices):len(indices) + n], plan[1][len(indices):len(indices) + n]
        else:
            batch_index = [int(i) for i in acc.to_host(torch.as_tensor(batch["index"])).reshape(-1).tolist()]
            batch_pad = [bool(p) for p in acc.to_host(torch.as_tensor(batch["pad"])).reshape(-1).tolist()]
        indices.extend(batch_index)
        self.vm.update(out, batch["gt"] if "gt" in batch else None, gray, batch_pad, batch["lq_path"], self.dataset,
                       bits=bits)
        if self.crops:
            self.kept.extend(_crops(acc, lq, out, batch, batch_index, batch_pad, self.scale, self.crops))
        if self.save_dir is not None:
            _save_outputs(acc, out, batch, pad, gray, self.save_dir, self.suffix, bits)

    def reduce(self) -> EvalResult:
        return _reduce(self.acc, self.dataset, self.vm, self.valid_flags, self.names, self.indices, self.kept)


def _crop_box(h: int, w: int, scale: int) -> tuple[int, int, int, int]:
    """The fixed centre crop of an (h, w) result: sides of at most CROP_SIDE, aligned to the LQ pixel grid."""
    ch = max(scale, min(CROP_SIDE, h) // scale * scale)
    cw = max(scale, min(CROP_SIDE, w) // scale * scale)
    return (h - ch) // 2 // scale * scale, (w - cw) // 2 // scale * scale, ch, cw


def _u8(x: torch.Tensor) -> np.ndarray:
    """A CHW tensor on [0, 1] as an (H, W, 3) uint8 RGB array (gray and Y images repeated on three channels)."""
    img = tensor2img(x, rgb2bgr=False)
    return np.repeat(img[:, :, None], 3, axis=2) if img.ndim == 2 else img


def _crops(acc: Accelerator, lq: torch.Tensor, out: torch.Tensor, batch: dict[str, Any], batch_index: list[int],
           batch_pad: list[bool], scale: int, limit: int) -> list[ImageCrop]:
    """The fixed crops of this batch's images whose dataset index is below ``limit`` (small host copies)."""
    found = []
    for i, index in enumerate(batch_index):
        if index >= limit or batch_pad[i]:
            continue
        top, left, ch, cw = _crop_box(out.shape[2], out.shape[3], scale)
        lt, ll = top // scale, left // scale
        lt0, ll0 = max(0, lt - _BICUBIC_MARGIN), max(0, ll - _BICUBIC_MARGIN)
        lb1 = min(lq.shape[2], (top + ch) // scale + _BICUBIC_MARGIN)
        lr1 = min(lq.shape[3], (left + cw) // scale + _BICUBIC_MARGIN)
        parts = {"lq": lq[i, :, lt0:lb1, ll0:lr1], "sr": out[i, :, top:top + ch, left:left + cw]}
        if "gt" in batch and batch["gt"].shape[2] >= top + ch and batch["gt"].shape[3] >= left + cw:
            parts["gt"] = batch["gt"][i, :, top:top + ch, left:left + cw]
        host = acc.to_host(parts)
        lq_u8 = _u8(host["lq"])
        # MATLAB bicubic of the LQ crop and its margin: equal to the whole image's upscaling inside the crop.
        big = imresize(lq_u8.astype(np.float64) / 255.0, scale)
        oy, ox = (lt - lt0) * scale, (ll - ll0) * scale
        bic = np.clip(np.round(big[oy:oy + ch, ox:ox + cw] * 255.0), 0, 255).astype(np.uint8)
        inner = lq_u8[lt - lt0:lt - lt0 + ch // scale, ll - ll0:ll - ll0 + cw // scale]
        lq_view = np.repeat(np.repeat(inner, scale, axis=0), scale, axis=1)
        found.append(ImageCrop(Path(batch["lq_path"][i]).stem, index, lq_view, bic, _u8(host["sr"]),
                               _u8(host["gt"]) if "gt" in host else None, (top, left, ch, cw),
                               str(batch["lq_path"][i]), str(batch["gt_path"][i]) if "gt_path" in batch else ""))
    return found


def _save_outputs(acc: Accelerator, out: torch.Tensor, batch: dict[str, Any], pad: torch.Tensor,
                  gray: torch.Tensor, save_dir: Path, suffix: str | None, bits: list[int]) -> None:
    """Each result as a PNG at its image's depth (``bits``: a 16-bit ground truth gives a 16-bit PNG)."""
    host = acc.to_host(out)
    for i, path in enumerate(batch["lq_path"]):
        if bool(pad[i]):
            continue
        img = tensor2img(host[i], bits=bits[i])
        if bool(gray[i]) and img.ndim == 3:
            img = img[:, :, 0]
        stem = Path(path).stem
        write_image(save_dir / f"{stem}_{suffix}.png" if suffix else save_dir / f"{stem}.png", img)


def _reduce(acc: Accelerator, dataset: str, vm: ValMetrics, valid_flags: list[torch.Tensor], names: list[str],
            indices: list[int], crops: list[ImageCrop]) -> EvalResult:
    device = acc.device
    valid = torch.cat(valid_flags) if valid_flags else torch.zeros(0, device=device)
    per_image = vm.per_image()
    keys = [k for k in vm.per_image_keys() if k in per_image]
    sums = [(torch.cat(per_image[k]) * valid).sum() for k in keys]
    packed = torch.stack([*sums, valid.sum()]) if len(valid) else torch.zeros(len(keys) + 1, device=device)
    total = acc.to_host(acc.strategy.all_reduce(packed, "sum"))
    count = int(round(float(total[-1])))
    averages = {k: float(total[i]) / max(count, 1) for i, k in enumerate(keys)}
    averages.update(vm.dataset_values(valid, indices))  # FID: one value of the whole set
    metrics = {k: averages[k] for k in vm.keys if k in averages}
    # Per-image rows (for the test report): one host transfer per dataset, then gathered to every rank.
    rows_local: list[dict[str, Any]] = []
    if names:
        values = acc.to_host(torch.stack([torch.cat(per_image[k]) for k in keys])) if keys else None
        mask = acc.to_host(valid)
        for i, name in enumerate(names):
            if mask[i] > 0:
                row: dict[str, Any] = {"name": name}
                if values is not None:
                    row.update({k: float(values[j, i]) for j, k in enumerate(keys)})
                rows_local.append(row)
    rows: list[dict[str, Any]] = []
    gathered: list[ImageCrop] = []
    for part_rows, part_crops in acc.strategy.all_gather_object((rows_local, crops)):
        rows.extend(part_rows)
        gathered.extend(part_crops)
    rows.sort(key=lambda r: r["name"])
    gathered.sort(key=lambda c: c.index)
    return EvalResult(dataset, metrics, count, rows, gathered)


# --------------------------------------------------------------------------------------------- clips
class _Clips:
    """A video test dataset: clips (recurrent networks) or frame windows (window networks); the metrics of every
    scored frame in its slot of one table, averaged per clip, then over clips."""

    def __init__(self, net: nn.Module, acc: Accelerator, vm: ValMetrics, ds: Any, val_opt: Any, *, dataset: str,
                 scale: int, tile: int | None, tile_pad: int, save_dir: Path | None, suffix: str | None) -> None:
        self.net, self.acc, self.vm, self.ds, self.dataset, self.scale = net, acc, vm, ds, dataset, scale
        self.tile, self.tile_pad, self.save_dir, self.suffix = tile, tile_pad, save_dir, suffix
        self.names, self.lengths = list(ds.clip_names), list(ds.clip_lengths)
        self.offsets = [sum(self.lengths[:c]) for c in range(len(self.lengths))]
        self.flip, self.center = bool(val_opt["flip_seq"]), bool(val_opt["center_frame_only"])
        self.chunk, self.chunk_pad = val_opt["chunk"], int(val_opt["chunk_pad"])
        self.unit = "clip" if ds.video_kind == "test_clip" else "frame"
        self.slots: list[int] = []
        self.has_gt = False

    def step(self, batch: dict[str, Any]) -> None:
        acc, ds, names, save_dir = self.acc, self.ds, self.names, self.save_dir
        pad = bool(batch["pad"][0])
        c, frames = int(batch["clip"][0]), [int(f) for f in batch["frames"][0]]
        lq, gt = batch["lq"], batch["gt"] if "gt" in batch else None
        self.has_gt = gt is not None
        if ds.video_kind == "test_clip":
            t = lq.shape[1]
            keep = [t // 2] if self.center else None
            for idx, out in clip_outputs(self.net, lq, acc, scale=self.scale, chunk=self.chunk,
                                         chunk_pad=self.chunk_pad, flip_seq=self.flip, tile=self.tile,
                                         tile_pad=self.tile_pad):
                sel = [k for k, f in enumerate(idx) if keep is None or f in keep]
                if not sel:
                    continue
                out_f = quantize(out[0, sel])
                got = [idx[k] for k in sel]
                self._collect(out_f, gt[0, got] if gt is not None else None, got, c, pad)
                if save_dir is not None and not pad:
                    _save_frames(acc, out_f, [ds.frame_name(c, f) for f in got], save_dir / names[c], self.suffix)
                acc.mark_step()
        else:
            if self.flip:
                lq = torch.cat([lq, lq.flip(1)], dim=1)
            out = window_forward(self.net, lq, acc, scale=self.scale, tile=self.tile, tile_pad=self.tile_pad)
            if out.dim() == 5:  # a recurrent network on windows: its centre frame (Vimeo-90K protocol)
                n = out.shape[1] // 2 if self.flip else out.shape[1]
                mid = n // 2
                out = 0.5 * (out[:, mid] + out[:, out.shape[1] - 1 - mid]) if self.flip else out[:, mid]
            elif self.flip:
                raise OptionError("val.flip_seq: averages a clip with its reverse, which needs a recurrent network; "
                                  "remove it for window networks such as EDVR")
            out_f = quantize(out)
            g = gt if gt is None or gt.dim() == 4 else gt[:, gt.shape[1] // 2]
            self._collect(out_f, g, frames, c, pad)
            if save_dir is not None and not pad:
                _save_frames(acc, out_f, [ds.frame_name(c, frames[0])], save_dir / names[c], self.suffix)

    def _collect(self, out: torch.Tensor, gt: torch.Tensor | None, frames: list[int], clip: int, pad: bool) -> None:
        """Score output frames (k, c, H, W) and note their slots (padding items record nothing)."""
        if pad:
            return
        self.vm.update(out, gt, torch.zeros(len(frames), dtype=torch.bool, device=out.device), [False] * len(frames),
                       [self.names[clip]], self.dataset)
        self.slots.extend(self.offsets[clip] + f for f in frames)

    def reduce(self) -> EvalResult:
        """One reduction of the (frames x metrics) table and the scored-frame mask; averages per clip, then over
        clips."""
        acc, dataset, slots, names, offsets, lengths = \
            self.acc, self.dataset, self.slots, self.names, self.offsets, self.lengths
        device = acc.device
        active = self.vm.active(self.has_gt)
        keys = [k for k in self.vm.per_image_keys() if k in active]
        per_image = self.vm.per_image()
        total, m = sum(lengths), len(keys)
        table = torch.zeros(total, m, device=device)
        mask = torch.zeros(total, device=device)
        if slots:
            values = torch.stack([torch.cat(per_image[k]) for k in keys], dim=1) if keys \
                else torch.zeros(len(slots), 0)
            idx = torch.tensor(slots, dtype=torch.long).to(device)
            table = table.index_put((idx,), values.to(device), accumulate=True)
            mask = mask.index_put((idx,), torch.ones(len(slots), device=device), accumulate=True)
        packed = acc.to_host(acc.strategy.all_reduce(torch.cat([table.flatten(), mask]), "sum")).double()
        table_h, mask_h = packed[: total * m].view(total, m), packed[total * m:]
        if bool((mask_h > 1).any()):
            raise DataError(f"{dataset}: a frame was scored twice; the clip dataset's items overlap")
        rows: list[dict[str, Any]] = []
        per_clip = []
        for c, name in enumerate(names):
            sl = slice(offsets[c], offsets[c] + lengths[c])
            n = float(mask_h[sl].sum())
            if n == 0:
                continue
            means = (table_h[sl] * mask_h[sl, None]).sum(0) / n
            per_clip.append(means)
            rows.append({"name": name, "frames": int(n), **{k: float(means[j]) for j, k in enumerate(keys)}})
        metrics = {}
        if per_clip and keys:
            overall = torch.stack(per_clip).mean(0)
            metrics = {k: float(overall[j]) for j, k in enumerate(keys)}
        count = int(mask_h.sum())
        if acc.is_main and keys:
            log = get_logger()
            for row in rows:
                log.info("  %s %-16s %s (%d frames)", dataset, row["name"],
                         " ".join(f"{k}: {row[k]:.4f}" for k in keys), row["frames"])
        return EvalResult(dataset, metrics, count, rows)


def _save_frames(acc: Accelerator, frames: torch.Tensor, names: list[str], folder: Path, suffix: str | None) -> None:
    host = acc.to_host(frames)
    folder.mkdir(parents=True, exist_ok=True)
    for img, name in zip(host, names):
        write_image(folder / (f"{name}_{suffix}.png" if suffix else f"{name}.png"), tensor2img(img))


# --------------------------------------------------------------------------------------------- anysr test
def archive_results(folder: Path) -> Path | None:
    """A results folder that holds anything is renamed ``<folder>_archived_<time>`` (as BasicSR does), so a second
    ``anysr test`` of the same ``name`` overwrites nothing; returns the new name, None when there was nothing."""
    if not folder.is_dir() or not any(folder.iterdir()):
        return None
    stamp = time.strftime("%Y%m%d_%H%M%S")
    target, n = folder.with_name(f"{folder.name}_archived_{stamp}"), 1
    while target.exists():  # two runs within one second: keep both
        n += 1
        target = folder.with_name(f"{folder.name}_archived_{stamp}_{n}")
    folder.rename(target)
    return target


def test_worker(acc: Accelerator, opt: Any) -> dict[str, Any]:
    """``anysr test``: every test dataset through the network, metrics reduced over ranks, summary.json."""
    results_root = Path(opt.path.results_root)
    archived = None
    if acc.is_main:
        archived = archive_results(results_root)
        results_root.mkdir(parents=True, exist_ok=True)
    acc.strategy.barrier()  # no rank reads the folder while it is being moved
    setup_logging(results_root / "test.log", enabled=acc.is_main)
    log = get_logger()
    if archived is not None:
        log.info("the previous results of '%s' were moved to %s", opt.name, archived)
    acc.manual_seed(int(opt.manual_seed))
    model = build_model(opt, acc)
    for line in ckpt.load_model_weights(model, fresh=True):
        log.info(line)
    val = opt.val
    bare = model.nets["net_g"]
    if val.tile:
        tile, pad = aligned_tile(int(val.tile), int(val.tile_pad), tile_multiple(bare))
        side = calibration_side(tile, pad, tile_multiple(bare))
    else:
        side = CALIBRATION_SIDE
    acc.calibrate(bare.eval(), model.input_shape(1, input_channels(bare) or 3, side), train=False)
    model.setup()
    net = model.inference_net()
    scale = int(opt.scale)
    summary: dict[str, Any] = {"name": opt.name, "weights": opt.path.pretrain_network_g,
                               "accelerator": acc.plan.accelerator, "world_size": acc.world_size,
                               "precision": acc.precision.name,
                               "choices": {k: c.as_dict() for k, c in acc.precision.choices.items()}, "datasets": {}}
    log_start(f"test '{opt.name}'", acc)
    metrics = ValMetrics(val.metrics, acc)  # weight files read once
    for key, dopt in opt.datasets.items():
        if not key.startswith(("test", "val")):
            continue
        ds = build_dataset(dopt, f"datasets.{key}")
        loader, _ = build_eval_loader(ds, dopt, world_size=acc.world_size, rank=acc.rank)
        save_dir = Path(opt.path.visualization) / dopt.name if val.save_img else None  # default: results/<name>/
        if save_dir is not None and acc.is_main:
            save_dir.mkdir(parents=True, exist_ok=True)
        acc.strategy.barrier()
        res = evaluate(net, loader, acc, dataset=dopt.name, scale=scale, tile=val.tile, tile_pad=int(val.tile_pad),
                       save_dir=save_dir, suffix=val.suffix, progress=True, phase="test", metrics=metrics, val_opt=val)
        _log_result(res, [m.key for m in metrics.metrics])
        summary["datasets"][dopt.name] = {"n": res.count, **res.metrics, "images": res.images}
    summary["stats"] = acc.stats()
    if acc.is_main:
        atomic_write_json(results_root / "summary.json", summary)
        log.info("wrote %s", results_root / "summary.json")
    return summary


def _log_result(res: EvalResult, asked: list[str]) -> None:
    """Per-image values and the averages; metrics asked for but not computed (no ground truth) are named."""
    log = get_logger()
    if res.images:
        keys = [k for k in res.images[0] if k not in ("name", "frames")]
        if keys:
            log.info("%-20s %s", "image", " ".join(f"{k:>16}" for k in keys))
            for row in res.images:
                log.info("%-20s %s", row["name"], " ".join(f"{row[k]:16.4f}" for k in keys))
    missing = [k for k in asked if k not in res.metrics]
    if missing:
        log.warning("%s: %s not computed: the set has no ground truth (dataroot_gt) and %s need%s it; add "
                    "dataroot_gt, or use no-reference metrics (niqe, ...)", res.dataset, ", ".join(missing),
                    "they" if len(missing) > 1 else "it", "" if len(missing) > 1 else "s")
    if res.metrics:
        avg = " ".join(f"{k}={v:.4f}" for k, v in res.metrics.items())
        log.info("%s: average %s n=%d", res.dataset, avg, res.count)
    else:
        log.info("%s: %d image%s, no metrics", res.dataset, res.count, "" if res.count == 1 else "s")


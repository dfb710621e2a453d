"""Validation during training and ``anysr test``: images sharded over ranks, metrics reduced on the device."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from anysr.accelerators import Accelerator
from anysr.archs.arch_util import input_channels
from anysr.atomic import atomic_write_json
from anysr.data import build_dataset, build_eval_loader
from anysr.data.imageio import write_image
from anysr.data.transforms import tensor2img
from anysr.engine import checkpoint as ckpt
from anysr.engine.evaluation.val_metrics import ValMetrics
from anysr.engine.logger import get_logger, log_start, setup_logging
from anysr.models import build_model
from anysr.ops.color import LUMA_RGB
from anysr.ops.imresize import imresize
from anysr.ops.tiling import aligned_tile, tile_forward, tile_multiple

CALIBRATION_SIDE = 128  # input side used to time precision / memory-format candidates for untiled inference
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


def quantize(x: torch.Tensor) -> torch.Tensor:
    """What saving to 8-bit does to an image: clamp to [0, 1] and round to 1/255 steps."""
    return (x.clamp(0, 1) * 255).round() / 255


def to_gray_where(x: torch.Tensor, gray: torch.Tensor) -> torch.Tensor:
    """Replace images flagged grayscale by their full-range luma in every channel."""
    if x.shape[1] != 3:
        return x
    w = torch.tensor(LUMA_RGB, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    luma = (x * w).sum(1, keepdim=True).expand_as(x)
    return torch.where(gray.view(-1, 1, 1, 1), luma, x)


def run_network(net: nn.Module, lq: torch.Tensor, acc: Accelerator, *, scale: int, tile: int | None,
                tile_pad: int) -> torch.Tensor:
    """Forward in eval mode under the accelerator's autocast, tiled with fixed-size tiles when asked (rounded up
    to the network's ``tile_multiple``, on its window grid)."""
    with torch.no_grad(), acc.precision.autocast():
        if tile:
            out = tile_forward(net, lq, scale, tile, tile_pad, static=acc.static_shapes, multiple=tile_multiple(net))
        else:
            out = net(lq)
    return out.float()


def evaluate(net: nn.Module, loader: Iterable[dict[str, Any]], acc: Accelerator, *, dataset: str, scale: int,
             metrics_opt: Any = None, tile: int | None = None, tile_pad: int = 10,
             save_dir: Path | None = None, suffix: str | None = None, progress: bool = False,
             phase: str = "val", metrics: ValMetrics | None = None, crops: int = 0) -> EvalResult:
    """Run ``net`` over a (rank-sharded, padded) loader and reduce the metrics over all ranks.

    Every rank runs the same number of forward passes (padding items repeat an image and are masked out),
    so no rank waits alone on a collective. Metric values stay on the device until the single reduction at the
    end (NIQE alone is measured on the host, per image). ``metrics``: built once by the caller (weights read);
    otherwise built here from ``metrics_opt``. ``crops``: keep the fixed centre crop (LQ, bicubic, result,
    ground truth) of the images whose dataset index is below it. ``phase`` labels the progress bar ('val'
    bars vanish when done, 'test' bars stay).
    """
    was_training = net.training
    net.eval()
    vm = metrics if metrics is not None else ValMetrics(metrics_opt, acc)
    vm.start()
    names: list[str] = []
    indices: list[int] = []
    valid_flags: list[torch.Tensor] = []
    kept: list[ImageCrop] = []
    shard = getattr(loader, "dataset", None)
    plan = (list(shard.indices), list(shard.pads)) if hasattr(shard, "indices") and hasattr(shard, "pads") else None
    bar = None
    if progress and acc.is_main:
        from tqdm import tqdm  # noqa: PLC0415

        bar = tqdm(total=len(loader) if hasattr(loader, "__len__") else None,  # type: ignore[arg-type]
                   desc=f"{phase} {dataset}", leave=phase != "val", dynamic_ncols=True, unit="img")
    for batch in acc.prepare_loader(loader):
        lq = batch["lq"]
        out = quantize(run_network(net, lq, acc, scale=scale, tile=tile, tile_pad=tile_pad))
        pad = torch.as_tensor(batch["pad"]).to(out.device)  # the eval loader marks every item
        gray = torch.as_tensor(batch["gray"]).to(out.device)  # every dataset says whether an image is gray
        out = to_gray_where(out, gray)
        valid_flags.append((~pad.bool()).float())
        names.extend(Path(p).stem for p in batch["lq_path"])
        n = lq.shape[0]
        if plan is not None:  # the host's own copy: no device read per batch
            batch_index, batch_pad = plan[0][len(indices):len(indices) + n], plan[1][len(indices):len(indices) + n]
        else:
            batch_index = [int(i) for i in acc.to_host(torch.as_tensor(batch["index"])).reshape(-1).tolist()]
            batch_pad = [bool(p) for p in acc.to_host(torch.as_tensor(batch["pad"])).reshape(-1).tolist()]
        indices.extend(batch_index)
        vm.update(out, batch["gt"] if "gt" in batch else None, gray, batch_pad, batch["lq_path"], dataset)
        if crops:
            kept.extend(_crops(acc, lq, out, batch, batch_index, batch_pad, scale, crops))
        if save_dir is not None:
            _save_outputs(acc, out, batch, pad, gray, save_dir, suffix)
        acc.mark_step()
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    if was_training:
        net.train()
    return _reduce(acc, dataset, vm, valid_flags, names, indices, kept)


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
                  gray: torch.Tensor, save_dir: Path, suffix: str | None) -> None:
    host = acc.to_host(out)
    for i, path in enumerate(batch["lq_path"]):
        if bool(pad[i]):
            continue
        img = tensor2img(host[i])
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


# --------------------------------------------------------------------------------------------- anysr test
def test_worker(acc: Accelerator, opt: Any) -> dict[str, Any]:
    """``anysr test``: every test dataset through the network, metrics reduced over ranks, summary.json."""
    results_root = Path(opt.path.results_root)
    if acc.is_main:
        results_root.mkdir(parents=True, exist_ok=True)
    setup_logging(results_root / "test.log", enabled=acc.is_main)
    log = get_logger()
    acc.manual_seed(int(opt.manual_seed))
    model = build_model(opt, acc)
    for line in ckpt.load_model_weights(model, fresh=True):
        log.info(line)
    val = opt.val
    bare = model.nets["net_g"]
    if val.tile:
        tile, pad = aligned_tile(int(val.tile), int(val.tile_pad), tile_multiple(bare))
        side = tile + 2 * pad
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
        save_dir = results_root / "visualization" / dopt.name if val.save_img else None
        if save_dir is not None and acc.is_main:
            save_dir.mkdir(parents=True, exist_ok=True)
        acc.strategy.barrier()
        from anysr.engine.evaluation.video_eval import evaluate_clips, is_clip_loader  # noqa: PLC0415  (it imports this module)

        common = dict(dataset=dopt.name, scale=scale, tile=val.tile, tile_pad=int(val.tile_pad), save_dir=save_dir,
                      suffix=val.suffix, progress=True, phase="test")
        if is_clip_loader(loader):
            res = evaluate_clips(net, loader, acc, metrics_opt=val.metrics, val_opt=val, **common)
        else:
            res = evaluate(net, loader, acc, metrics=metrics, **common)
        _log_result(res)
        summary["datasets"][dopt.name] = {"n": res.count, **res.metrics, "images": res.images}
    summary["stats"] = acc.stats()
    if acc.is_main:
        atomic_write_json(results_root / "summary.json", summary)
        log.info("wrote %s", results_root / "summary.json")
    return summary


def _log_result(res: EvalResult) -> None:
    log = get_logger()
    if res.images:
        keys = [k for k in res.images[0] if k != "name"]
        log.info("%-20s %s", "image", " ".join(f"{k:>16}" for k in keys))
        for row in res.images:
            log.info("%-20s %s", row["name"], " ".join(f"{row[k]:16.4f}" for k in keys))
    avg = " ".join(f"{k}={v:.4f}" for k, v in res.metrics.items())
    log.info("%s: average %s n=%d", res.dataset, avg, res.count)


"""Validation during training and ``anysr test``: images sharded over ranks, metrics reduced on the device."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from anysr.accelerators import Accelerator
from anysr.archs.arch_util import input_channels
from anysr.atomic import atomic_write_json
from anysr.data import build_dataset, build_eval_loader
from anysr.data.imageio import write_image
from anysr.data.transforms import tensor2img
from anysr.engine import checkpoint as ckpt
from anysr.engine.logger import get_logger, log_start, setup_logging
from anysr.errors import AnysrError, OptionError
from anysr.metrics import TORCH_METRICS
from anysr.models import build_model
from anysr.ops.color import LUMA_RGB
from anysr.ops.tiling import aligned_tile, tile_forward, tile_multiple

CALIBRATION_SIDE = 128  # input side used to time precision / memory-format candidates for untiled inference


@dataclass
class EvalResult:
    """Averages per metric, and per-image values (on the main rank) in dataset order."""

    dataset: str
    metrics: dict[str, float]
    count: int
    images: list[dict[str, Any]] = field(default_factory=list)


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
    with torch.no_grad(), acc.autocast():
        if tile:
            out = tile_forward(net, lq, scale, tile, tile_pad, static=acc.static_shapes, multiple=tile_multiple(net))
        else:
            out = net(lq)
    return out.float()


def evaluate(net: nn.Module, loader: Iterable[dict[str, Any]], acc: Accelerator, *, dataset: str, scale: int,
             metrics_opt: dict[str, dict[str, Any]] | None, tile: int | None = None, tile_pad: int = 10,
             save_dir: Path | None = None, suffix: str | None = None, progress: bool = False,
             phase: str = "val") -> EvalResult:
    """Run ``net`` over a (rank-sharded, padded) loader and reduce the metrics over all ranks.

    Every rank runs the same number of forward passes (padding items repeat an image and are masked out),
    so no rank waits alone on a collective. Metric sums stay on the device until the single reduction at the end.
    ``phase`` labels the progress bar ('val' bars vanish when done, 'test' bars stay).
    """
    was_training = net.training
    net.eval()
    metrics_opt = metrics_opt or {}
    per_image: dict[str, list[torch.Tensor]] = {name: [] for name in metrics_opt}
    names: list[str] = []
    valid_flags: list[torch.Tensor] = []
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
        if "gt" in batch and metrics_opt:
            gt = batch["gt"]
            out_c = out[:, :, : gt.shape[2], : gt.shape[3]]
            gt = gt[:, :, : out_c.shape[2], : out_c.shape[3]]
            for name, mopt in metrics_opt.items():
                fn = TORCH_METRICS[mopt["type"]]
                try:
                    value = fn(out_c, gt, crop_border=mopt["crop_border"],
                               test_y_channel=bool(mopt["test_y_channel"]), gray=gray.bool())
                except AnysrError as exc:
                    raise OptionError(f"val.metrics.{name} on {batch['lq_path'][0]} ({dataset}): {exc}") from None
                per_image[name].append(value.float().reshape(-1))
        if save_dir is not None:
            _save_outputs(acc, out, batch, pad, gray, save_dir, suffix)
        acc.mark_step()
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    if was_training:
        net.train()
    if metrics_opt and not any(per_image.values()):
        # No ground truth in this dataset (e.g. SingleImageDataset): images only, no made-up zeros.
        metrics_opt = {}
        per_image = {}
    return _reduce(acc, dataset, metrics_opt, per_image, valid_flags, names)


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


def _reduce(acc: Accelerator, dataset: str, metrics_opt: dict[str, dict[str, Any]],
            per_image: dict[str, list[torch.Tensor]], valid_flags: list[torch.Tensor],
            names: list[str]) -> EvalResult:
    device = acc.device
    valid = torch.cat(valid_flags) if valid_flags else torch.zeros(0, device=device)
    keys = list(metrics_opt)
    sums = [(torch.cat(per_image[k]) * valid).sum() if per_image[k] else torch.zeros((), device=device)
            for k in keys]
    packed = torch.stack([*sums, valid.sum()]) if len(valid) else torch.zeros(len(keys) + 1, device=device)
    total = acc.to_host(acc.all_reduce(packed, "sum"))
    count = int(round(float(total[-1])))
    metrics = {k: float(total[i]) / max(count, 1) for i, k in enumerate(keys)}
    # Per-image rows (for the test report): one host transfer per dataset, then gathered to every rank.
    rows_local: list[dict[str, Any]] = []
    if names:
        values = acc.to_host(torch.stack([torch.cat(per_image[k]) for k in keys])) if keys and per_image[keys[0]] \
            else None
        mask = acc.to_host(valid)
        for i, name in enumerate(names):
            if mask[i] > 0:
                row: dict[str, Any] = {"name": name}
                if values is not None:
                    row.update({k: float(values[j, i]) for j, k in enumerate(keys)})
                rows_local.append(row)
    rows: list[dict[str, Any]] = []
    for part in acc.all_gather_object(rows_local):
        rows.extend(part)
    rows.sort(key=lambda r: r["name"])
    return EvalResult(dataset, metrics, count, rows)


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
    acc.calibrate(bare.eval(), (1, input_channels(bare) or 3, side, side), train=False)
    model.setup()
    net = model.inference_net()
    scale = int(opt.scale)
    summary: dict[str, Any] = {"name": opt.name, "weights": opt.path.pretrain_network_g,
                               "accelerator": acc.plan.accelerator, "world_size": acc.world_size,
                               "precision": acc.precision,
                               "choices": {k: c.as_dict() for k, c in acc.choices.items()}, "datasets": {}}
    log_start(f"test '{opt.name}'", acc)
    for key, dopt in opt.datasets.items():
        if not key.startswith(("test", "val")):
            continue
        ds = build_dataset(dopt, f"datasets.{key}")
        loader, _ = build_eval_loader(ds, dopt, world_size=acc.world_size, rank=acc.rank)
        save_dir = results_root / "visualization" / dopt.name if val.save_img else None
        if save_dir is not None and acc.is_main:
            save_dir.mkdir(parents=True, exist_ok=True)
        acc.barrier()
        res = evaluate(net, loader, acc, dataset=dopt.name, scale=scale, metrics_opt=val.metrics, tile=val.tile,
                       tile_pad=int(val.tile_pad), save_dir=save_dir, suffix=val.suffix, progress=True,
                       phase="test")
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


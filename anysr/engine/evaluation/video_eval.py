"""Video validation and testing: clips through a video network, metrics per frame, averaged per clip and then over
clips (as BasicSR reports them), over any number of ranks with the result of one process.

Two kinds of networks and datasets meet here. Window networks (EDVR, TOF, DUF) map ``num_frame`` LQ frames to the
centre frame: ``VideoTestDataset`` gives one window per frame. Recurrent networks (BasicVSR, IconVSR, BasicVSR++)
map a clip to a clip: ``VideoRecurrentTestDataset`` gives whole clips, which run in overlapping temporal chunks
when ``val.chunk`` is set (``chunk`` frames kept per pass, ``chunk_pad`` frames of context on each side), so
memory is bounded by the chunk, not the clip, and XLA sees one window shape. ``val.flip_seq`` runs the window and
its reverse and averages them; ``val.center_frame_only`` scores only the centre frame (Vimeo-90K's protocol).
Frames may also be tiled in space (``val.tile``).

Every frame's metrics land in one slot of a per-dataset table (slots of other ranks stay exact zeros), reduced
once at the end: the per-clip and overall averages are computed from the same numbers whatever the world size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from anysr.accelerators import Accelerator
from anysr.archs.basicvsr_arch import reflect_index
from anysr.data.imageio import write_image
from anysr.data.transforms import tensor2img
from anysr.engine.evaluation.evaluator import EvalResult, quantize
from anysr.engine.logger import get_logger
from anysr.errors import AnysrError, DataError, OptionError
from anysr.metrics import TORCH_METRICS
from anysr.ops.tiling import tile_forward


# ------------------------------------------------------------------------------------------ temporal chunks
@dataclass(frozen=True)
class Chunk:
    """One pass over frames ``[win_start, win_end)`` of which the outputs ``[keep_start, keep_end)`` are kept."""

    keep_start: int
    keep_end: int
    win_start: int
    win_end: int


def plan_chunks(t: int, chunk: int | None, pad: int) -> list[Chunk]:
    """Windows of ``chunk + 2 * pad`` frames (the whole clip when ``chunk`` is None or covers it) whose kept
    frames (``chunk`` of them, fewer in the last) tile ``[0, t)`` without overlap; windows are shifted inside the
    clip at its ends, so they all have the same length."""
    if not chunk or chunk >= t:
        return [Chunk(0, t, 0, t)]
    win = min(chunk + 2 * pad, t)
    out = []
    for s in range(0, t, chunk):
        ws = min(max(s - pad, 0), t - win)
        out.append(Chunk(s, min(s + chunk, t), ws, ws + win))
    return out


def pad_indices(t: int, length: int) -> list[int]:
    """``length`` frame indices of a clip of ``t < length`` frames, extended by reflection (t-2, t-3, ...)."""
    return [reflect_index(i, t) for i in range(length)]


# ------------------------------------------------------------------------------------------ forward passes
def window_forward(net: nn.Module, lq: torch.Tensor, acc: Accelerator, *, scale: int, tile: int | None,
                   tile_pad: int) -> torch.Tensor:
    """(b, t, c, h, w) through a video network in eval mode under autocast, tiled in space when asked.

    Returns the network's output as float: (b, c, H, W) for a window network, (b, t, c, H, W) for a recurrent one.
    """
    b, t, c, h, w = lq.shape
    with torch.no_grad(), acc.precision.autocast():
        if not tile:
            return net(lq).float()
        clip_out: list[bool] = []

        def frames(x: torch.Tensor) -> torch.Tensor:
            out = net(x.unflatten(1, (t, c)))
            clip_out.append(out.dim() == 5)
            return out.flatten(1, 2) if out.dim() == 5 else out

        out = tile_forward(frames, lq.flatten(1, 2), scale, tile, tile_pad, static=acc.static_shapes)
        return (out.unflatten(1, (t, -1)) if clip_out[-1] else out).float()


def clip_outputs(net: nn.Module, lq: torch.Tensor, acc: Accelerator, *, scale: int, chunk: int | None,
                 chunk_pad: int, flip_seq: bool, tile: int | None = None,
                 tile_pad: int = 10) -> Iterator[tuple[list[int], torch.Tensor]]:
    """A recurrent network over a clip (b, t, c, h, w), chunk by chunk: yields ``(frame indices, outputs
    (b, k, c, H, W))`` in order. With ``flip_seq`` each window also runs reversed and the two are averaged.
    On devices with static shapes a clip shorter than the window is extended by reflection (outputs dropped)."""
    return chunked_outputs(net, lambda a, b: lq[:, a:b], lq.shape[1], acc, scale=scale, chunk=chunk,
                           chunk_pad=chunk_pad, flip_seq=flip_seq, tile=tile, tile_pad=tile_pad)


def chunked_outputs(net: nn.Module, window: Callable[[int, int], torch.Tensor], t: int, acc: Accelerator, *,
                    scale: int, chunk: int | None, chunk_pad: int, flip_seq: bool, tile: int | None = None,
                    tile_pad: int = 10) -> Iterator[tuple[list[int], torch.Tensor]]:
    """``clip_outputs`` over a clip of ``t`` frames served by ``window(start, end)`` -> (b, end - start, c, h, w)
    on the device (a video file is read chunk by chunk this way)."""
    for ch in plan_chunks(t, chunk, chunk_pad):
        win = window(ch.win_start, ch.win_end)
        n = win.shape[1]
        if chunk and acc.static_shapes and n < chunk + 2 * chunk_pad:
            win = win[:, pad_indices(n, chunk + 2 * chunk_pad)]
        if flip_seq:
            win = torch.cat([win, win.flip(1)], dim=1)
        out = window_forward(net, win, acc, scale=scale, tile=tile, tile_pad=tile_pad)
        if out.dim() != 5:
            raise OptionError("a clip dataset (one item per clip) needs a recurrent network (BasicVSR, IconVSR, "
                              "BasicVSR++); for a window network such as EDVR use VideoTestDataset")
        if flip_seq:
            half = out.shape[1] // 2
            out = 0.5 * (out[:, :half] + out[:, half:].flip(1))
        if acc.static_shapes:
            acc.mark_step()  # the network's graph ends here: one per window shape, whatever the clip's length
        lo, hi = ch.keep_start - ch.win_start, ch.keep_end - ch.win_start
        yield list(range(ch.keep_start, ch.keep_end)), out[:, lo:hi]


# ------------------------------------------------------------------------------------------ validation
def clip_dataset(loader: Any) -> Any | None:
    """The video test dataset behind an eval loader (None for image datasets)."""
    ds = getattr(getattr(loader, "dataset", None), "dataset", None)
    return ds if getattr(ds, "video_kind", "").startswith("test_") else None


def is_clip_loader(loader: Any) -> bool:
    """Whether ``loader`` (from ``build_eval_loader``) serves a video test dataset."""
    return clip_dataset(loader) is not None


def _frame_metrics(out: torch.Tensor, gt: torch.Tensor, metrics_opt: dict[str, Any], where: str) -> torch.Tensor:
    """(k, M): the metrics of k output frames (k, c, H, W) against their GT frames."""
    out = out[:, :, : gt.shape[-2], : gt.shape[-1]]
    gt = gt[:, :, : out.shape[-2], : out.shape[-1]]
    cols = []
    for name, mopt in metrics_opt.items():
        try:
            value = TORCH_METRICS[mopt["type"]](out, gt, crop_border=mopt["crop_border"],
                                                test_y_channel=bool(mopt["test_y_channel"]))
        except AnysrError as exc:
            raise OptionError(f"val.metrics.{name} on {where}: {exc}") from None
        cols.append(value.float().reshape(-1))
    return torch.stack(cols, dim=1)


def evaluate_clips(net: nn.Module, loader: Iterable[dict[str, Any]], acc: Accelerator, *, dataset: str, scale: int,
                   metrics_opt: dict[str, Any] | None, val_opt: Any, tile: int | None = None, tile_pad: int = 10,
                   save_dir: Path | None = None, suffix: str | None = None, progress: bool = False,
                   phase: str = "val") -> EvalResult:
    """Validate ``net`` on a (rank-sharded, padded) loader of a video test dataset; see the module docstring.

    ``val_opt``: the ``val`` options (flip_seq, center_frame_only, chunk, chunk_pad). Every rank runs as many
    passes; the metric table is reduced once. ``images`` of the result holds one row per clip.
    """
    ds = clip_dataset(loader)
    assert ds is not None
    was_training = net.training
    net.eval()
    metrics_opt = dict(metrics_opt or {})
    names, lengths = list(ds.clip_names), list(ds.clip_lengths)
    offsets = [sum(lengths[:c]) for c in range(len(lengths))]
    flip, center = bool(val_opt["flip_seq"]), bool(val_opt["center_frame_only"])
    chunk, chunk_pad = val_opt["chunk"], int(val_opt["chunk_pad"])
    parts: list[torch.Tensor] = []
    slots: list[int] = []
    bar = None
    if progress and acc.is_main:
        from tqdm import tqdm  # noqa: PLC0415

        bar = tqdm(total=len(loader) if hasattr(loader, "__len__") else None,  # type: ignore[arg-type]
                   desc=f"{phase} {dataset}", leave=phase != "val", dynamic_ncols=True,
                   unit="clip" if ds.video_kind == "test_clip" else "frame")
    for batch in acc.prepare_loader(loader):
        pad = bool(batch["pad"][0])
        c, frames = int(batch["clip"][0]), [int(f) for f in batch["frames"][0]]
        lq, gt = batch["lq"], batch["gt"] if "gt" in batch else None
        where = f"{names[c]} ({dataset})"
        if ds.video_kind == "test_clip":
            t = lq.shape[1]
            keep = [t // 2] if center else None
            for idx, out in clip_outputs(net, lq, acc, scale=scale, chunk=chunk, chunk_pad=chunk_pad, flip_seq=flip,
                                         tile=tile, tile_pad=tile_pad):
                sel = [k for k, f in enumerate(idx) if keep is None or f in keep]
                if not sel:
                    continue
                out_f = quantize(out[0, sel])
                got = [idx[k] for k in sel]
                _collect(out_f, gt[0, got] if gt is not None else None, got, c, pad, offsets, parts, slots,
                         metrics_opt, where)
                if save_dir is not None and not pad:
                    _save(acc, out_f, [ds.frame_name(c, f) for f in got], save_dir / names[c], suffix)
                acc.mark_step()
        else:
            if flip:
                lq = torch.cat([lq, lq.flip(1)], dim=1)
            out = window_forward(net, lq, acc, scale=scale, tile=tile, tile_pad=tile_pad)
            if out.dim() == 5:  # a recurrent network on windows: its centre frame (Vimeo-90K protocol)
                n = out.shape[1] // 2 if flip else out.shape[1]
                mid = n // 2
                out = 0.5 * (out[:, mid] + out[:, out.shape[1] - 1 - mid]) if flip else out[:, mid]
            elif flip:
                raise OptionError("val.flip_seq: averages a clip with its reverse, which needs a recurrent network; "
                                  "remove it for window networks such as EDVR")
            out_f = quantize(out)
            g = gt if gt is None or gt.dim() == 4 else gt[:, gt.shape[1] // 2]
            _collect(out_f, g, frames, c, pad, offsets, parts, slots, metrics_opt, where)
            if save_dir is not None and not pad:
                _save(acc, out_f, [ds.frame_name(c, frames[0])], save_dir / names[c], suffix)
        acc.mark_step()
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    if was_training:
        net.train()
    return _reduce(acc, dataset, metrics_opt, parts, slots, names, offsets, lengths)


def _collect(out: torch.Tensor, gt: torch.Tensor | None, frames: list[int], clip: int, pad: bool, offsets: list[int],
             parts: list[torch.Tensor], slots: list[int], metrics_opt: dict[str, Any], where: str) -> None:
    """Record the metrics of output frames (k, c, H, W) into their slots (padding items record nothing)."""
    if pad:
        return
    if gt is None or not metrics_opt:
        values = out.new_zeros(len(frames), 0)
    else:
        values = _frame_metrics(out, gt, metrics_opt, where)
    parts.append(values)
    slots.extend(offsets[clip] + f for f in frames)


def _save(acc: Accelerator, frames: torch.Tensor, names: list[str], folder: Path, suffix: str | None) -> None:
    host = acc.to_host(frames)
    folder.mkdir(parents=True, exist_ok=True)
    for img, name in zip(host, names):
        write_image(folder / (f"{name}_{suffix}.png" if suffix else f"{name}.png"), tensor2img(img))


def _reduce(acc: Accelerator, dataset: str, metrics_opt: dict[str, Any], parts: list[torch.Tensor],
            slots: list[int], names: list[str], offsets: list[int], lengths: list[int]) -> EvalResult:
    """One reduction of the (frames x metrics) table and the scored-frame mask; averages per clip, then over clips."""
    device = acc.device
    total, m = sum(lengths), len(metrics_opt)
    table = torch.zeros(total, m, device=device)
    mask = torch.zeros(total, device=device)
    if slots:
        idx = torch.tensor(slots, dtype=torch.long).to(device)
        table = table.index_put((idx,), torch.cat(parts).to(device), accumulate=True)
        mask = mask.index_put((idx,), torch.ones(len(slots), device=device), accumulate=True)
    packed = acc.to_host(acc.strategy.all_reduce(torch.cat([table.flatten(), mask]), "sum")).double()
    table_h, mask_h = packed[: total * m].view(total, m), packed[total * m:]
    if bool((mask_h > 1).any()):
        raise DataError(f"{dataset}: a frame was scored twice; the clip dataset's items overlap")
    keys = list(metrics_opt)
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


__all__ = ["Chunk", "chunked_outputs", "clip_dataset", "clip_outputs", "evaluate_clips", "is_clip_loader",
           "pad_indices", "plan_chunks", "window_forward"]

"""Network passes shared by evaluation and inference: images (tiled in space on request) and clips (window
networks on frame windows, recurrent networks in overlapping temporal chunks), in eval mode under the
accelerator's autocast.

Recurrent networks (BasicVSR, IconVSR, BasicVSR++) map a clip to a clip: it runs in overlapping temporal chunks
when a chunk is set (``chunk`` frames kept per pass, ``chunk_pad`` frames of context on each side), so memory is
bounded by the chunk, not the clip, and XLA sees one window shape. ``flip_seq`` runs the window and its reverse
and averages them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from anysr.accelerators import Accelerator
from anysr.archs.basicvsr_arch import reflect_index
from anysr.errors import OptionError
from anysr.ops.tiling import round_up, tile_forward, tile_multiple

__all__ = ["CALIBRATION_SIDE", "Chunk", "calibration_side", "chunked_outputs", "clip_outputs", "pad_indices",
           "plan_chunks", "quantize", "run_network", "window_forward"]

CALIBRATION_SIDE = 128  # input side used to time precision / memory-format candidates for untiled inference
CALIBRATION_MAX_SIDE = 256  # larger tiles are timed at this side (untiled inference is timed at 128, whatever the size)


def calibration_side(tile: int, tile_pad: int, multiple: int) -> int:
    """The input side the hardware choices are timed on for tiles of ``tile`` + 2 ``tile_pad`` (already multiples
    of the network's ``multiple``): the tile's window, at most ``CALIBRATION_MAX_SIDE`` (rounded up to
    ``multiple``), so a tile larger than any image costs no time nor memory before the work."""
    return min(tile + 2 * tile_pad, round_up(CALIBRATION_MAX_SIDE, multiple))


def quantize(x: torch.Tensor, bits: Sequence[int] | None = None) -> torch.Tensor:
    """What saving does to an image: clamp to [0, 1] and round to 1/255 steps, or to 1/65535 steps for the images
    of the batch whose ``bits`` (a host list, one per image) is 16."""
    if bits is None or all(int(b) != 16 for b in bits):
        return (x.clamp(0, 1) * 255).round() / 255
    levels = torch.tensor([65535.0 if int(b) == 16 else 255.0 for b in bits], dtype=x.dtype)
    levels = levels.to(x.device).view(-1, *([1] * (x.dim() - 1)))
    return (x.clamp(0, 1) * levels).round() / levels


def run_network(net: nn.Module, lq: torch.Tensor, acc: Accelerator, *, scale: int, tile: int | None,
                tile_pad: int) -> torch.Tensor:
    """Forward in eval mode under the accelerator's autocast, tiled with fixed-size tiles when asked (rounded up
    to the network's ``tile_multiple``, on its window grid)."""
    forward = acc.inference_forward(net)
    with torch.no_grad(), acc.precision.autocast():
        if tile:
            out = tile_forward(forward, lq, scale, tile, tile_pad, static=acc.static_shapes,
                               multiple=tile_multiple(net))
        else:
            out = forward(lq)
    return out.float()


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

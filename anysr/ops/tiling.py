"""Tiled forward passes with fixed-size tiles, so any image fits in memory and XLA compiles one shape.

Every tile's input window is ``tile + 2 * tile_pad`` square and lies inside the image (windows are shifted
inward at the borders, never padded), so the network sees the same context as on the whole image: with a
``tile_pad`` at least the receptive-field radius, tiled and untiled outputs agree to float rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _starts(length: int, tile: int) -> list[int]:
    """Output-tile origins covering ``length``; the last one is moved back so every tile is ``tile`` long."""
    if length <= tile:
        return [0]
    starts = list(range(0, length - tile, tile))
    starts.append(length - tile)
    return starts


def tile_forward(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, scale: int, tile: int,
                 tile_pad: int = 10, tile_batch: int = 1, *, static: bool = False) -> torch.Tensor:
    """Run ``fn`` (an image-to-image network upscaling by ``scale``) over ``x`` (NCHW) tile by tile.

    Dimensions smaller than ``tile + 2 * tile_pad`` are processed whole, or, with ``static=True`` (XLA: one
    compiled shape for every image), replicate-padded up to the window and cropped after; that changes the
    result near those borders only, where the network would otherwise see its own zero padding.
    """
    if tile <= 0:
        return fn(x)
    n, _, h, w = x.shape
    win = tile + 2 * tile_pad
    if static and (h < win or w < win):
        padded = torch.nn.functional.pad(x, (0, max(0, win - w), 0, max(0, win - h)), mode="replicate")
        return tile_forward(fn, padded, scale, tile, tile_pad, tile_batch)[:, :, : h * scale, : w * scale]
    win_h, win_w = min(win, h), min(win, w)
    out_h_tile, out_w_tile = min(tile, h), min(tile, w)
    jobs: list[tuple[int, int, int, int]] = []  # (out_y, out_x, win_y, win_x)
    for oy in _starts(h, out_h_tile):
        wy = min(max(oy - tile_pad, 0), h - win_h)
        for ox in _starts(w, out_w_tile):
            wx = min(max(ox - tile_pad, 0), w - win_w)
            jobs.append((oy, ox, wy, wx))
    out: torch.Tensor | None = None
    for first in range(0, len(jobs), tile_batch):
        group = jobs[first:first + tile_batch]
        crops = [x[:, :, wy:wy + win_h, wx:wx + win_w] for _, _, wy, wx in group]
        while len(crops) < tile_batch:  # pad the last batch so every call has the same shape
            crops.append(crops[-1])
        result = fn(torch.cat(crops, dim=0))
        if out is None:
            out = result.new_zeros((n, result.shape[1], h * scale, w * scale))
        for k, (oy, ox, wy, wx) in enumerate(group):
            piece = result[k * n:(k + 1) * n]
            ry, rx = (oy - wy) * scale, (ox - wx) * scale
            out[:, :, oy * scale:(oy + out_h_tile) * scale, ox * scale:(ox + out_w_tile) * scale] = \
                piece[:, :, ry:ry + out_h_tile * scale, rx:rx + out_w_tile * scale]
    assert out is not None
    return out

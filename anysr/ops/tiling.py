"""Tiled forward passes with fixed-size tiles, so any image fits in memory and XLA compiles one shape.

Every tile's input window is ``tile + 2 * tile_pad`` square and lies inside the image (windows are shifted
inward at the borders, never padded), so the network sees the same context as on the whole image: with a
``tile_pad`` at least the receptive-field radius, tiled and untiled outputs agree to float rounding.

Window-attention networks declare a ``tile_multiple`` (the ``TiledNetwork`` protocol): they pad their input to a
multiple of it and attend within windows laid out from the top-left corner. Tiling such a network rounds the tile
and the pad up to that multiple and first pads the image as the network would (``padded_index``: reflect, then
edge), so every window starts on the network's own window grid and no tile is padded again inside the network:
tiled and untiled outputs then agree to float rounding too (given a large enough pad, and no global operation
such as channel attention over the whole image).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn


@runtime_checkable
class TiledNetwork(Protocol):
    """A network that declares ``tile_multiple``: the side multiple its input is padded to inside ``forward``.

    A window-attention network pads the bottom / right of its input to a multiple of its windows (reflect, then
    edge: ``archs.arch_util.pad_bottom_right``) and attends within windows laid out from the top-left corner; a
    U-Net pads to a multiple of its downsampling factor. Tiles of such a network are sized and placed on that grid
    (see the module's docstring). ``1`` (or not declaring it) means any size is run as it is. It is a plain
    attribute or property, never a state-dict key.
    """

    tile_multiple: int


def tile_multiple(net: nn.Module) -> int:
    """The ``tile_multiple`` a network declares (``TiledNetwork``), else 1.

    Looks through wrappers (DDP's ``module``, ``torch.compile``'s ``_orig_mod``)."""
    seen = 0
    while seen < 4:
        if isinstance(net, TiledNetwork):
            value = net.tile_multiple
            if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
                return value
        inner = getattr(net, "_orig_mod", None) or getattr(net, "module", None)
        if not isinstance(inner, nn.Module):
            return 1
        net, seen = inner, seen + 1
    return 1


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is >= ``value``."""
    return -(-value // multiple) * multiple


def aligned_tile(tile: int, tile_pad: int, multiple: int) -> tuple[int, int]:
    """``tile`` and ``tile_pad`` rounded up to ``multiple`` (a tile of at least one multiple)."""
    if multiple <= 1:
        return tile, tile_pad
    return max(round_up(tile, multiple), multiple), round_up(tile_pad, multiple)


def padded_index(length: int, target: int) -> np.ndarray:
    """Source indices that grow an axis of ``length`` to ``target`` at its end as the window-attention networks
    pad (``archs.arch_util.pad_bottom_right``): reflected (without repeating the edge) as far as the axis allows,
    then the last reflected pixel repeated."""
    j = np.arange(target)
    reach = min(target - length, length - 1)
    return np.where(j < length, j, 2 * (length - 1) - np.minimum(j, length - 1 + reach))


def _starts(length: int, tile: int) -> list[int]:
    """Output-tile origins covering ``length``; the last one is moved back so every tile is ``tile`` long."""
    if length <= tile:
        return [0]
    starts = list(range(0, length - tile, tile))
    starts.append(length - tile)
    return starts


@dataclass(frozen=True)
class TilePlan:
    """Where the tiles of an ``h`` x ``w`` input go: every input window is ``win_h`` x ``win_w`` (inside the image),
    every output tile ``tile_h`` x ``tile_w`` input pixels; ``jobs`` holds (out_y, out_x, win_y, win_x)."""

    win_h: int
    win_w: int
    tile_h: int
    tile_w: int
    jobs: list[tuple[int, int, int, int]]


def plan_tiles(h: int, w: int, tile: int, tile_pad: int) -> TilePlan:
    """The tiles covering an ``h`` x ``w`` input with ``tile``-sized outputs and ``tile_pad`` context pixels."""
    win = tile + 2 * tile_pad
    win_h, win_w = min(win, h), min(win, w)
    tile_h, tile_w = min(tile, h), min(tile, w)
    jobs: list[tuple[int, int, int, int]] = []
    for oy in _starts(h, tile_h):
        wy = min(max(oy - tile_pad, 0), h - win_h)
        for ox in _starts(w, tile_w):
            wx = min(max(ox - tile_pad, 0), w - win_w)
            jobs.append((oy, ox, wy, wx))
    return TilePlan(win_h, win_w, tile_h, tile_w, jobs)


def pad_to_multiple(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """Grow the bottom / right of an NCHW tensor to a multiple of ``multiple`` as ``padded_index`` says."""
    h, w = x.shape[-2:]
    hp, wp = round_up(h, multiple), round_up(w, multiple)
    if hp != h:
        x = x.index_select(-2, torch.from_numpy(padded_index(h, hp)).to(x.device))
    if wp != w:
        x = x.index_select(-1, torch.from_numpy(padded_index(w, wp)).to(x.device))
    return x


def tile_forward(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, scale: int, tile: int,
                 tile_pad: int = 10, tile_batch: int = 1, *, static: bool = False, multiple: int = 1) -> torch.Tensor:
    """Run ``fn`` (an image-to-image network upscaling by ``scale``) over ``x`` (NCHW) tile by tile.

    Dimensions smaller than ``tile + 2 * tile_pad`` are processed whole, or, with ``static=True`` (XLA: one
    compiled shape for every image), replicate-padded up to the window and cropped after; that changes the
    result near those borders only, where the network would otherwise see its own zero padding.
    ``multiple`` (the network's ``tile_multiple``): tile and pad are rounded up to it and the image is first
    padded to it as the network pads, so tiles sit on the network's window grid (see the module's docstring).
    """
    if tile <= 0:
        return fn(x)
    n, _, h, w = x.shape
    if multiple > 1:
        tile, tile_pad = aligned_tile(tile, tile_pad, multiple)
        padded = pad_to_multiple(x, multiple)
        out = tile_forward(fn, padded, scale, tile, tile_pad, tile_batch, static=static)
        return out[:, :, : h * scale, : w * scale] if padded.shape != x.shape else out
    win = tile + 2 * tile_pad
    if static and (h < win or w < win):
        padded = torch.nn.functional.pad(x, (0, max(0, win - w), 0, max(0, win - h)), mode="replicate")
        return tile_forward(fn, padded, scale, tile, tile_pad, tile_batch)[:, :, : h * scale, : w * scale]
    plan = plan_tiles(h, w, tile, tile_pad)
    win_h, win_w, out_h_tile, out_w_tile, jobs = plan.win_h, plan.win_w, plan.tile_h, plan.tile_w, plan.jobs
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

"""RoIAlign (He et al., Mask R-CNN) in plain PyTorch: ``torchvision.ops.roi_align``'s arithmetic without torchvision.

Each box ``(batch index, x1, y1, x2, y2)`` is cut into ``out_h x out_w`` bins; a bin's value is the mean of
``grid_h x grid_w`` bilinear samples at the centres of a regular sub-grid of the bin. As torchvision:
``spatial_scale`` scales the box, ``aligned=False`` (GFPGAN's) makes a box at least one pixel wide and samples at
pixel corners, ``aligned=True`` shifts the box by half a pixel; ``sampling_ratio <= 0`` chooses the sub-grid per
box, ``ceil(box side / output side)``; a sample more than one pixel outside the image counts as 0, one within a
pixel outside is clamped to the border.

Written for every device: the sub-grid size of a box is data (it depends on the box), so every box is sampled on
one grid (the largest any box needs, or a static bound: ``max_grid``, ``static_grid``) and the samples past its
own grid are masked out: one graph per input and output shape (XLA), gathers instead of a per-box loop (the
bilinear weights are separable: rows are pooled before columns), gradients to the input by autograd. The boxes
get no gradient.
"""

from __future__ import annotations

import math

import torch


def _bilinear_weights(pos: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                 torch.Tensor]:
    """For sample coordinates ``pos`` along an axis of ``size`` pixels: (low index, high index, low weight, high
    weight), torchvision's edge rules (beyond one pixel outside: weight 0; within it: clamped)."""
    inside = (pos >= -1.0) & (pos <= size)
    pos = pos.clamp(min=0.0)
    low = pos.floor().clamp(max=size - 1)
    at_edge = low >= size - 1
    pos = torch.where(at_edge, low, pos)
    high = torch.where(at_edge, low, low + 1)
    frac = pos - low
    keep = inside.to(pos.dtype)
    return low.long(), high.long(), (1.0 - frac) * keep, frac * keep


def roi_align(x: torch.Tensor, boxes: torch.Tensor, output_size: int | tuple[int, int], spatial_scale: float = 1.0,
              sampling_ratio: int = -1, aligned: bool = False, max_grid: int | None = None) -> torch.Tensor:
    """``(K, C, out_h, out_w)`` features of the ``K`` boxes (``(K, 5)``: batch index, x1, y1, x2, y2 in input
    pixels times ``1 / spatial_scale``) pooled from ``x`` ``(N, C, H, W)``, as ``torchvision.ops.roi_align``.

    ``max_grid`` (adaptive sub-grids only): the static sub-grid bound, for devices that compile per shape (XLA);
    a box needing more samples per bin (only a box reaching more than a pixel past the image can) is sampled on
    this many. None: the bound is read from the boxes (one read of their values), exact for any box."""
    if x.ndim != 4:
        raise ValueError(f"roi_align: expected an (N, C, H, W) input, got shape {tuple(x.shape)}")
    if boxes.ndim != 2 or boxes.shape[1] != 5:
        raise ValueError(f"roi_align: expected (K, 5) boxes (batch index, x1, y1, x2, y2), got {tuple(boxes.shape)}")
    out_h, out_w = (output_size, output_size) if isinstance(output_size, int) else output_size
    n, c, h, w = x.shape
    k = boxes.shape[0]
    if k == 0:
        return x.new_zeros(0, c, out_h, out_w)
    boxes = boxes.detach().to(torch.float32)
    offset = 0.5 if aligned else 0.0
    x1, y1, x2, y2 = (boxes[:, i] * spatial_scale - offset for i in range(1, 5))
    roi_w, roi_h = x2 - x1, y2 - y1
    if not aligned:
        roi_w, roi_h = roi_w.clamp(min=1.0), roi_h.clamp(min=1.0)
    bin_h, bin_w = roi_h / out_h, roi_w / out_w
    if sampling_ratio > 0:
        grid_h = torch.full_like(roi_h, float(sampling_ratio))
        grid_w = torch.full_like(roi_w, float(sampling_ratio))
        max_gh = max_gw = sampling_ratio
    else:
        grid_h, grid_w = torch.ceil(roi_h / out_h), torch.ceil(roi_w / out_w)  # <= 0: no sample (the bin is 0)
        if max_grid is None:
            max_gh, max_gw = (max(1, int(v)) for v in torch.stack([grid_h.max(), grid_w.max()]).tolist())
        else:
            max_gh = max_gw = max(1, int(max_grid))
            grid_h, grid_w = grid_h.clamp(max=max_gh), grid_w.clamp(max=max_gw)

    def positions(start: torch.Tensor, bin_size: torch.Tensor, grid: torch.Tensor, bins: int,
                  max_grid: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, bins, max_grid) sample coordinates and the mask of the samples inside each box's own grid."""
        b = torch.arange(bins, device=start.device, dtype=torch.float32)
        g = torch.arange(max_grid, device=start.device, dtype=torch.float32)
        step = bin_size / grid
        pos = start[:, None, None] + b[None, :, None] * bin_size[:, None, None] + \
            (g[None, None, :] + 0.5) * step[:, None, None]
        mask = (g[None, None, :] < grid[:, None, None]).expand(-1, bins, -1)
        return pos, mask

    py, my = positions(y1, bin_h, grid_h, out_h, max_gh)  # (K, out_h, gh)
    px, mx = positions(x1, bin_w, grid_w, out_w, max_gw)  # (K, out_w, gw)
    ylo, yhi, wylo, wyhi = _bilinear_weights(py, h)
    xlo, xhi, wxlo, wxhi = _bilinear_weights(px, w)
    wy = torch.stack([wylo, wyhi], -1) * my[..., None]  # (K, out_h, gh, 2)
    wx = torch.stack([wxlo, wxhi], -1) * mx[..., None]  # (K, out_w, gw, 2)
    iy = torch.stack([ylo, yhi], -1)
    ix = torch.stack([xlo, xhi], -1)
    count = (grid_h * grid_w).clamp(min=1.0)

    # Bilinear weights are separable: sum each bin's row samples first ((K, C, out_h, W)), then its columns.
    img = x.index_select(0, boxes[:, 0].round().long().clamp(0, n - 1))
    rows = img.gather(2, iy.reshape(k, 1, -1, 1).expand(k, c, -1, w))  # (K, C, out_h * gh * 2, W)
    rows = (rows.view(k, c, out_h, max_gh * 2, w) * wy.reshape(k, 1, out_h, max_gh * 2, 1).to(rows.dtype)).sum(3)
    cols = rows.gather(3, ix.reshape(k, 1, 1, -1).expand(k, c, out_h, -1))  # (K, C, out_h, out_w * gw * 2)
    out = (cols.view(k, c, out_h, out_w, max_gw * 2) * wx.reshape(k, 1, 1, out_w, max_gw * 2).to(cols.dtype)).sum(4)
    return out / count.view(k, 1, 1, 1).to(out.dtype)


def static_grid(size: int, output_size: int) -> int:
    """The adaptive sub-grid any box inside a ``size``-pixel side can need for ``output_size`` bins (a bound that
    depends on shapes alone: ``max_grid`` for XLA)."""
    return max(1, math.ceil((size + 1) / output_size))


__all__ = ["roi_align", "static_grid"]

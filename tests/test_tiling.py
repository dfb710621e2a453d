"""Fixed-shape tiling: every tile has one shape, and the result equals the untiled forward."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from anysr.ops.tiling import tile_forward


def _net(scale: int) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                               nn.Conv2d(8, 3 * scale * scale, 3, padding=1), nn.PixelShuffle(scale)]
    return nn.Sequential(*layers).eval()


@pytest.mark.parametrize(("h", "w", "tile", "pad"), [(37, 53, 16, 4), (40, 40, 8, 3), (20, 70, 32, 5)])
def test_tiled_equals_untiled_when_pad_covers_receptive_field(h: int, w: int, tile: int, pad: int) -> None:
    net = _net(2)
    x = torch.rand(1, 3, h, w)
    shapes: set[tuple[int, ...]] = set()

    def fn(t: torch.Tensor) -> torch.Tensor:
        shapes.add(tuple(t.shape))
        return net(t)

    with torch.no_grad():
        full = net(x)
        tiled = tile_forward(fn, x, 2, tile, pad)
    assert tiled.shape == full.shape
    torch.testing.assert_close(tiled, full, rtol=0, atol=1e-5)
    assert len(shapes) == 1  # one shape: XLA compiles the tile once


def test_too_small_padding_differs_but_keeps_shape() -> None:
    net = _net(2)
    x = torch.rand(1, 3, 40, 40)
    with torch.no_grad():
        full = net(x)
        tiled = tile_forward(net, x, 2, 8, 0)
    assert tiled.shape == full.shape
    assert (tiled - full).abs().max() > 1e-4


def test_tile_batch_pads_last_batch() -> None:
    net = _net(3)
    x = torch.rand(2, 3, 30, 25)
    calls: list[int] = []

    def fn(t: torch.Tensor) -> torch.Tensor:
        calls.append(t.shape[0])
        return net(t)

    with torch.no_grad():
        out = tile_forward(fn, x, 3, 10, 3, tile_batch=4)
        torch.testing.assert_close(out, net(x), rtol=0, atol=1e-5)
    assert set(calls) == {8}  # 4 tiles x batch 2, last group padded to full size


def test_static_mode_gives_one_shape_for_every_image_size() -> None:
    net = _net(2)
    shapes: set[tuple[int, ...]] = set()

    def fn(t: torch.Tensor) -> torch.Tensor:
        shapes.add(tuple(t.shape))
        return net(t)

    with torch.no_grad():
        for h, w in ((57, 86), (64, 64), (20, 30), (100, 41)):
            x = torch.rand(1, 3, h, w)
            out = tile_forward(fn, x, 2, 16, 4, static=True)
            assert out.shape == (1, 3, 2 * h, 2 * w)
            if h >= 24 and w >= 24:  # large enough: still exact
                torch.testing.assert_close(out, net(x), rtol=0, atol=1e-5)
    assert shapes == {(1, 3, 24, 24)}

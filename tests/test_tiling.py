"""Fixed-shape tiling: every tile has one shape, and the result equals the untiled forward; the ``tile_multiple``
that windowed networks declare (``TiledNetwork``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from anysr.archs import arch_kwargs, build_network
from anysr.ops.tiling import TiledNetwork, tile_forward, tile_multiple
from anysr.registry import ARCH_REGISTRY


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


# ----------------------------------------------------------------------------- the tile_multiple protocol

# A small build of every architecture that works in windows (argument window_size / split_size, or fixed ones).
WINDOWED = {
    "SwinIR": {"img_size": 8, "embed_dim": 12, "depths": [2], "num_heads": [2], "window_size": 4, "mlp_ratio": 2.0},
    "HAT": {"img_size": 8, "embed_dim": 12, "depths": [2], "num_heads": [2], "window_size": 4, "squeeze_factor": 4,
            "mlp_ratio": 2.0},
    "DAT": {"img_size": 8, "embed_dim": 32, "depth": [2], "num_heads": [2], "split_size": [2, 6],
            "expansion_factor": 2.0},
    "DAT_iLN": {"img_size": 8, "embed_dim": 32, "depth": [2], "num_heads": [2], "split_size": [2, 6],
                "expansion_factor": 2.0},
    "DCT": {"img_size": 8, "embed_dim": 64, "depth": [2], "num_heads": [4], "split_size": [2, 6],
            "expansion_factor": 0.5},
    "HAT_iLN": {"img_size": 8, "embed_dim": 12, "depths": [2], "num_heads": [2], "window_size": 4,
                "squeeze_factor": 4, "mlp_ratio": 2.0},
    "DRCT": {"img_size": 8, "embed_dim": 12, "depths": [1], "num_heads": [2], "window_size": 4, "gc": 4,
             "mlp_ratio": 2.0},
    "OmniSR": {"num_feat": 8, "window_size": 6, "up_scale": 2},
    "SCUNet": {"config": [0, 1, 0, 0, 0, 0, 1], "dim": 64},
    "Swin2SR": {"img_size": 8, "embed_dim": 12, "depths": [2], "num_heads": [2], "window_size": 4, "mlp_ratio": 2.0},
    "RGT": {"img_size": 16, "embed_dim": 32, "depth": [2], "num_heads": [2], "split_size": [2, 4]},
    "CRAFT": {"embed_dim": 32, "depths": [1], "num_heads": [2], "window_size": 8, "split_size_0": 2,
              "split_size_1": 8},
    "ATD": {"img_size": 8, "embed_dim": 16, "depths": [2], "num_heads": [2], "window_size": 4, "category_size": 24,
            "num_tokens": 8, "reducted_dim": 4},
    "ESCRealM": {"dim": 8, "pdim": 4, "kernel_size": 5, "n_blocks": 1, "conv_blocks": 1, "window_size": 4,
                 "num_heads": 2, "mid_dim": 8},
    "ESCFP": {"dim": 8, "pdim": 4, "kernel_size": 5, "n_blocks": 1, "conv_blocks": 1, "window_size": 4,
              "num_heads": 2},
    "FDAT": {"embed_dim": 16, "num_groups": 1, "depth_per_group": 2, "num_heads": 2, "window_size": 4, "mid_dim": 8},
    "TFDAT": {"embed_dim": 16, "num_groups": 1, "depth_per_group": 2, "num_heads": 2, "window_size": 4, "mid_dim": 8},
    "GRL": {"embed_dim": 8, "depths": [2], "num_heads_window": [2], "num_heads_stripe": [2], "window_size": 4,
            "stripe_size": [8, 4], "anchor_window_down_factor": 2},
    "SRFormer": {"img_size": 8, "embed_dim": 16, "depths": [2], "num_heads": [2], "window_size": 4, "mlp_ratio": 2.0},
    "SRFormerv2": {"img_size": 16, "embed_dim": 8, "squeeze_dim": 2, "depths": [2], "num_heads": [2], "window_size": 8,
                   "mlp_ratio": 2.0},  # PSA window 8, Swin window 12: tile multiple 24
    "FlexNet": {"dim": 8, "num_blocks": [1], "hidden_rate": 2},
    "DWT": {"img_size": 8, "embed_dim": 8, "depths": [2, 2], "num_heads": [2, 2], "window_size": 2,
            "mlp_ratio": 2.0},
    "HMA": {"img_size": 8, "embed_dim": 8, "depths": [2], "num_heads": [2], "window_size": 4, "interval_size": 3},
    "GRFormer": {"img_size": 12, "embed_dim": 8, "depths": [2], "num_heads": [2], "window_size": [3, 4]},
    "ASID": {"num_feat": 8, "window_size": 4},
    "LAWFFT": {"dim": 8, "n_rblock": 1, "n_mblock": 2, "window_size": 4, "scale": 2, "unshuffle_mod": True,
               "mid_dim": 8},  # the padding multiple: the window times the unshuffle factor (8)
}


def test_every_windowed_arch_is_covered() -> None:
    windowed = {name for name in ARCH_REGISTRY.keys() if {"window_size", "split_size"} & set(arch_kwargs(name))}
    assert windowed <= set(WINDOWED), f"add a small build of {sorted(windowed - set(WINDOWED))} to WINDOWED"


@pytest.mark.parametrize("arch", sorted(WINDOWED))
def test_windowed_archs_declare_tile_multiple(arch: str) -> None:
    """Through the protocol, and a multiple of every window any of its modules uses."""
    net = build_network({"type": arch, **WINDOWED[arch]})
    assert isinstance(net, TiledNetwork)
    multiple = tile_multiple(net)
    assert multiple == net.tile_multiple > 1
    windows = {int(w) for m in net.modules() for w in _windows(m)}
    assert windows, f"{arch}: no module has a window_size / split_size"
    assert all(multiple % w == 0 for w in windows), (arch, multiple, windows)
    assert "tile_multiple" not in "".join(net.state_dict()), "an attribute, never a state-dict key"


def _windows(m: nn.Module) -> list[int]:
    found: list[int] = []
    for attr in ("window_size", "split_size"):
        value = m.__dict__.get(attr, getattr(type(m), attr, None))
        if isinstance(value, int):
            found.append(value)
        elif isinstance(value, (tuple, list)):
            found += [v for v in value if isinstance(v, int)]
    return found


def test_tile_multiple_defaults_to_one_and_looks_through_wrappers() -> None:
    plain = _net(2)
    assert not isinstance(plain, TiledNetwork) and tile_multiple(plain) == 1

    class Padded(nn.Module):
        tile_multiple = 8

    class Wrapper(nn.Module):  # as DDP (``module``) or torch.compile (``_orig_mod``) wrap a network
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.module = inner

    assert isinstance(Padded(), TiledNetwork) and tile_multiple(Wrapper(Wrapper(Padded()))) == 8

"""neosr's HMA (``hma``, ``hma_medium``, ``hma_large``) and GRFormer (``grformer``, ``grformer_medium``,
``grformer_large``).

Fixtures come from neosr's own source (``tools/fixtures/make_neosr_transformer_fixtures.py``): the state dicts load
strictly and give its outputs (eval mode; sizes neosr's HMA cannot run are compared with it on the reflect-padded
input, cropped, which anysr's ``forward`` does inside; GRFormer pads itself) and its training-mode gradients. Also: the
presets build neosr's sizes, bad arguments are refused naming the argument, ONNX through anysr's exporter at a size
never traced, and an XLA:CPU train step that compiles once with no aten op left to the CPU (``-m xla``). The checks
every architecture gets (channels_last, bf16 autocast, the meta device, gradients, training runs) run from
``tests/archs/test_standard.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from arch_checks import FIXTURES, check_onnx_at_unseen_size, check_xla_train_step, manifest

from anysr.archs import build_network
from anysr.errors import OptionError

GROUP = "neosr_transformer"
MANIFEST = manifest(GROUP)["cases"]

# Tiny networks (ONNX, XLA, the training rows in tests/archs/test_standard.py)
TINY = {
    "HMA": {"type": "HMA", "img_size": 8, "embed_dim": 32, "depths": [2], "num_heads": [4], "window_size": 4,
            "interval_size": 2, "upscale": 2, "drop_path_rate": 0.0},
    "GRFormer": {"type": "GRFormer", "img_size": 8, "embed_dim": 8, "depths": [2], "num_heads": [2],
                 "window_size": [2, 4], "upscale": 2, "drop_path_rate": 0.0},
}
SCALES = {"HMA": 2, "GRFormer": 2}


# ----------------------------------------------------------------------------- neosr parity

def test_fixtures_cover_every_arch() -> None:
    assert {c["type"] for c in MANIFEST.values()} == {"HMA", "GRFormer"}
    assert all(p.stat().st_size < 200_000 for p in (FIXTURES / GROUP).iterdir())


def test_tile_multiple_covers_window_and_grid() -> None:
    assert build_network(TINY["HMA"]).tile_multiple == 4
    net = build_network({**TINY["HMA"], "window_size": 4, "interval_size": 3, "img_size": 12})
    assert net.tile_multiple == 12
    assert build_network(TINY["GRFormer"]).tile_multiple == 4
    assert build_network({"type": "grformer"}).tile_multiple == 32  # neosr's 8 x 32 windows


def test_grformer_masks_follow_neosr_regions() -> None:
    """A shift longer than the window (the turned 8 x 2 windows shifted by (1, 4)) leaves two column regions, as
    neosr's slice assignments do, and the stored mask is the one forward computes at img_size."""
    from anysr.archs.grformer_arch import grformer_mask  # noqa: PLC0415

    h, w, window, shift = 8, 16, (8, 2), (1, 4)
    label = torch.zeros(h, w)
    count = 0
    for rows in (slice(0, -window[0]), slice(-window[0], -shift[0]), slice(-shift[0], None)):
        for cols in (slice(0, -window[1]), slice(-window[1], -shift[1]), slice(-shift[1], None)):
            label[rows, cols] = count
            count += 1
    flat = label.view(h // window[0], window[0], w // window[1], window[1]).permute(0, 2, 1, 3).reshape(-1, 16)
    want = torch.where(flat[:, :, None] != flat[:, None, :], -1e9, 0.0)
    torch.testing.assert_close(grformer_mask(h, w, window, shift), want)
    assert len(label.unique()) == 4  # rows 0-6 / 7, columns 0-11 / 12-15
    net = build_network(MANIFEST["grformer_x4_longshift"]["kwargs"] | {"type": "GRFormer"})
    block = net.layers[0].blocks[3]
    assert block.window_size == (8, 2) and block.shift_size == (1, 4)
    torch.testing.assert_close(block.attn_mask, grformer_mask(8, 8, (8, 2), (1, 4)))


# ----------------------------------------------------------------------------- presets

@pytest.mark.parametrize(("name", "scale", "params"), [
    ("hma_medium", 4, 69_870_387), ("hma_large", 4, 139_671_327), ("grformer_medium", 4, 9_496_236),
    ("grformer_large", 4, 18_617_484),
])
def test_presets_build_neosrs_sizes(name: str, scale: int, params: int) -> None:
    """Parameter counts of neosr's builders (counted with neosr's code; also: hma 5,537,111 and grformer
    800,412 at x4, hma_medium 69,722,675 and grformer_medium 9,437,880 at x2)."""
    with torch.device("meta"):
        net = build_network({"type": name, "upscale": scale})
    assert type(net).__name__ == ("HMA" if name.startswith("hma") else "GRFormer")
    assert sum(p.numel() for p in net.parameters()) == params


def test_preset_takes_the_top_level_scale_spelling() -> None:
    with torch.device("meta"):
        net = build_network({"type": "hma_medium", "scale": 2})
    assert net.upscale == 2 and net.window_size == 16


# ----------------------------------------------------------------------------- bad arguments

@pytest.mark.parametrize(("opt", "pattern"), [
    ({"embed_dim": 18, "num_heads": [2]}, r"network_g\.embed_dim: HMA: embed_dim must be divisible by 4"),
    ({"num_heads": [3]}, r"network_g\.num_heads: HMA: each head count must be even"),
    ({"embed_dim": 8, "num_heads": [8]}, r"network_g\.num_heads: .*its half divide embed_dim / 4; got 8"),
    ({"num_heads": [2, 2]}, r"network_g\.num_heads: HMA: num_heads has 2 entries"),
    ({"interval_size": 0}, r"network_g\.interval_size: HMA: interval_size must be a positive integer"),
    ({"window_size": 1}, r"network_g\.window_size: HMA: window_size must be at least 2"),
    ({"img_size": 2}, r"network_g\.img_size: HMA: img_size 2 .*at least window_size 4"),
    ({"upsampler": "pixelshuffledirect"}, r"network_g\.upsampler: HMA: upsampler must be 'pixelshuffle'"),
    ({"resi_connection": "3conv"}, r"network_g\.resi_connection: HMA: unknown resi_connection"),
    ({"upscale": 5}, r"network_g\.upscale: "),
])
def test_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern) as err:
        build_network({**TINY["HMA"], **opt})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"embed_dim": 7, "num_heads": [1]}, r"network_g\.embed_dim: GRFormer: embed_dim must be even"),
    ({"num_heads": [3]}, r"network_g\.num_heads: GRFormer: embed_dim 8 is not divisible by 3 heads"),
    ({"num_heads": [2, 2]}, r"network_g\.num_heads: GRFormer: num_heads has 2 entries"),
    ({"window_size": [1, 4]}, r"network_g\.window_size: GRFormer: window_size must be two integers >= 2"),
    ({"window_size": 8}, r"network_g\.window_size: GRFormer: window_size must be two integers"),
    ({"img_size": 6}, r"network_g\.img_size: GRFormer: img_size 6 must be a multiple of both window sides"),
    ({"upscale": 5}, r"network_g\.upscale: "),
])
def test_grformer_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern) as err:
        build_network({**TINY["GRFormer"], **opt})
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- ONNX

@pytest.mark.parametrize("arch", list(TINY))
def test_onnx_export_runs_at_sizes_it_never_saw(arch: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    opt = {**TINY[arch], "depths": [1]} if arch == "HMA" else TINY[arch]
    net = build_network(opt).eval()
    with torch.no_grad():  # the group's learned scale away from its small init, so the grid block counts
        for name, p in net.named_parameters():
            if name.endswith("residual_group.scale"):
                p.normal_(0, 0.5)
    check_onnx_at_unseen_size(net, opt, SCALES[arch], tmp_path, size=(13, 18))


# ----------------------------------------------------------------------------- XLA:CPU

XLA_SHAPES = {"HMA": (1, 3, 8, 8), "GRFormer": (1, 3, 8, 8)}


@pytest.mark.xla
@pytest.mark.parametrize("arch", list(TINY))
def test_xla_train_step_compiles_once_without_cpu_fallback(arch: str) -> None:
    check_xla_train_step({**TINY[arch], "depths": [1] if arch == "HMA" else [2]}, XLA_SHAPES[arch],
                         scale=SCALES[arch])

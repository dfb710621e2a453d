"""traiNNer-redux's DWT (dilated window transformer) and EMT (efficient mixed transformer).

Fixtures come from traiNNer-redux's own source (``tools/fixtures/make_dwtemt_fixtures.py``): the state dicts load
strictly and give its outputs (eval mode; DWT at its training patch, where the reference uses its stored masks, at
sizes padded to twice the window and at other sizes; EMT with window padding and in training mode). Also: the
dilated partition's geometry, the masks, build errors, published sizes, ONNX through anysr's exporter, and per
architecture an XLA:CPU train step that compiles once with no aten op left to the CPU (``-m xla``).
The checks every architecture gets (channels_last, bf16 autocast, the meta device, gradients, training runs,
2 gloo ranks == 1 process) run from ``tests/archs/test_standard.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from arch_checks import check_onnx_at_unseen_size, check_xla_train_step
from conftest import FIXTURE_TOL, ROOT
from safetensors.torch import load_file

from anysr.archs import build_network
from anysr.archs.arch_util import shifted_window_mask, window_partition
from anysr.archs.dwt_arch import dilated_window_partition, dilated_window_reverse, dwt_mask
from anysr.errors import OptionError

FIXTURES = ROOT / "tests" / "fixtures" / "dwtemt"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())["cases"]

TINY = {"DWT": {"type": "DWT", "img_size": 8, "embed_dim": 8, "depths": [2, 2], "num_heads": [2, 2],
                "window_size": 2, "layer_kinds": [[0, -1], [0, 2]], "upscale": 2, "drop_path_rate": 0.0},
        "EMT": {"type": "EMT", "dim": 10, "n_blocks": 1, "n_layers": 3, "num_heads": 1, "mlp_ratio": 1, "scale": 2,
                "window_list": [[4, 2], [2, 4]], "shift_list": [[2, 1], [1, 2]]}}


def _case(name: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The fixture network (eval mode, weights loaded strictly) and its inputs / outputs."""
    case = MANIFEST[name]
    net = build_network({"type": case["type"], **case["kwargs"]}).eval()
    net.load_state_dict(load_file(str(FIXTURES / f"{name}_params.safetensors")), strict=True)
    return net, load_file(str(FIXTURES / f"{name}_io.safetensors"))


# ----------------------------------------------------------------------------- traiNNer-redux parity

@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_reference_weights_load_strictly_and_match(name: str) -> None:
    case = MANIFEST[name]
    params = load_file(str(FIXTURES / f"{name}_params.safetensors"))
    net = build_network({"type": case["type"], **case["kwargs"]})
    assert set(net.state_dict()) == set(params), "state-dict keys differ from traiNNer-redux's"
    assert {k: v.shape for k, v in net.state_dict().items()} == {k: v.shape for k, v in params.items()}
    # the buffers are rebuilt from the arguments: they must be what traiNNer-redux stores
    buffers = [k for k in params if k.endswith(("attn_mask", "relative_position_index"))]
    assert bool(buffers) == (case["type"] == "DWT")
    assert all(torch.equal(net.state_dict()[k], params[k].to(net.state_dict()[k].dtype)) for k in buffers)
    net.load_state_dict(params, strict=True)
    io = load_file(str(FIXTURES / f"{name}_io.safetensors"))
    for inp, out, mode in case["compare"]:
        net.train(mode == "train")
        with torch.no_grad():
            got = net(io[inp])
        assert got.shape == io[out].shape
        # EMT shifts its [0, 1] input by 255 x the mean: outputs in the hundreds, rounding in proportion
        tol = FIXTURE_TOL if case["type"] == "DWT" else {
            "rtol": FIXTURE_TOL["rtol"], "atol": FIXTURE_TOL["atol"] * max(1.0, float(io[out].abs().max()))}
        torch.testing.assert_close(got, io[out], **tol, msg=f"{name} {out} ({mode}) differs")


@pytest.mark.parametrize(("name", "inp", "why"), [
    ("dwt_x2", "input1", "13x10: reflect-padded to twice the window (16x16: the stored masks' size), cropped"),
    ("dwt_x2", "input2", "8x24: masks computed for the size (shifted, dilated by 2 and by 1)"),
    ("dwt_x1_3conv_ape", "input1", "7x5: padded to the 8-pixel patch of the position embedding"),
    ("dwt_x1_window2", "input0", "6x7: padded to 8x8"),
    ("dwt_x1_gray_smallimg", "input0", "9x12: the window shrank to the 4-pixel patch; padded to 16x16"),
    ("emt_x4", "input1", "7x5: each window part padded to its window and cropped back"),
    ("emt_x3", "input0", "20x18: padded past half a 32-pixel window"),
])
def test_padded_inputs_match_reference(name: str, inp: str, why: str) -> None:
    net, io = _case(name)
    x = io[inp]
    with torch.no_grad():
        got = net(x)
    tol = FIXTURE_TOL if name.startswith("dwt") else {"rtol": 1e-5, "atol": 1e-5 * float(io[inp.replace(
        "input", "output")].abs().max())}
    torch.testing.assert_close(got, io[inp.replace("input", "output")], **tol, msg=why)


def test_tile_multiples() -> None:
    assert build_network(TINY["DWT"]).tile_multiple == 4  # twice the window
    assert build_network({**TINY["DWT"], "layer_kinds": [[0, 4], [0, -1]], "img_size": 16}).tile_multiple == 8
    assert build_network({**TINY["DWT"], "layer_kinds": [[0, 3], [0, -1]], "img_size": 12}).tile_multiple == 12
    with torch.device("meta"):
        assert build_network({"type": "dwt"}).tile_multiple == 32
        assert build_network({"type": "dwt_s"}).tile_multiple == 16
    assert build_network(TINY["EMT"]).tile_multiple == 4
    with torch.device("meta"):
        assert build_network({"type": "emt"}).tile_multiple == 32


def test_batch_entries_are_independent() -> None:
    net, io = _case("dwt_x2")
    x = io["input2"]
    with torch.no_grad():
        both = net(x)
        torch.testing.assert_close(both[1:], net(x[1:]), rtol=1e-5, atol=1e-5)
    net, io = _case("emt_x4")
    x = io["input1"]
    with torch.no_grad():
        both = net(x)
        torch.testing.assert_close(both[:1], net(x[:1]), rtol=1e-5, atol=1e-3)


# ----------------------------------------------------------------------------- pieces

@pytest.mark.parametrize("g", [1, 2, 3])
def test_dilated_windows_gather_every_dth_pixel_of_a_block(g: int) -> None:
    ws, d = 2, 3
    h = w = g * ws * d
    x = torch.arange(h * w, dtype=torch.float32).view(1, h, w, 1)
    win = dilated_window_partition(x, ws, g)
    assert win.shape == (g * g * d * d, ws, ws, 1)
    # window (block row 0, block column g-1, offsets 1, 2): pixels (1 + i*d, (g-1)*ws*d + 2 + j*d)
    k = (g - 1) * d * d + 1 * d + 2
    want = torch.tensor([[(1 + i * d) * w + (g - 1) * ws * d + 2 + j * d for j in range(ws)] for i in range(ws)])
    assert torch.equal(win[k, :, :, 0], want.float())
    assert torch.equal(dilated_window_reverse(win, ws, h, w, g), x)
    assert not torch.equal(win, window_partition(x, ws))


def test_masks() -> None:
    assert dwt_mask(16, 16, 4, 2, 0) is None and dwt_mask(16, 16, 4, 0, -1) is None
    assert dwt_mask(16, 16, 4, 0, 2) is None
    plain = shifted_window_mask(16, 24, 4, 2)
    assert torch.equal(dwt_mask(16, 24, 4, 2, -1), plain) and torch.equal(dwt_mask(16, 24, 4, 2, 1), plain)
    # a dilated block's mask: the plain windows of each of the 2 x 2 blocks, block by block (the reference's)
    by_block = dwt_mask(16, 24, 4, 2, 2)
    grid = plain.view(4, 6, 16, 16)
    assert torch.equal(by_block[:6], grid[:2, :3].reshape(6, 16, 16))
    assert torch.equal(by_block[6:12], grid[:2, 3:].reshape(6, 16, 16))
    assert torch.equal(by_block[12:18], grid[2:, :3].reshape(6, 16, 16))


def test_emt_frozen_parameters_stay_frozen_and_are_used_as_loaded() -> None:
    net = build_network(TINY["EMT"])
    frozen = {n for n, p in net.named_parameters() if not p.requires_grad}
    assert frozen == {n for n, _ in net.named_parameters() if n.endswith("mask") or "_mean." in n}
    assert "body.0.sa_list.2.token_mixer.mask" in frozen and "body.0.mlp_list.0.fc1.mask" in frozen
    x = torch.rand(1, 3, 6, 6)
    with torch.no_grad():
        before = net.eval()(x)
        net.body[0].mlp_list[0].fc1.mask.mul_(0.5)
        assert not torch.allclose(net(x), before)


def test_emt_pixel_mixer_wraps_around() -> None:
    net = build_network(TINY["EMT"])
    mixer = net.body[0].sa_list[2].token_mixer
    x = torch.randn(1, 10, 5, 6)
    with torch.no_grad():
        y = mixer(x)
    torch.testing.assert_close(y[:, 0], torch.roll(x[:, 0], -1, dims=-1))  # from the right
    torch.testing.assert_close(y[:, 1], torch.roll(x[:, 1], 1, dims=-1))  # from the left
    torch.testing.assert_close(y[:, 2], torch.roll(x[:, 2], -1, dims=-2))  # from below
    torch.testing.assert_close(y[:, 3], torch.roll(x[:, 3], 1, dims=-2))  # from above
    torch.testing.assert_close(y[:, 4], x[:, 4])


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"upsampler": "pixelshuffledirect"}, r"network_g\.upsampler: DWT: upsampler must be 'pixelshuffle'"),
    ({"resi_connection": "identity"}, r"network_g\.resi_connection: DWT: unknown resi_connection"),
    ({"upscale": 5}, r"network_g\.upscale: scale 5 is not supported"),
    ({"num_heads": [2]}, r"network_g\.num_heads: DWT: num_heads has 1 entries but depths has 2"),
    ({"num_heads": [3, 2]}, r"network_g\.num_heads: DWT: embed_dim 8 is not divisible by 3 heads"),
    ({"layer_kinds": [[0, -1]]}, r"network_g\.layer_kinds: DWT: layer_kinds needs one list per group"),
    ({"layer_kinds": [[0, -1], [0, -2]]}, r"network_g\.layer_kinds: DWT: a layer kind is 0 \(plain\)"),
    ({"window_size": 0}, r"network_g\.window_size: DWT: window_size must be a positive integer"),
])
def test_dwt_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        build_network({**TINY["DWT"], **opt})


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"upsampler": "nearest+conv"}, r"network_g\.upsampler: EMT: unknown upsampler"),
    ({"scale": 5}, r"network_g\.scale: scale 5 is not supported"),
    ({"scale": 0, "upsampler": "pixelshuffledirect"}, r"network_g\.scale: EMT needs an integer scale >= 1"),
    ({"num_in_ch": 1}, r"network_g\.num_in_ch: EMT's mean shift is for RGB"),
    ({"dim": 12}, r"network_g\.dim: EMT's shifts split dim into five groups"),
    ({"mlp_ratio": 1.2}, r"network_g\.mlp_ratio: EMT: dim \* mlp_ratio \(12\.0\) must be a whole multiple of 5"),
    ({"num_heads": 2}, r"network_g\.num_heads: EMT: dim \(10\) must split into 2 window parts"),
    ({"shift_list": [[2, 1]]}, r"network_g\.shift_list: EMT needs one \[rows, columns\] window"),
    ({"window_list": [4, 2]}, r"network_g\.window_list: EMT: window_list and shift_list are lists"),
])
def test_emt_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        build_network({**TINY["EMT"], **opt})


def test_published_sizes() -> None:
    """Parameter counts of the published configurations (x4; traiNNer-redux's builders, counted here)."""
    def count(opt: dict) -> int:
        with torch.device("meta"):
            return sum(p.numel() for p in build_network(opt).parameters())

    assert count({"type": "dwt"}) == 12_059_175
    assert count({"type": "dwt_s"}) == 11_900_199
    assert count({"type": "emt"}) == 996_687  # 925,383 trained: the rest are frozen shift masks and mean shifts


# ----------------------------------------------------------------------------- ONNX

@pytest.mark.parametrize("arch", sorted(TINY))
def test_onnx_export_runs_at_sizes_it_never_saw(arch: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = build_network(TINY[arch])
    check_onnx_at_unseen_size(net, TINY[arch], 2, tmp_path, size=(23, 30))  # not a window multiple


# ----------------------------------------------------------------------------- XLA:CPU

@pytest.mark.xla
@pytest.mark.parametrize("arch", sorted(TINY))
def test_xla_train_step_compiles_once_without_cpu_fallback(arch: str) -> None:
    # window padding inside, batch of two. EMT's batch norms: torch_xla compiles a plain nn.BatchNorm2d twice
    # (num_batches_tracked starts as a constant, then is step output), then never again: 3 steps, nothing new after
    # the second.
    check_xla_train_step(TINY[arch], (2, 3, 10, 9), scale=2, steps=3 if arch == "EMT" else 2)

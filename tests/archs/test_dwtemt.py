"""traiNNer-redux's DWT (dilated window transformer) and EMT (efficient mixed transformer).

Fixtures come from traiNNer-redux's own source (``tools/fixtures/make_dwtemt_fixtures.py``): the state dicts load
strictly and give its outputs (eval mode; DWT at its training patch, where the reference uses its stored masks, at
sizes padded to twice the window and at other sizes; EMT with window padding and in training mode). Also: the
dilated partition's geometry, the masks, build errors, published sizes, ONNX through anysr's exporter, and per
architecture an XLA:CPU train step that compiles once with no aten op left to the CPU (``-m xla``). Where they are
tested: reference parity over the fixture manifest, bad arguments, ONNX at unseen sizes, the XLA:CPU step and the
checks every architecture gets run from ``tests/archs/test_standard.py`` over the family's cards
(``tests/archs/cards.py``); this module keeps what is particular to the family.
"""

from __future__ import annotations

import pytest
import torch
from arch_checks import fixture_io, load_case, manifest, stored_params
from cards import CARDS
from conftest import FIXTURE_TOL

from anysr.archs import build_network
from anysr.archs.arch_util import shifted_window_mask, window_partition
from anysr.archs.dwt_arch import dilated_window_partition, dilated_window_reverse, dwt_mask

GROUP = "dwtemt"
MANIFEST = manifest(GROUP)["cases"]

TINY = {a: CARDS[a].small for a in ("DWT", "EMT")}  # the ONNX / XLA networks (tests/archs/cards.py)


def _reference_state(name: str) -> dict[str, torch.Tensor]:
    """The reference's state dict: the seeded weights and the entries it built (stored as ``state.<key>``)."""
    io = fixture_io("dwtemt", name)
    return {**stored_params("dwtemt", name), **{k[6:]: v for k, v in io.items() if k.startswith("state.")}}


# ----------------------------------------------------------------------------- traiNNer-redux parity

@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_built_buffers_are_the_references(name: str) -> None:
    """The buffers are rebuilt from the arguments: a fresh network holds what traiNNer-redux stores
    (reference parity itself: tests/archs/test_standard.py)."""
    case = MANIFEST[name]
    own = build_network({"type": case["type"], **case["kwargs"]}).state_dict()
    params = _reference_state(name)
    built = [k for k in own if k.endswith(("attn_mask", "relative_position_index"))]
    assert bool(built) == (case["type"] in ("DWT",))
    stored = [k for k in built if k in params]  # seeded fixtures hold them as ``state.<key>`` in the io file
    assert stored == built
    assert all(torch.equal(own[k], params[k].to(own[k].dtype)) for k in stored)


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
    net, io = load_case(GROUP, name)
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
    net, io = load_case(GROUP, "dwt_x2")
    x = io["input2"]
    with torch.no_grad():
        both = net(x)
        torch.testing.assert_close(both[1:], net(x[1:]), rtol=1e-5, atol=1e-5)
    net, io = load_case(GROUP, "emt_x4")
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


def test_published_sizes() -> None:
    """Parameter counts of the published configurations (x4; traiNNer-redux's builders, counted here)."""
    def count(opt: dict) -> int:
        with torch.device("meta"):
            return sum(p.numel() for p in build_network(opt).parameters())

    assert count({"type": "dwt"}) == 12_059_175
    assert count({"type": "dwt_s"}) == 11_900_199
    assert count({"type": "emt"}) == 996_687  # 925,383 trained: the rest are frozen shift masks and mean shifts


# ----------------------------------------------------------------------------- ONNX

# ----------------------------------------------------------------------------- XLA:CPU


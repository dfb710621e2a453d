"""traiNNer-redux's ESCRealM (ESC-Real, choice of heads), LKFMixer, Sebica, EIMN, MoSRv2; its MoESR2 = anysr's MoESR.

Fixtures come from traiNNer-redux's own source (``tools/fixtures/make_escmix_fixtures.py``): eval mode, sizes that
need the window / unshuffle / multiple-of-8 padding, batches in the training-mode path, batch-norm batch statistics.
Here: what is particular to the family (the head record, tile multiples, published sizes, the bilinear resize,
Sebica's channel weight, EIMN's frozen trunk, LKFMixer's bf16 kernel). Where they are tested: reference parity over
the fixture manifest, bad arguments, ONNX at unseen sizes, the XLA:CPU step and the checks every architecture gets
run from ``tests/archs/test_standard.py`` over the family's cards (``tests/archs/cards.py``); this module keeps what
is particular to the family.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from arch_checks import fixture_io, load_case, manifest, stored_params
from cards import CARDS
from torch.nn import functional as F

from anysr.archs import build_network
from anysr.archs.escreal_arch import WindowAttention, dihedral_mean
from anysr.archs.lkfmixer_arch import bilinear_resize
from anysr.archs.moesr_arch import MoESR
from anysr.errors import OptionError

GROUP = "escmix"
MANIFEST = manifest(GROUP)["cases"]
ONE = "escrealm_x4"
ONE_PER_ARCH = [ONE, "lkfmixer_x4", "sebica_x4", "eimn_x2", "mosrv2_x4_ln"]



# ----------------------------------------------------------------------------- traiNNer-redux parity

def test_moesr2_is_moesr() -> None:
    from anysr.archs import ARCH_REGISTRY

    assert ARCH_REGISTRY.get("MoESR2") is MoESR and ARCH_REGISTRY.get("moesr2") is MoESR
    assert {MANIFEST[n]["type"] for n in MANIFEST if n.startswith("moesr2")} == {"MoESR2"}


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_built_buffers_are_the_references(name: str) -> None:
    """The head record is rebuilt from the arguments: a fresh network holds what traiNNer-redux stores
    (reference parity itself: tests/archs/test_standard.py)."""
    case = MANIFEST[name]
    own = build_network({"type": case["type"], **case["kwargs"]}).state_dict()
    io = fixture_io(GROUP, name)  # the entries the reference computed (not seeded) are stored as state.<key>
    params = {**stored_params(GROUP, name), **{k[6:]: v for k, v in io.items() if k.startswith("state.")}}
    built = [k for k in own if k.endswith(("MetaUpsample",))]
    assert bool(built) == (case["type"] in ("ESCRealM", "MoESR2", "MoSRv2"))
    stored = [k for k in built if k in params]
    assert stored == built
    assert all(torch.equal(own[k], params[k].to(own[k].dtype)) for k in stored)


def test_tiny_inputs_run() -> None:
    """Below traiNNer-redux's limits (its reflect pads need more pixels than the pad): grown, then cropped."""
    net, _ = load_case(GROUP, "escrealm_x2_unshuffle_ps")
    with torch.no_grad():
        assert net(torch.rand(1, 3, 1, 3)).shape == (1, 3, 2, 6)
        assert net(torch.rand(1, 3, 5, 2)).shape == (1, 3, 10, 4)


def test_tile_multiples() -> None:
    esc = CARDS["ESCRealM"].net
    assert build_network(esc).tile_multiple == 4
    assert build_network({**esc, "unshuffle_mod": True}).tile_multiple == 8  # unshuffle 2 x window 4
    assert build_network({**esc, "unshuffle_mod": True, "scale": 4}).tile_multiple == 4  # no unshuffle
    assert build_network(CARDS["LKFMixer"].net).tile_multiple == 8
    assert build_network(CARDS["Sebica"].net).tile_multiple == 1
    assert build_network(CARDS["EIMN"].net).tile_multiple == 1
    assert build_network(CARDS["MoSRv2"].net).tile_multiple == 2
    assert build_network({**CARDS["MoSRv2"].net, "unshuffle_mod": False}).tile_multiple == 1


@pytest.mark.parametrize("name", ONE_PER_ARCH)
def test_batch_entries_are_independent(name: str) -> None:
    """ESCRealM predicts kernels per image, the others pool per image: image i must only see its own."""
    net, io = load_case(GROUP, name)
    x = next(v for k, v in sorted(io.items()) if k.startswith("input") and v.shape[0] == 2)  # two images
    with torch.no_grad():
        both = net(x)
        torch.testing.assert_close(both[1:], net(x[1:]), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(both[:1], net(x[:1]), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- pieces

def test_dihedral_mean_is_invariant_under_flips_and_rotations() -> None:
    k = torch.randn(2, 3, 5, 5)
    m = dihedral_mean(k)
    for t in (m.flip(-1), m.flip(-2), m.transpose(-1, -2), torch.rot90(m, 1, (-2, -1))):
        torch.testing.assert_close(t, m)
    assert not torch.allclose(m, k)
    sym = dihedral_mean(m)
    torch.testing.assert_close(sym, m)


def test_window_attention_bias_is_relative() -> None:
    """A bias table that is non-zero only at offset (0, +1) adds its value exactly to the right neighbour."""
    attn = WindowAttention(4, 3, 1)
    idx = attn.rpe_index
    ws = 3
    # query (1, 1) -> key (1, 2): dh = 0, dw = +1
    assert idx[1 * ws + 1, 1 * ws + 2] == (0 + ws - 1) * (2 * ws - 1) + (1 + ws - 1)
    assert idx.diagonal().unique().tolist() == [(ws - 1) * (2 * ws - 1) + ws - 1]


def test_published_sizes() -> None:
    """Parameter counts of published configurations (x4; traiNNer-redux's defaults / builders, counted here)."""
    def count(opt: dict) -> int:
        with torch.device("meta"):
            return sum(p.numel() for p in build_network(opt).parameters())

    assert count({"type": "ESCRealM"}) == 2_221_551
    assert count({"type": "escrealm_xl"}) == 13_029_763
    assert count({"type": "lkfmixer_t"}) == 207_008
    assert count({"type": "lkfmixer_b"}) == 372_816
    assert count({"type": "lkfmixer_l"}) == 927_152
    assert count({"type": "Sebica"}) == 40_896
    assert count({"type": "sebica_mini"}) == 11_568
    assert count({"type": "eimn_l"}) == 981_724  # x2, as the builders default
    assert count({"type": "eimn_a"}) == 860_098
    assert count({"type": "MoSRv2"}) == 4_179_888  # traiNNer-redux's defaults (x4, 24 blocks)


# ----------------------------------------------------------------------------- ONNX

# ----------------------------------------------------------------------------- real training runs (CLI)


# ----------------------------------------------------------------------------- XLA:CPU

@pytest.mark.parametrize(("size", "out"), [((1, 2), (8, 16)), ((3, 5), (24, 40)), ((4, 4), (7, 13)), ((5, 3), (2, 3))])
def test_bilinear_resize_is_interpolate(size: tuple[int, int], out: tuple[int, int]) -> None:
    x = torch.randn(2, 3, *size)
    ref = F.interpolate(x, size=out, mode="bilinear", align_corners=False)
    torch.testing.assert_close(bilinear_resize(x, *out), ref, rtol=1e-5, atol=1e-6)


def test_sebica_channel_weight_is_one_number_per_image() -> None:
    """The reference pools its (B, 1, C) channel means over the channels: a weight shared by all channels."""
    net, _ = load_case(GROUP, "sebica_x2")
    csa = net.body[0].attn
    x = torch.randn(2, 4, 5, 6)
    with torch.no_grad():
        out = csa(x)
        spatial = csa.spatial_attention(torch.cat((x.mean(1, keepdim=True), x.amax(1, keepdim=True)), 1))
        ratio = out / (x * spatial)
    assert torch.allclose(ratio, ratio[:, :1, :1, :1].expand_as(ratio), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(ratio[0, 0, 0, 0], ratio[1, 0, 0, 0])


def test_eimn_freeze_param_trains_the_tail_only() -> None:
    net = build_network({**CARDS["EIMN"].net, "freeze_param": True})
    trained = {n for n, p in net.named_parameters() if p.requires_grad}
    assert trained == {"tail.0.weight", "tail.0.bias"}
    with pytest.raises(OptionError, match=r"network_g\.embed_dims: EIMN needs embed_dims to be a multiple of 8"):
        build_network({**CARDS["EIMN"].net, "embed_dims": 12})


def test_mosrv2_is_not_mosr() -> None:
    """traiNNer-redux's MoSRv2 is a network of its own: anysr's MoSR (spandrel's MoSR) has other keys."""
    v2 = set(build_network(CARDS["MoSRv2"].net).state_dict())
    v1 = set(build_network({"type": "MoSR", "dim": 8, "n_block": 1, "upscale": 2}).state_dict())
    assert "to_img.MetaUpsample" in v2 and not v1 & v2


def test_lkfmixer_bf16_channels_last_step_ends() -> None:
    """oneDNN generated its kernel for LKFMixer's 1x31 depth-wise conv on bf16 channels_last input for minutes (on
    AVX-512 CPUs, torch 2.13): training LKFMixer-B at precision auto did not get past its first step. A step under
    bf16 autocast in channels_last now ends within seconds (a minute's limit here)."""
    code = ("import torch\n"
            "from anysr.archs import build_network\n"
            "net = build_network({'type': 'lkfmixer_b', 'scale': 4}).to(memory_format=torch.channels_last)\n"
            "x = torch.rand(1, 3, 32, 32).to(memory_format=torch.channels_last)\n"
            "with torch.autocast('cpu', dtype=torch.bfloat16):\n"
            "    y = net(x)\n"
            "y.float().mean().backward()\n"
            "assert y.shape == (1, 3, 128, 128) and torch.isfinite(y.float()).all()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]

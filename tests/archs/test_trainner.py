"""traiNNer-redux's architectures SpanPlus, RTMoSR, ArtCNN, DIS, LMLT and MAN.

Fixtures come from traiNNer-redux's own source (``tools/fixtures/make_trainner_archs_fixtures.py``): the state dicts
load strictly and give its outputs (eval mode, sizes that need the networks' internal padding, and the training-mode
branches of the re-parameterised SpanPlus / RTMoSR). Also: the deployment fold, ONNX through anysr's exporter, and
per architecture an XLA:CPU train step that compiles once with no aten op left to the CPU (``-m xla``). Where they
are tested: reference parity over the fixture manifest, bad arguments, ONNX at unseen sizes, the XLA:CPU step and
the checks every architecture gets run from ``tests/archs/test_standard.py`` over the family's cards
(``tests/archs/cards.py``); this module keeps what is particular to the family.
"""

from __future__ import annotations

import pytest
import torch
from arch_checks import FIXTURES, load_case, manifest
from cards import CARDS
from torch.nn import functional as F

from anysr.archs import build_network
from anysr.archs.plksr_arch import DySample
from anysr.archs.rtmosr_arch import OmniShift, RepConv
from anysr.archs.span_arch import Conv3XC
from anysr.archs.spanplus_arch import GatherDySample

GROUP = "trainner_archs"
MANIFEST = manifest(GROUP)["cases"]
ARCHS = ["SpanPlus", "RTMoSR", "ArtCNN", "DIS", "LMLT", "MAN"]

# The tiny x2 networks of each arch (tests/archs/cards.py)
TINY = {a: CARDS[a].net for a in ARCHS}


# ----------------------------------------------------------------------------- traiNNer-redux parity

def test_fixtures_cover_every_arch() -> None:
    assert {c["type"] for c in MANIFEST.values()} == set(ARCHS)
    assert sum(p.stat().st_size for p in (FIXTURES / GROUP).iterdir()) < 2_000_000


def test_tile_multiples() -> None:
    assert build_network(TINY["SpanPlus"]).tile_multiple == 1
    assert build_network({"type": "RTMoSR", "dim": 4, "n_blocks": 1}).tile_multiple == 2
    assert build_network(TINY["RTMoSR"]).tile_multiple == 4
    assert build_network({**TINY["RTMoSR"], "scale": 1}).tile_multiple == 8
    assert build_network({**TINY["RTMoSR"], "scale": 4}).tile_multiple == 2  # no unshuffle at x4
    assert build_network(TINY["LMLT"]).tile_multiple == 64
    assert all(build_network(TINY[a]).tile_multiple == 1 for a in ("ArtCNN", "DIS", "MAN"))


# ----------------------------------------------------------------------------- re-parameterised SpanPlus / RTMoSR

@pytest.mark.parametrize("name", ["spanplus_x4_dys", "rtmosr_x2", "rtmosr_x1_unshuffle_nodccm"])
def test_eval_refolds_from_the_branches_and_reparameterize_freezes_it(name: str) -> None:
    net, io = load_case(GROUP, name)
    stale = {k: v.clone() for k, v in net.state_dict().items()}
    with torch.no_grad():
        evaluated = net(io["input0"])
    folded = net.state_dict()
    changed = {k for k in folded if not torch.equal(folded[k], stale[k])}
    # only the derived convs were rewritten (the stored ones in the fixture are stale, as in checkpoints)
    assert changed and all(any(t in k for t in ("eval_conv", "conv_3x3_rep", "conv5x5_reparam")) for k in changed)
    net.reparameterize()
    with torch.no_grad():
        for module in net.modules():  # a change of the folded branches no longer reaches the network
            if isinstance(module, (Conv3XC, RepConv, OmniShift)):
                for p in module.parameters():
                    if p.requires_grad:
                        p.add_(0.5)
        frozen = net(io["input0"])
        assert not torch.equal(net.train()(io["input0"]), frozen)
    torch.testing.assert_close(frozen, evaluated, rtol=0, atol=0)


@pytest.mark.parametrize("arch", ["SpanPlus", "RTMoSR"])
def test_derived_convs_are_never_trained(arch: str) -> None:
    net = build_network(TINY[arch]).train()
    frozen = {n for n, p in net.named_parameters() if not p.requires_grad}
    derived = {n for n in net.state_dict() if any(t in n for t in ("eval_conv", "conv_3x3_rep", "conv5x5_reparam"))}
    assert frozen and frozen == derived
    net(torch.rand(1, 3, 8, 8)).mean().backward()
    assert all(p.grad is not None for n, p in net.named_parameters() if n not in frozen)


@pytest.mark.parametrize(("scale", "groups"), [(2, 4), (3, 4), (4, 4), (1, 4)])
def test_gather_dysample_equals_grid_sample_dysample(scale: int, groups: int) -> None:
    torch.manual_seed(scale)
    ref = DySample(8, 3, scale, groups=groups).eval()
    with torch.no_grad():
        ref.scope.weight.normal_(0, 0.5)  # offsets reach outside the image too (border clamping)
        ref.offset.weight.normal_(0, 2.0)
    mine = GatherDySample(8, 3, scale, groups=groups).eval()
    mine.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(2, 8, 5, 7)
    with torch.no_grad():
        torch.testing.assert_close(mine(x), ref(x), rtol=1e-5, atol=1e-5)


def test_rtmosr_training_and_eval_forms_agree() -> None:
    net, io = load_case(GROUP, "rtmosr_x3_nose")
    with torch.no_grad():
        torch.testing.assert_close(net.train()(io["input1"]), net.eval()(io["input1"]), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- other behaviour

def test_lmlt_any_small_size_runs() -> None:
    """Below the 33 pixels that reflect padding to 64 allows, the pad continues with edge replication."""
    net = build_network(TINY["LMLT"]).eval()
    with torch.no_grad():
        assert net(torch.rand(1, 3, 5, 9)).shape == (1, 3, 10, 18)


def test_dis_adds_the_bilinear_upscale() -> None:
    net = build_network({"type": "DIS", "num_features": 4, "num_blocks": 1, "scale": 3}).eval()
    with torch.no_grad():
        net.tail.weight.zero_()
        net.tail.bias.zero_()
        x = torch.rand(1, 3, 5, 6)
        torch.testing.assert_close(net(x), F.interpolate(x, scale_factor=3, mode="bilinear", align_corners=False))


def test_man_mean_shift_is_frozen_and_stored() -> None:
    net = build_network(TINY["MAN"])
    assert {"sub_mean.weight", "sub_mean.bias", "add_mean.weight", "add_mean.bias"} <= set(net.state_dict())
    assert not any(p.requires_grad for n, p in net.named_parameters() if "_mean." in n)
    assert torch.allclose(net.sub_mean.bias, -torch.tensor([0.4488, 0.4371, 0.4040]))


def test_artcnn_activation_by_name() -> None:
    net = build_network({"type": "ArtCNN", "filters": 4, "n_block": 1, "scale": 2, "act": "gelu"})
    assert isinstance(net.res_block[0].conv[0][1], torch.nn.GELU)


def test_published_sizes() -> None:
    """Parameter counts of published configurations (x4; traiNNer-redux's builders, counted with these classes)."""
    def count(opt: dict) -> int:
        with torch.device("meta"):
            return sum(p.numel() for p in build_network(opt).parameters())

    assert count({"type": "lmlt_tiny", "scale": 4}) == 251_040
    assert count({"type": "man_light", "scale": 4}) == 842_892
    assert count({"type": "dis_balanced"}) == 306_659
    assert count({"type": "artcnn_r8f64"}) == 952_688
    assert count({"type": "spanplus_s"}) == 687_707
    assert count({"type": "rtmosr_l"}) == 2_981_424  # builder default scale 2, stored folded convs included


# ----------------------------------------------------------------------------- ONNX

# ----------------------------------------------------------------------------- real training runs (CLI)


# ----------------------------------------------------------------------------- XLA:CPU




"""traiNNer-redux's architectures SpanPlus, RTMoSR, ArtCNN, DIS, LMLT and MAN.

Fixtures come from traiNNer-redux's own source (``tools/fixtures/make_trainner_arch_fixtures.py``): the state dicts
load strictly and give its outputs (eval mode, sizes that need the networks' internal padding, and the training-mode
branches of the re-parameterised SpanPlus / RTMoSR). Also: the deployment fold, ONNX through anysr's exporter, and
per architecture an XLA:CPU train step that compiles once with no aten op left to the CPU (``-m xla``). The checks
every architecture gets (channels_last, bf16 autocast, the meta device, gradients, training runs, 2 gloo ranks == 1
process) run from ``tests/archs/test_standard.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from arch_checks import check_onnx_at_unseen_size, check_xla_train_step
from conftest import FIXTURE_TOL, ROOT
from safetensors.torch import load_file
from torch.nn import functional as F

from anysr.archs import build_network
from anysr.archs.plksr_arch import DySample
from anysr.archs.rtmosr_arch import OmniShift, RepConv
from anysr.archs.span_arch import Conv3XC
from anysr.archs.spanplus_arch import GatherDySample
from anysr.errors import OptionError

FIXTURES = ROOT / "tests" / "fixtures" / "trainner_archs"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())["cases"]
ARCHS = ["SpanPlus", "RTMoSR", "ArtCNN", "DIS", "LMLT", "MAN"]

# Tiny x2 networks of each arch (training runs, ONNX, XLA)
TINY = {
    "SpanPlus": {"type": "SpanPlus", "feature_channels": 8, "blocks": [1], "upscale": 2},
    "RTMoSR": {"type": "RTMoSR", "dim": 4, "n_blocks": 1, "scale": 2, "unshuffle_mod": True},
    "ArtCNN": {"type": "ArtCNN", "filters": 8, "n_block": 1, "scale": 2},
    "DIS": {"type": "DIS", "num_features": 8, "num_blocks": 1, "scale": 2},
    "LMLT": {"type": "LMLT", "dim": 8, "n_blocks": 1, "scale": 2},
    "MAN": {"type": "MAN", "n_feats": 6, "n_resblocks": 1, "scale": 2},
}


def _case(name: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The fixture network (eval mode, weights loaded strictly) and its inputs / outputs."""
    case = MANIFEST[name]
    net = build_network({"type": case["type"], **case["kwargs"]}).eval()
    net.load_state_dict(load_file(str(FIXTURES / f"{name}_params.safetensors")), strict=True)
    return net, load_file(str(FIXTURES / f"{name}_io.safetensors"))


# ----------------------------------------------------------------------------- traiNNer-redux parity

def test_fixtures_cover_every_arch() -> None:
    assert {c["type"] for c in MANIFEST.values()} == set(ARCHS)
    assert sum(p.stat().st_size for p in FIXTURES.iterdir()) < 2_000_000


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_reference_weights_load_strictly_and_match(name: str) -> None:
    case = MANIFEST[name]
    params = load_file(str(FIXTURES / f"{name}_params.safetensors"))
    net = build_network({"type": case["type"], **case["kwargs"]})
    assert set(net.state_dict()) == set(params), "state-dict keys differ from traiNNer-redux's"
    assert {k: v.shape for k, v in net.state_dict().items()} == {k: v.shape for k, v in params.items()}
    net.load_state_dict(params, strict=True)
    io = load_file(str(FIXTURES / f"{name}_io.safetensors"))
    for inp, out, mode in case["compare"]:
        net.train(mode == "train")
        with torch.no_grad():
            got = net(io[inp])
        assert got.shape == io[out].shape
        torch.testing.assert_close(got, io[out], **FIXTURE_TOL, msg=f"{name} {out} ({mode}) differs")


@pytest.mark.parametrize(("name", "inp", "why"), [
    ("rtmosr_x2", "input1", "7x5: reflect-padded to 8x6 inside forward, cropped"),
    ("rtmosr_x3_nose", "input1", "5x3: reflect-padded to 6x4, cropped"),
    ("rtmosr_x1_unshuffle_nodccm", "input1", "10x7: padded to 16x8 (unshuffle 4 then the x2 mixing), cropped"),
    ("lmlt_x2", "input0", "36x40: reflect-padded to 64x64 (8x8 windows at 1/8 size), cropped"),
    ("lmlt_x1", "input0", "48x70: padded to 64x128, cropped"),
])
def test_padded_inputs_match_reference(name: str, inp: str, why: str) -> None:
    net, io = _case(name)
    x = io[inp]
    assert x.shape[-2] % net.tile_multiple or x.shape[-1] % net.tile_multiple, why
    with torch.no_grad():
        got = net(x)
    want = io[inp.replace("input", "output")]
    assert got.shape[-2:] == want.shape[-2:]
    torch.testing.assert_close(got, want, **FIXTURE_TOL, msg=why)


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
    net, io = _case(name)
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
    net, io = _case("rtmosr_x3_nose")
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


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"type": "SpanPlus", "upsampler": "lp"}, r"network_g\.upsampler: SpanPlus has no upsampler 'lp'"),
    ({"type": "SpanPlus", "upsampler": "conv"}, r"network_g\.upsampler: .*upscale 1 only"),
    ({"type": "SpanPlus", "feature_channels": 6}, r"network_g\.feature_channels: .*multiple of 4"),
    ({"type": "SpanPlus", "blocks": []}, r"network_g\.blocks: SpanPlus needs a non-empty list"),
    ({"type": "SpanPlus", "upscale": 0}, r"network_g\.upscale: SpanPlus needs an integer upscale >= 1"),
    ({"type": "RTMoSR", "scale": 3, "unshuffle_mod": True}, r"network_g\.unshuffle_mod: .*scale 3"),
    ({"type": "RTMoSR", "ffn_expansion": 0.5}, r"network_g\.ffn_expansion: RTMoSR needs ffn_expansion >= 1"),
    ({"type": "ArtCNN", "act": "swish2"}, r"network_g\.act: ArtCNN has no activation 'swish2'"),
    ({"type": "ArtCNN", "scale": 1.5}, r"network_g\.scale: ArtCNN needs an integer scale"),
    ({"type": "DIS", "scale": 8}, r"network_g\.scale: DIS supports scale 1, 2, 3 or 4, got 8"),
    ({"type": "LMLT", "dim": 30}, r"network_g\.dim: LMLT needs dim to be a multiple of 4"),
    ({"type": "LMLT"}, r"network_g\.dim: required argument of LMLT is missing"),
    ({"type": "MAN", "n_feats": 64}, r"network_g\.n_feats: MAN needs n_feats to be a multiple of 3"),
    ({"type": "MAN", "n_colors": 1}, r"network_g\.n_colors: MAN's mean shift is RGB"),
])
def test_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        build_network(opt)


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

@pytest.mark.parametrize("arch", [pytest.param(a, marks=pytest.mark.slow) if a in ("LMLT", "MAN") else a
                                  for a in ARCHS])
def test_onnx_export_runs_at_sizes_it_never_saw(arch: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    # the default 45x70; LMLT: at least 33 pixels, so that the pad to 64 is a reflection (the graph keeps the traced
    # size's choice between reflect and edge padding)
    check_onnx_at_unseen_size(build_network(TINY[arch]), TINY[arch], 2, tmp_path)


# ----------------------------------------------------------------------------- real training runs (CLI)


# ----------------------------------------------------------------------------- XLA:CPU

XLA_SHAPES = {"LMLT": (1, 3, 16, 16)}


@pytest.mark.xla
@pytest.mark.parametrize("arch", ARCHS)
def test_xla_train_step_compiles_once_without_cpu_fallback(arch: str) -> None:
    # and the eval form (folds for SpanPlus / RTMoSR) lowers too
    check_xla_train_step(TINY[arch], XLA_SHAPES.get(arch, (1, 3, 8, 8)), scale=2)

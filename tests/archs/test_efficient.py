"""Efficient SR architectures SPAN, RealPLKSR (+ layer-norm / DySample variants), OmniSR and SAFMN.

Fixtures come from spandrel 0.4.2 (``tools/fixtures/make_efficient_fixtures.py``): the state dicts load strictly and
give spandrel's outputs; padded inputs give spandrel's outputs for the same padding. Also: SPAN's
re-parameterisation, DySample's geometry, build errors, and one XLA:CPU compile-once check per architecture (``-m
xla`` in the XLA venv). Where they are tested: reference parity over the fixture manifest, bad arguments, ONNX at
unseen sizes, the XLA:CPU step and the checks every architecture gets run from ``tests/archs/test_standard.py`` over
the family's cards (``tests/archs/cards.py``); this module keeps what is particular to the family.
"""

from __future__ import annotations

import pytest
import torch
from arch_checks import fixture_io, load_case, manifest, stored_params
from conftest import FIXTURE_TOL
from torch.nn import functional as F

from anysr.archs import build_network
from anysr.archs.arch_util import LayerNorm2d, pad_to_min_size
from anysr.archs.plksr_arch import DySample

GROUP = "efficient"
MANIFEST = manifest(GROUP)["cases"]


# ----------------------------------------------------------------------------- spandrel parity

def test_tile_multiples() -> None:
    assert build_network({"type": "SPAN"}).tile_multiple == 1
    assert build_network({"type": "RealPLKSR", "n_blocks": 1}).tile_multiple == 1
    assert build_network({"type": "OmniSR", "num_feat": 16, "window_size": 6}).tile_multiple == 6
    assert build_network({"type": "SAFMN", "dim": 8, "n_blocks": 1}).tile_multiple == 8


# ----------------------------------------------------------------------------- SPAN

def test_span_folds_its_convs_exactly() -> None:
    net, io = load_case(GROUP, "span_x4_norm")
    conv = net.block_3.c2_r
    stale = conv.eval_conv.weight.clone()
    with torch.no_grad():
        evaluated = net(io["input0"])
        trained = net.train()(io["input0"])
    torch.testing.assert_close(evaluated, trained, rtol=1e-5, atol=2e-5)
    # the eval call wrote the folded weights into eval_conv (what a deploy export saves)
    assert not torch.allclose(stale, conv.eval_conv.weight)
    weight, bias = conv.fused_weight()
    assert torch.equal(conv.eval_conv.weight, weight) and torch.equal(conv.eval_conv.bias, bias)
    x = torch.rand(1, conv.sk.in_channels, 5, 6)
    with torch.no_grad():
        torch.testing.assert_close(F.conv2d(x, weight, bias, padding=1), conv.train()(x), rtol=1e-5, atol=1e-6)


def test_span_eval_conv_is_never_trained() -> None:
    net = build_network({"type": "SPAN", "feature_channels": 4, "upscale": 2}).train()
    frozen = {n for n, p in net.named_parameters() if not p.requires_grad}
    assert frozen and all(".eval_conv." in n for n in frozen)
    assert frozen == {n for n in net.state_dict() if ".eval_conv." in n}
    net(torch.rand(1, 3, 6, 5)).mean().backward()
    assert all(p.grad is None for n, p in net.named_parameters() if n in frozen)


def test_span_with_bf16_weights_folds_in_bf16() -> None:
    net, io = load_case(GROUP, "span_x2_nonorm")
    with torch.no_grad():
        out = net.to(torch.bfloat16)(io["input0"].bfloat16())
    assert out.dtype == torch.bfloat16 and net.conv_2.eval_conv.weight.dtype == torch.bfloat16
    assert (out.float() - io["output0"]).abs().max().item() < 0.05 * io["output0"].abs().max().item()


def test_span_norm_buffer_decides_normalisation() -> None:
    normed = build_network({"type": "SPAN", "feature_channels": 4})
    plain = build_network({"type": "SPAN", "feature_channels": 4, "norm": False})
    assert normed.is_norm and "no_norm" not in normed.state_dict() and "mean" not in normed.state_dict()
    assert not plain.is_norm and torch.equal(plain.state_dict()["no_norm"], torch.zeros(1))
    gray = build_network({"type": "SPAN", "num_in_ch": 1, "num_out_ch": 1, "feature_channels": 4,
                          "rgb_mean": [0.5]}).eval()
    with torch.no_grad():
        assert gray(torch.rand(1, 1, 4, 5)).shape == (1, 1, 16, 20)


# ----------------------------------------------------------------------------- RealPLKSR / DySample

def test_dysample_init_pos_matches_reference_buffer() -> None:
    for name in ("realplksr_x4_ln_dysample", "realplksr_x3_dysample_noea"):
        case = MANIFEST[name]
        fresh = build_network({"type": "RealPLKSR", **case["kwargs"]})
        ref = fixture_io(GROUP, name)["init_pos"]
        assert torch.equal(fresh.to_img.init_pos, ref)


@pytest.mark.parametrize("scale", [2, 3, 4])
def test_dysample_without_offsets_is_bilinear_upsampling(scale: int) -> None:
    up = DySample(12, 3, scale, groups=4 if scale % 2 == 0 else 3, end_convolution=False).eval()
    with torch.no_grad():
        up.offset.weight.zero_()
        up.offset.bias.zero_()
        x = torch.rand(2, 12, 5, 7)
        ref = F.interpolate(x, scale_factor=scale, mode="bilinear", align_corners=False)
        torch.testing.assert_close(up(x), ref, rtol=1e-5, atol=1e-5)


def test_realplksr_variants_differ_in_keys() -> None:
    plain = set(build_network({"type": "RealPLKSR", "dim": 8, "n_blocks": 1}).state_dict())
    ln = set(build_network({"type": "RealPLKSR", "dim": 8, "n_blocks": 1, "layer_norm": True}).state_dict())
    dys = set(build_network({"type": "RealPLKSR", "dim": 8, "n_blocks": 1, "dysample": True}).state_dict())
    assert "feats.1.norm.weight" in plain and "feats.1.layer_norm.weight" not in plain
    assert "feats.1.layer_norm.weight" in ln and "feats.1.norm.weight" not in ln
    assert {"to_img.init_pos", "to_img.offset.weight", "to_img.scope.weight", "to_img.end_conv.weight"} <= dys
    assert "feats.3.weight" in plain  # stem, 1 block, dropout (no weights), last conv


# ----------------------------------------------------------------------------- OmniSR

def test_omnisr_ignores_profiler_counters_in_checkpoints() -> None:
    net, io = load_case(GROUP, "omnisr_x2_nope")
    params = stored_params(GROUP, "omnisr_x2_nope")
    junk = {f"{prefix}{name}": torch.zeros(1, dtype=torch.float64) for name in ("total_ops", "total_params")
            for prefix in ("", "input.", "residual_layer.0.esa.conv1.")}
    net.load_state_dict({**params, **junk}, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(net(io["input0"]), io["output0"], **FIXTURE_TOL)
    with pytest.raises(RuntimeError, match="Missing key"):  # real weights are still all required
        net.load_state_dict({k: v for k, v in params.items() if k != "input.weight"}, strict=True)


# ----------------------------------------------------------------------------- shared pieces

def test_layer_norm_2d_matches_layer_norm_over_channels() -> None:
    norm = LayerNorm2d(6)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(6))
        norm.bias.copy_(torch.rand(6))
    x = torch.randn(2, 6, 4, 5)
    ref = F.layer_norm(x.permute(0, 2, 3, 1), (6,), norm.weight, norm.bias, 1e-6).permute(0, 3, 1, 2)
    torch.testing.assert_close(norm(x), ref, rtol=1e-5, atol=1e-6)
    assert norm(x.bfloat16()).dtype == torch.bfloat16


def test_pad_to_min_size_reflects_then_replicates() -> None:
    x = torch.arange(3.0).view(1, 1, 1, 3)
    out = pad_to_min_size(x, 7)
    assert out.shape == (1, 1, 7, 7)
    assert out[0, 0, 0].tolist() == [0, 1, 2, 1, 0, 0, 0]  # reflect by 2 (side - 1), then the edge
    assert torch.equal(out[0, 0, 6], out[0, 0, 0])  # a single row can only be replicated
    big = torch.rand(1, 3, 8, 9)
    assert pad_to_min_size(big, 8) is big


# ----------------------------------------------------------------------------- build errors

# ----------------------------------------------------------------------------- XLA:CPU



